"""Phi-3, Phi-3.5 and Phi-4 (Phi3ForCausalLM): a Llama-shaped decoder with fused projections.

Reference: transformers/models/phi3/modeling_phi3.py. What sets it apart:
- `qkv_proj` holds Q, K and V stacked; `gate_up_proj` holds gate then up (split lazily here);
- LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini): short and long per-dimension factors, the
  long ones for every position once the sequence passes original_max_position_embeddings, and
  an attention factor scaling cos and sin;
- partial rotary (Phi-4-mini's partial_rotary_factor 0.75): only the first dims rotate;
- an optional sliding window (Phi-3-mini-4k's 2047).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, rms_norm_decoder
from builder.blocks import (
    AttentionSpec,
    AttentionWeights,
    ResidualStream,
    Rope,
    gated_mlp,
    longrope_tables,
    rotary_tables,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"Phi3ForCausalLM": {}}

IGNORED = ("model.layers.*.self_attn.rotary_emb.*",)


@dataclass(frozen=True)
class Phi3Config:
    """config.json of Phi3ForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "phi3"
    vocab_size: int = 32064
    hidden_size: int = 3072
    intermediate_size: int = 8192
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    original_max_position_embeddings: int = 4096
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    sliding_window: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 32000
    pad_token_id: int | None = 32000

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)

    def window(self, layer: int) -> int | None:
        return effective_window(self.sliding_window, self.max_position_embeddings)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


def parse_config(raw: dict[str, Any], architecture: str) -> Phi3Config:
    raw = dict(raw)
    # Phi3Config always has original_max_position_embeddings (4096 unless given), and transformers
    # lets it override the value inside longrope's parameters; the legacy "su"/"yarn" names mean longrope.
    raw.setdefault("original_max_position_embeddings", 4096)
    params = rope_parameters(raw, raw.get("max_position_embeddings", 4096))
    params.setdefault("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    if params["rope_type"] in ("su", "yarn"):
        params["rope_type"] = "longrope"
    if params["rope_type"] == "longrope":
        params["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
    return from_dict(Phi3Config, raw, rope_parameters=params)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: Phi3Config, i: int, past, lengths, rotary,
                  target: Target):
    """Phi3DecoderLayer.forward: Llama's pre-norm layer over the fused qkv_proj and gate_up_proj."""
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    attention = AttentionWeights(qkv=w("self_attn.qkv_proj.weight", q_dim + 2 * kv_dim, H),
                                 o=w("self_attn.o_proj.weight", H, q_dim))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    gate_up = w("mlp.gate_up_proj.weight", 2 * I, H)  # gate rows, then up rows
    with g.scope("mlp"):
        stream.add(gated_mlp(g, h, gate_up.slice(0, 0, I), gate_up.slice(0, I, 2 * I), w("mlp.down_proj.weight", H, I),
                             c.hidden_act, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: Phi3Config, target: Target):
    D = c.head_dim
    lengths = sequence_lengths(g, io.attention_mask)
    if c.rope_parameters["rope_type"] == "longrope":
        rotary = longrope_tables(g, c.rope_parameters, D, c.max_position_embeddings, lengths.total_sequence_length, target)
    else:
        rope = Rope.from_parameters(c.rope_parameters, D, c.max_position_embeddings)
        rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary, lengths=lengths)
