"""Qwen3-VL's image-and-text package for onnxruntime-genai's `qwen3_vl` model type: Qwen2.5-VL's
package (architectures/qwen2_5_vl_multimodal.py) with Qwen3-VL's encoder
(architectures/qwen3_vl_vision.py), 16-pixel patches, and the DeepStack features riding beside the
image features and the embeddings ((1 + k) · hidden wide; architectures/qwen3_vl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from architectures import qwen3_vl_vision
from architectures.qwen2_5_vl_multimodal import has_vision, vl_package
from builder.decoder_config import DecoderConfig
from builder.inputs.source import Checkpoint
from builder.package import Package, register_package
from builder.target import Target

__all__ = ["package"]


@register_package("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration")
def package(raw: dict[str, Any], folder: Path, ckpt: Checkpoint, text: DecoderConfig, target: Target) -> Package | None:
    """The vision and embedding models of a Qwen3VLForConditionalGeneration checkpoint, or None
    (and a note) when it carries no vision tower."""
    vc = qwen3_vl_vision.parse_config(raw) if has_vision(ckpt) else None
    return vl_package(raw, folder, ckpt, text, target, vc, qwen3_vl_vision.vision_model, "qwen3_vl", {})
