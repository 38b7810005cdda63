"""A multimodal build's models beside the decoder, and what genai_config.json says of them.

An architecture's package builder, registered beside its definition (`@register_package(...)`),
returns one from `package(raw, folder, checkpoint, config, target)`; builder/pipeline.py plans,
writes and describes its models next to model.onnx.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import ml_dtypes
import numpy as np
import onnx_ir as ir

from builder.errors import BuildError
from builder.genai_config import with_vision
from builder.hf_config import read_json
from builder.image_processor import PROCESSOR_FILE
from builder.target import Target

__all__ = ["PACKAGES", "ModelPackage", "Package", "preprocessor_config", "register_package", "vision_target"]

# What builds an architecture's other models: package(raw config.json, folder, checkpoint, the
# decoder's config, target) -> a ModelPackage, or None where the checkpoint holds the decoder alone.
PackageBuilder = Callable[..., "ModelPackage | None"]
# architecture -> its package builder, registered where the builder is defined (as families are).
PACKAGES: dict[str, PackageBuilder] = {}


def register_package(*architectures: str) -> Callable[[PackageBuilder], PackageBuilder]:
    """Registers the decorated function as the package builder of `architectures` (a multimodal
    checkpoint's towers and embedding model, an encoder-decoder's encoder); one per architecture."""
    def register(build: PackageBuilder) -> PackageBuilder:
        for architecture in architectures:
            if PACKAGES.get(architecture, build) is not build:
                raise BuildError(f"{architecture}'s package is declared twice")
            PACKAGES[architecture] = build
        return build

    return register


def preprocessor_config(folder: Path) -> dict[str, Any]:
    """The checkpoint folder's preprocessor_config.json (the processor's settings), {} without one."""
    path = folder / "preprocessor_config.json"
    return read_json(path, "model") if folder.is_dir() and path.is_file() else {}


def vision_target(target: Target) -> Target:
    """What a vision tower is built for: float16 in a float16 build, else float32 (a quantized or
    bfloat16 decoder's tower stays float32), unquantized, on the decoder's provider; beside a
    quantized or bfloat16 decoder its matrices keep the checkpoint's 16 bits on disk."""
    dtype = np.dtype(np.float32) if target.io_dtype != np.float16 else target.io_dtype
    narrow = target.quantization is not None or target.io_dtype == ml_dtypes.bfloat16
    return Target(io_dtype=dtype, execution_provider=target.execution_provider, narrow_float_matrices=narrow)


class ModelPackage(Protocol):
    """What the pipeline reads of any package: this module's Package (images and text) or
    architectures/whisper.py's (speech). Each model is planned, estimated and written beside
    model.onnx, the processor file with them, and `genai_config` rewrites the decoder's config."""

    models: dict[str, ir.Model]  # file stem -> model
    sources: dict[str, dict[str, tuple[str, ...]]]  # file stem -> initializer -> checkpoint tensors read
    processor: dict[str, Any]
    processor_file: str
    ignored: tuple[str, ...]  # checkpoint tensors no model reads, on purpose

    def genai_config(self, config: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Package:
    """The models beside the decoder (file stem -> model) and what genai_config.json says of them.

    `model_fields`: keys genai reads at model level (Qwen-VL's image_token_id, ...);
    `vision_fields`: keys of the vision section beyond filename, config file and session;
    `vision_inputs`: the vision model's inputs by genai's names; `position_ids`: the decoder
    reads position ids (3, batch, sequence) that genai computes (Qwen-VL's M-RoPE);
    `embeds_width`: the width of inputs_embeds when it is not the decoder's hidden size (Qwen3-VL's
    DeepStack features ride beside the embeddings; genai sizes its buffers by the decoder section's
    hidden_size, which then says this width)."""

    models: dict[str, ir.Model]
    sources: dict[str, dict[str, tuple[str, ...]]]  # file stem -> initializer -> checkpoint tensors read
    processor: dict[str, Any]
    model_type: str
    ignored: tuple[str, ...] = ()
    vision_file: str = "vision"
    embedding_file: str = "embedding"
    processor_file: str = PROCESSOR_FILE
    model_fields: dict[str, Any] = field(default_factory=dict)
    vision_fields: dict[str, Any] = field(default_factory=dict)
    vision_inputs: dict[str, str] = field(default_factory=lambda: {"pixel_values": "pixel_values"})
    position_ids: bool = False
    embeds_width: int | None = None

    def genai_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` (the decoder's genai_config.json, reading inputs_embeds) as onnxruntime-genai's
        vision-language pipeline of `model_type`: the vision and embedding models, the decoder's
        position_ids and the width of its inputs_embeds where this package has them."""
        decoder = config["model"]["decoder"]
        if self.position_ids:
            decoder["inputs"]["position_ids"] = "position_ids"
        if self.embeds_width:
            decoder["hidden_size"] = self.embeds_width
        return with_vision(config, self.model_type, f"{self.vision_file}.onnx", self.processor_file,
                           f"{self.embedding_file}.onnx", self.model_fields, self.vision_fields, self.vision_inputs)
