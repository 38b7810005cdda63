"""Phi-3, Phi-3.5 and Phi-4 (Phi3ForCausalLM): a Llama-shaped decoder with fused projections.

Reference: transformers/models/phi3/modeling_phi3.py. What sets it apart:
- `qkv_proj` holds Q, K and V stacked; `gate_up_proj` holds gate then up (split lazily here);
- LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): short and long per-dimension factors, the
  long ones for every position once the sequence passes original_max_position_embeddings, and
  an attention factor scaling cos and sin;
- partial rotary (Phi-4-mini's partial_rotary_factor 0.75): only the first dims rotate;
- an optional sliding window (Phi-3-mini-4k's 2047), over every layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights
from builder.blocks import AttentionSpec, AttentionWeights, gated_mlp, longrope_tables, self_attention
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, parse, register
from builder.family import rotary as plain_rotary

# Phi3Config's defaults where they differ from the shared ones.
VARIANTS: dict[str, dict[str, Any]] = {"Phi3ForCausalLM": dict(
    model_type="phi3", vocab_size=32064, hidden_size=3072, intermediate_size=8192, max_position_embeddings=4096,
    rms_norm_eps=1e-5, eos_token_id=32000, pad_token_id=32000, partial_rotary_factor=1.0,
)}

# Every layer slides when there is a window, whatever config.json's layer_types says.
STRUCTURE: dict[str, dict[str, Any]] = {"Phi3ForCausalLM": dict(layer_types=None)}


@dataclass(frozen=True)
class Phi3Config(DecoderConfig):
    """config.json of Phi3ForCausalLM: the shared decoder keys and its own."""

    original_max_position_embeddings: int = 4096


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Phi3Config:
    """The default parse, then LongRoPE as Phi3Config reads it: the legacy "su"/"yarn" names mean
    longrope, and the top-level original_max_position_embeddings (4096 unless given) wins over
    the one inside the rotary settings."""
    c = parse(family, {"original_max_position_embeddings": 4096, **raw}, architecture)
    rope = dict(c.rope_parameters)
    if rope["rope_type"] in ("su", "yarn"):
        rope["rope_type"] = "longrope"
    if rope["rope_type"] == "longrope":
        rope["original_max_position_embeddings"] = c.original_max_position_embeddings
    return dataclasses.replace(c, rope_parameters=rope)


def rotary(d: Decoder) -> Any:
    """LongRoPE's tables, which pick the short or long factors by the sequence length (recorded
    first, for every Phi-3), or the plain ones."""
    c, lengths = d.c, d.lengths
    if c.rope_parameters["rope_type"] == "longrope":
        return longrope_tables(d.g, c.rope_parameters, c.head_dim, c.max_position_embeddings,
                               lengths.total_sequence_length, d.target)
    return plain_rotary(d)


def decoder_layer(d: Decoder, w: Weights, i: int) -> tuple[ir.Value, ir.Value]:
    """Phi3DecoderLayer.forward: Llama's pre-norm layer over the fused qkv_proj and gate_up_proj."""
    g, c = d.g, d.c
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    attention = AttentionWeights(qkv=w("self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, H),
                                 o=w("self_attn.o_proj.weight", H, q_dim))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    gate_up = w("mlp.gate_up_proj.weight", 2 * I, H)  # gate rows, then up rows
    with g.scope("mlp"):
        d.stream.add(gated_mlp(g, h, gate_up.slice(0, 0, I), gate_up.slice(0, I, 2 * I),
                               w("mlp.down_proj.weight", H, I), c.hidden_act, d.target))
    return key, value


FAMILY = register(Family(
    "phi3", Phi3Config, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=rotary, partial_rotary=True,
    ignored=("model.layers.*.self_attn.rotary_emb.*",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Phi3Config", "decoder_layer", "parse_config"]
