"""Gemma 3's image-and-text package (gemma-3-4b/12b/27b-it) for onnxruntime-genai's multimodal API.

Three models, as onnxruntime-genai's `gemma3` pipeline runs them:
- vision.onnx: pixel_values (images, 3, S, S) -> image_features (images, 256, text hidden), the SigLIP
  tower and projector of architectures/gemma3_vision.py;
- embedding.onnx: input_ids and image_features (images, 256, text hidden) -> inputs_embeds: the
  token embeddings times √hidden (as the text decoder does them), with the image features,
  unscaled, in the rows whose id is the image token, in order (Gemma3Model.forward's
  masked_scatter). onnxruntime-genai sends the features at the prompt and zero rows at every later
  step: image tokens without a feature row keep their text embedding, as in transformers without
  pixel_values. In a 4-bit build its lookup gathers the decoder's lm_head codes and scales where
  model.onnx.data stores them (the tied vocabulary is quantized and written once: writer.save_models);
- model.onnx: the text decoder of architectures/gemma.py reading inputs_embeds.

Precision: the decoder follows the build. The vision model is never quantized; it runs in the
activation dtype for fp32 and fp16 builds (fp16 keeps its residual stream in float32: relative
error 1e-3 against transformers) and in float32 for bf16 builds, whose 8-bit mantissa would cost the
encoder accuracy for no memory that matters (0.4 B parameters beside the decoder).

What the runtime cannot do: transformers lets an image's tokens attend to each other in both
directions (token_type_ids); onnxruntime-genai's decoder is causal (GroupQueryAttention), as in
Microsoft's own Gemma 3 packages, so image tokens here see only the image tokens before them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures import gemma3_vision
from architectures.gemma import GemmaConfig, text_vocabulary
from builder.blocks.embedding import image_tokens, merge_image_features
from builder.config_checks import token_id
from builder.errors import BuildError
from builder.graph import Graph
from builder.image_processor import extensions_processor
from builder.inputs.source import Checkpoint
from builder.io import BATCH, SEQUENCE, tensor_type
from builder.package import Package, PackageModel, image_models, preprocessor_config, register_package, vision_target
from builder.target import Target

log = logging.getLogger("builder")

# onnxruntime-genai 0.18's Gemma 3 processor expands every image to this many tokens and sizes
# image_features for them (src/models/gemma_image_processor.cpp: image_seq_length).
GENAI_IMAGE_TOKENS = 256
MODEL_TYPE = "gemma3"
VISION_FILE, EMBEDDING_FILE = "vision", "embedding"
# transformers' Gemma3ImageProcessor defaults for keys preprocessor_config.json leaves out.
PROCESSOR_DEFAULTS = {"resample": 2, "rescale_factor": 1 / 255, "do_normalize": True,
                      "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]}
# Gemma3Config's default image token (<image_soft_token>).
DEFAULT_IMAGE_TOKEN = 262_144
IGNORED = gemma3_vision.IGNORED


def has_vision(ckpt: Checkpoint) -> bool:
    return any(p + "embeddings.patch_embedding.weight" in ckpt for p in gemma3_vision.TOWER_PREFIXES)


@register_package("Gemma3ForConditionalGeneration")
def package(raw: dict[str, Any], folder: Path, ckpt: Checkpoint, text: GemmaConfig, target: Target) -> Package | None:
    """The vision and embedding models for a Gemma3ForConditionalGeneration checkpoint, or None
    (and a note) when it carries no vision tower."""
    if not has_vision(ckpt):
        log.info("the checkpoint has no vision tower: building the text decoder only")
        return None
    vc = gemma3_vision.parse_config(raw)
    if vc.mm_tokens_per_image != GENAI_IMAGE_TOKENS:
        raise BuildError(f"mm_tokens_per_image is {vc.mm_tokens_per_image}, but onnxruntime-genai 0.18 expands "
                         f"every image to {GENAI_IMAGE_TOKENS} tokens; pass --text-only for the decoder alone")
    key = "image_token_id" if "image_token_id" in raw else "image_token_index"
    image_token = token_id(raw.get(key, DEFAULT_IMAGE_TOKEN), key)
    if image_token is None:
        image_token = DEFAULT_IMAGE_TOKEN
    tower = vision_target(target)
    vision_dtype = tower.io_dtype
    pre = preprocessor_config(folder)
    vision, embedding = Graph(), Graph()
    models = image_models(
        PackageModel(VISION_FILE, gemma3_vision.vision_model(ckpt, vc, tower, vision), vision.sources, "vision", {}),
        PackageModel(EMBEDDING_FILE, embedding_model(ckpt, text, image_token, vision_dtype, target, embedding),
                     embedding.sources, "embedding", {}),
    )
    return Package(MODEL_TYPE, models, extensions_processor(pre, vc.image_size, "gemma_3_image_processing",
                                                            PROCESSOR_DEFAULTS), ignored=IGNORED)


def embedding_model(ckpt: Checkpoint, c: GemmaConfig, image_token: int, features_dtype: np.dtype,
                    target: Target, g: Graph | None = None) -> ir.Model:
    """input_ids (batch, sequence) and image_features (images, tokens, hidden) in `features_dtype` ->
    inputs_embeds (batch, sequence, hidden) in the target's IO dtype; recorded on `g`."""
    H = c.hidden_size
    g = g or Graph()
    ids = ir.Value(name="input_ids", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape((BATCH, SEQUENCE)))
    features = ir.Value(name="image_features", type=tensor_type(features_dtype),
                        shape=ir.Shape(("num_images", "num_image_tokens", H)))
    vocab = text_vocabulary(g, ckpt, c, target)
    is_image, lookup = image_tokens(g, ids, image_token, c.vocab_size)
    text = vocab.embed(g, lookup, scale=float(np.sqrt(H)))  # (B, S, H)
    rows = g.op.Reshape(features, g.constant([-1, H], np.int64))  # every image's rows, in order
    embeds = merge_image_features(g, ids, is_image, rows, text, H, target)
    embeds.name, embeds.type = "inputs_embeds", tensor_type(target.io_dtype)
    embeds.shape = ir.Shape((BATCH, SEQUENCE, H))
    return g.model([ids, features], [embeds])

