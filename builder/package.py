"""A checkpoint's models as a package: each model with its genai_config.json section, and the
processor file, as data the pipeline builds, writes and describes without knowing the family.

An architecture's package builder, registered beside its definition (`@register_package(...)`),
returns a `Package` from `package(raw, folder, checkpoint, config, target)`: its models beside
model.onnx (a vision tower, an embedding model, an encoder: `PackageModel`, each naming its own
genai_config section), and, where the decoder's inputs and outputs are not the shared contract
(Whisper's self and cross caches), the decoder's own recorder (`Package.decoder`). builder/
pipeline.py records and checks the decoder, then every model of the package, the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir

from builder.errors import BuildError
from builder.hf_config import read_json
from builder.image_processor import PROCESSOR_FILE
from builder.target import Target

__all__ = ["PACKAGES", "Package", "PackageModel", "image_models", "preprocessor_config", "register_package",
           "vision_target", "with_model"]

# What builds an architecture's package: package(raw config.json, folder, checkpoint, the
# decoder's config, target) -> a Package, or None where the checkpoint holds the decoder alone.
PackageBuilder = Callable[..., "Package | None"]
# architecture -> its package builder, registered where the builder is defined (as families are).
PACKAGES: dict[str, PackageBuilder] = {}
# A decoder with inputs and outputs of its own: records itself on the graph from (checkpoint,
# config, target) and returns (graph inputs, graph outputs).
DecoderRecorder = Callable[..., tuple[list[ir.Value], list[ir.Value]]]


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


@dataclass
class PackageModel:
    """One model beside the decoder, written as `{stem}.onnx`: the graph, the checkpoint tensors
    each initializer reads, and its section of genai_config.json (`section`, e.g. "vision",
    "embedding", "encoder": `genai` holds the section's keys beyond its filename and session options,
    which the package fills in, the decoder's)."""

    stem: str
    model: ir.Model
    sources: dict[str, tuple[str, ...]]
    section: str
    genai: dict[str, Any]


@dataclass
class Package:
    """A checkpoint's models beside the decoder, the processor file, and what genai_config.json says
    of them, as onnxruntime-genai's pipeline of `model_type` reads it.

    `processor` is written as `processor_file`; `model_fields`: keys genai reads at model level
    (Qwen-VL's image_token_id, ...); `decoder_fields`: keys of the decoder section this package
    sets (its input and output names, the inputs_embeds width genai sizes its buffers by); `search`:
    search settings it needs (an encoder-decoder's growing cache). `decoder`: the recorder of a
    decoder whose inputs and outputs are not the shared contract, None for builder.io.DecoderIO's;
    `position_rows`: the shared decoder reads position ids of this many rows that genai computes
    (Qwen-VL's M-RoPE: 3); `embeds_width`: the width of its inputs_embeds where that is not the
    hidden size (Qwen3-VL's DeepStack features ride beside the embeddings); `embeds` False: the
    decoder keeps reading input_ids (a package of a draft head alone); `decoder_outputs`: outputs
    the decoder adds for the package's models (a draft head's hidden_states)."""

    model_type: str
    models: list[PackageModel]
    processor: dict[str, Any]
    processor_file: str = PROCESSOR_FILE
    ignored: tuple[str, ...] = ()  # checkpoint tensors no model reads, on purpose
    model_fields: dict[str, Any] = field(default_factory=dict)
    decoder_fields: dict[str, Any] = field(default_factory=dict)
    search: dict[str, Any] = field(default_factory=dict)
    sections: dict[str, Any] = field(default_factory=dict)  # model-level sections without a model (Whisper's speech)
    decoder: DecoderRecorder | None = None
    position_rows: int | None = None
    embeds_width: int | None = None
    embeds: bool = True  # the decoder reads inputs_embeds (from the embedding model), not input_ids
    decoder_outputs: tuple[str, ...] = ()  # outputs the decoder adds for the package's models (hidden_states)

    def genai_config(self, config: dict[str, Any]) -> dict[str, Any]:
        """`config` (the decoder's genai_config.json, reading inputs_embeds unless this package
        records its own decoder) as onnxruntime-genai's pipeline of `model_type`: each model's
        section (its filename and the decoder's session options first), the model-level fields and
        the decoder's and search's settings this package needs."""
        model = config["model"]
        session = model["decoder"]["session_options"]
        decoder = {**model["decoder"], **self.decoder_fields}
        if self.decoder_outputs:
            decoder["outputs"] = {**decoder["outputs"], **{n: n for n in self.decoder_outputs}}
        if self.position_rows:
            decoder["inputs"] = {**decoder["inputs"], "position_ids": "position_ids"}
        if self.embeds_width:
            decoder["hidden_size"] = self.embeds_width
        sections = {m.section: {"filename": f"{m.stem}.onnx", "session_options": session, **m.genai}
                    for m in self.models}
        model = {**model, **self.model_fields, "type": self.model_type, "decoder": decoder, **sections,
                 **self.sections}
        return {**config, "model": model, "search": {**config["search"], **self.search}}


def image_models(vision: PackageModel, embedding: PackageModel, processor_file: str = PROCESSOR_FILE,
                 vision_inputs: tuple[str, ...] = ("pixel_values",), vision_fields: dict[str, Any] | None = None
                 ) -> list[PackageModel]:
    """onnxruntime-genai's vision-language pipeline: the vision model (`vision_inputs` ->
    image_features, reading the image processor file) and the embedding model (input_ids and
    image_features -> inputs_embeds) that run before the decoder; their sections say so."""
    vision.genai = {"config_filename": processor_file, **(vision_fields or {}),
                    "inputs": {n: n for n in vision_inputs}, "outputs": {"image_features": "image_features"}}
    embedding.genai = {"inputs": {"input_ids": "input_ids", "image_features": "image_features"},
                       "outputs": {"inputs_embeds": "inputs_embeds"}}
    return [vision, embedding]


def with_model(package: Package | None, model: PackageModel, model_type: str, decoder_outputs: tuple[str, ...] = ()
               ) -> Package:
    """`package` with `model` beside its models (the decoder's model type and input_ids kept where
    there was no package), the decoder adding `decoder_outputs` for it (a draft head beside a
    text decoder or a multimodal package)."""
    if package is None:
        package = Package(model_type, [], {}, embeds=False)
    return dataclasses.replace(package, models=[*package.models, model],
                               decoder_outputs=(*package.decoder_outputs, *decoder_outputs))
