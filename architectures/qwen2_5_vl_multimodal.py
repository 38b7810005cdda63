"""Qwen2.5-VL's image-and-text package for onnxruntime-genai's `qwen2_5_vl` model type.

Three models, as onnxruntime-genai 0.18 runs them:
- vision.onnx: one image's patches (patches, C·T·P·P) and its grid image_grid_thw (1, 3) ->
  image_features (tokens, text hidden): architectures/qwen2_5_vl_vision.py, called once per image;
- embedding.onnx: input_ids and image_features (tokens, hidden) -> inputs_embeds: the token
  embeddings with the image features in the image-pad tokens' rows, in order
  (Qwen2_5_VLModel.forward's masked_scatter); zero rows at decode steps;
- model.onnx: the text decoder of architectures/qwen2_5_vl.py reading inputs_embeds and the
  M-RoPE position_ids (3, batch, sequence) that genai computes from image_token_id,
  vision_start_token_id and the grid (its get_rope_index).

genai's processor (vision_processor.json: onnxruntime-extensions' smart resize and PatchImage)
expands each <|vision_start|>…<|vision_end|> of the prompt to t·h·w / merge² image-pad tokens.

Precision: the decoder follows the build (int4 quantizes the decoder only). The vision model runs
in the activation dtype for fp32 and fp16 builds (fp16 keeps its residual stream in float32) and
in float32 for bf16 builds, as Gemma 3's package does.
"""

from __future__ import annotations

import logging
from pathlib import Path
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures import qwen2_5_vl_vision
from architectures.qwen2_5_vl import decoder_prefix_of
from builder.architecture import vocabulary
from builder.blocks.embedding import image_tokens, merge_image_features
from builder.blocks.float_ops import in_op_dtype
from builder.config_checks import token_id
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.graph import Graph
from builder.image_processor import patched_processor
from builder.inputs.source import Checkpoint
from builder.io import BATCH, SEQUENCE, tensor_type
from builder.package import Package, PackageModel, image_models, preprocessor_config, register_package, vision_target
from builder.target import Target

__all__ = ["PROCESSOR_DEFAULTS", "TOKENS", "embedding_model", "has_vision", "package", "vl_package"]

log = logging.getLogger("builder")

MODEL_TYPE = "qwen2_5_vl"
# Qwen2_5_VLConfig's default token ids.
TOKENS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652}
# transformers' Qwen2VLImageProcessor defaults for keys preprocessor_config.json leaves out.
PROCESSOR_DEFAULTS = {"resample": 3, "rescale_factor": 1 / 255, "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 1280,
                      "image_mean": [0.48145466, 0.4578275, 0.40821073],
                      "image_std": [0.26862954, 0.26130258, 0.27577711]}


@register_package("Qwen2_5_VLForConditionalGeneration")
def package(raw: dict[str, Any], folder: Path, ckpt: Checkpoint, text: DecoderConfig, target: Target) -> Package | None:
    """The vision and embedding models of a Qwen2_5_VLForConditionalGeneration checkpoint, or None
    (and a note) when it carries no vision tower."""
    vc = qwen2_5_vl_vision.parse_config(raw) if has_vision(ckpt) else None
    return vl_package(raw, folder, ckpt, text, target, vc, qwen2_5_vl_vision.vision_model, MODEL_TYPE,
                      {"window_size": vc.window_size, "tokens_per_second": vc.tokens_per_second} if vc else {})


def has_vision(ckpt: Checkpoint) -> bool:
    return any(p + "patch_embed.proj.weight" in ckpt for p in qwen2_5_vl_vision.TOWER_PREFIXES)


def vl_package(raw: dict[str, Any], folder: Path, ckpt: Checkpoint, text: DecoderConfig, target: Target, vc: Any,
               vision_model: Callable, model_type: str, vision_fields: dict[str, Any]) -> Package | None:
    """A Qwen-VL package (genai's `model_type`): the vision model `vision_model(ckpt, vc, target, g)`
    of vision config `vc` (None: no tower, no package), whose features are `vc.features_width`
    wide where that exceeds the decoder's width (Qwen3-VL's DeepStack), the embedding model and
    the processor file."""
    if vc is None:
        log.info("the checkpoint has no vision tower: building the text decoder only")
        return None
    if vc.out_hidden_size != text.hidden_size:
        raise BuildError(f"config.json: vision_config.out_hidden_size {vc.out_hidden_size} is not the text decoder's "
                         f"hidden_size {text.hidden_size}: the image features could not replace token embeddings")
    width = getattr(vc, "features_width", text.hidden_size)
    tokens = {key: token_id(raw.get(key, default), key) for key, default in TOKENS.items()}
    tokens = {key: TOKENS[key] if value is None else value for key, value in tokens.items()}
    tower = vision_target(target)
    vision_dtype = tower.io_dtype
    pre = preprocessor_config(folder)
    vision, embedding = Graph(), Graph()
    models = image_models(
        PackageModel("vision", vision_model(ckpt, vc, tower, vision), vision.sources, "vision", {}),
        PackageModel("embedding", embedding_model(ckpt, text, tokens["image_token_id"], vision_dtype, target,
                                                  embedding, width), embedding.sources, "embedding", {}),
        vision_inputs=("pixel_values", "image_grid_thw"),
        vision_fields={"spatial_merge_size": vc.spatial_merge_size, "patch_size": vc.patch_size, **vision_fields},
    )
    processor = patched_processor(pre, f"{model_type}_image_processor", model_type, PROCESSOR_DEFAULTS,
                                  vc.patch_size, vc.spatial_merge_size, vc.temporal_patch_size)
    return Package(model_type, models, processor, ignored=("visual.*", "model.visual.*"), model_fields=tokens,
                   position_rows=3, embeds_width=width if width != text.hidden_size else None)


def embedding_model(ckpt: Checkpoint, c: DecoderConfig, image_token: int, features_dtype: np.dtype,
                    target: Target, g: Graph | None = None, width: int | None = None) -> ir.Model:
    """input_ids (batch, sequence) and image_features (tokens, width) in `features_dtype` ->
    inputs_embeds (batch, sequence, width) in the target's IO dtype; recorded on `g`. `width`
    (default: the hidden size) beyond the hidden size: the token embeddings are followed by zeros,
    the image tokens' rows are the whole feature rows (Qwen3-VL's DeepStack features beside them)."""
    H = width or c.hidden_size
    g = g or Graph()
    ids = ir.Value(name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape((BATCH, SEQUENCE)))
    features = ir.Value(name="image_features", type=tensor_type(features_dtype), shape=ir.Shape(("num_image_tokens", H)))
    embed = decoder_prefix_of(ckpt) + "embed_tokens.weight"
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings, embed=embed)
    is_image, lookup = image_tokens(g, ids, image_token, c.vocab_size)
    text = vocab.embed(g, lookup)  # (B, S, hidden)
    if H != c.hidden_size:
        pads = g.constant([0, 0, 0, 0, 0, H - c.hidden_size], np.int64)
        # -> (B, S, width), zeros; ONNX Runtime's CUDA Pad takes no bfloat16 (blocks.float_ops)
        text = in_op_dtype(g, text, target.io_dtype, lambda v: g.op.Pad(v, pads))
    embeds = merge_image_features(g, ids, is_image, features, text, H, target)
    embeds.name, embeds.type = "inputs_embeds", tensor_type(target.io_dtype)
    embeds.shape = ir.Shape((BATCH, SEQUENCE, H))
    return g.model([ids, features], [embeds])

