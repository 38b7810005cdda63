"""The text decoder of Qwen2.5-VL (Qwen2_5_VLForConditionalGeneration): Qwen2's decoder (q/k/v
biases) with multimodal rotary positions (M-RoPE).

Reference: transformers/models/qwen2_5_vl/modeling_qwen2_5_vl.py (Qwen2_5_VLTextModel,
Qwen2_5_VLRotaryEmbedding). Each token has three positions (temporal, height, width; equal for
text) and `mrope_section` says how many of the rotary frequencies read each. In the package the
decoder reads those positions as `position_ids` (3, batch, sequence), which onnxruntime-genai
computes from the image grid (its get_rope_index), and rotates q and k before
GroupQueryAttention. Built alone (--text-only) every token's three positions are equal, and
M-RoPE is Qwen2's plain rotary: the decoder is a `qwen2` one.

The hub's checkpoints keep the decoder as model.* with config.json's text keys at top level;
transformers 5 may save text_config and model.language_model.*. Both are read. The vision tower
and the rest of the package: architectures/qwen2_5_vl_multimodal.py.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import onnx_ir as ir

from architectures.llama import LlamaConfig, decoder_layer, parse_config as llama_parse
from builder.architecture import prefix_holding
from builder.blocks.rope import Rope, multimodal_rotary
from builder.config_checks import config_value
from builder.errors import BuildError
from builder.family import Decoder, Family, register, rotary
from builder.hf_config import text_config
from builder.inputs.source import Checkpoint

__all__ = ["FAMILY", "MROPE_DEFAULT", "TEXT_PREFIXES", "VARIANTS", "decoder_prefix", "decoder_prefix_of", "embed",
           "mrope", "parse_config", "vl_parser"]

# Qwen2_5_VLTextConfig's defaults where they differ from Llama's.
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen2_5_VLForConditionalGeneration": dict(
        model_type="qwen2", vocab_size=152064, hidden_size=8192, intermediate_size=29568, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=32768, rms_norm_eps=1e-5,
        use_sliding_window=False, sliding_window=4096, max_window_layers=80, bos_token_id=151643,
        eos_token_id=151645, default_theta=1_000_000.0,
    ),
}
# Qwen2's q/k/v biases; alone (--text-only), the decoder is onnxruntime-genai's `qwen2` (the
# package's genai_config.json says qwen2_5_vl).
STRUCTURE = {"Qwen2_5_VLForConditionalGeneration": dict(qkv_bias=True, attention_bias=False, model_type="qwen2")}
# Qwen2_5_VLRotaryEmbedding's mrope_section when rope_parameters has none.
MROPE_DEFAULT = [16, 24, 24]
# Where the decoder lives: the hub's layout, then transformers 5's module path.
TEXT_PREFIXES = ("model.", "model.language_model.")


def vl_parser(default_sections: list[int], interleaved: bool = False, text_ties: bool = True):
    """The config parser of a Qwen-VL decoder: config.json's `text_config` when it has one, else
    its top level (the hub's flat form); `tie_word_embeddings` is the outer config's (default
    False), or with `text_ties` also the text config's when that sets it (Qwen2_5_VLConfig's
    compatibility rule; Qwen3VLConfig reads the outer one only). The rotary type "mrope" is the
    default rotary with its `mrope_section` (`default_sections` where it has none), as transformers
    standardizes it; `interleaved` (Qwen3-VL) is the modeling file's layout."""

    def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> LlamaConfig:
        text = text_config(raw, "text_config") if "text_config" in raw else dict(raw)
        outer = raw.get("tie_word_embeddings", False)
        text["tie_word_embeddings"] = outer or (text_ties and text.get("tie_word_embeddings", False))
        for key in ("rope_scaling", "rope_parameters"):
            rope = text.get(key)
            if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) == "mrope":
                text[key] = {**{k: v for k, v in rope.items() if k != "type"}, "rope_type": "default"}
        c = llama_parse(family, text, architecture)
        sections = config_value("rope_parameters.mrope_section",
                                c.rope_parameters.get("mrope_section", default_sections), list[int])
        if len(sections) != 3 or sum(sections) != c.head_dim // 2:
            raise BuildError(f"rope_parameters.mrope_section {sections}: expected three sections (temporal, height, "
                             f"width) summing to head_dim / 2 = {c.head_dim // 2}")
        rope = {**c.rope_parameters, "mrope_section": sections, "mrope_interleaved": interleaved}
        return dataclasses.replace(c, rope_parameters=rope)

    return parse_config


parse_config = vl_parser(MROPE_DEFAULT)


def decoder_prefix_of(ckpt: Checkpoint) -> str:
    """The prefix of the decoder's tensors ({prefix}layers.*, {prefix}embed_tokens.weight)."""
    return prefix_holding(ckpt, "embed_tokens.weight", TEXT_PREFIXES)


def decoder_prefix(d: Decoder) -> str:
    return decoder_prefix_of(d.ckpt)


def mrope(d: Decoder) -> Any:
    """M-RoPE tables from the position_ids genai sends (the package), else Qwen2's plain tables."""
    if d.io.position_ids is None:
        return rotary(d)  # Rope.from_parameters reads no mrope_* key
    c = d.c
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    return multimodal_rotary(d.g, rope, c.max_position_embeddings, d.io.position_ids,
                             c.rope_parameters["mrope_section"], d.target, c.rope_parameters["mrope_interleaved"])


def embed(d: Decoder) -> ir.Value:
    """inputs_embeds from the package's embedding model, else the token embeddings."""
    return d.io.inputs_embeds if d.io.inputs_embeds is not None else d.vocab.embed(d.g, d.io.input_ids)


FAMILY = register(Family(
    "qwen2_5_vl", LlamaConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=mrope,
    embed=embed, prefix=decoder_prefix,
    # The vision tower; the decoder's build reads none of it.
    ignored=("visual.*", "model.visual.*"),
))
