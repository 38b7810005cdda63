"""Nemotron (NemotronForCausalLM): Nemotron-3, Nemotron-4 and Minitron, e.g. Nemotron-Mini-4B-Instruct.

Reference: transformers/models/nemotron/modeling_nemotron.py. Apart from Llama: LayerNorm1P, a
LayerNorm with bias that scales by (1 + weight), the 1 folded into the weight here; a plain MLP,
up_proj -> relu² -> down_proj; partial rotary (half the head by default); optional biases on the
attention (`attention_bias`) and the MLP (`mlp_bias`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    ResidualStream,
    Rope,
    plain_mlp,
    rotary_tables,
    self_attention,
    sequence_lengths,
)
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import from_dict, rope_parameters
from builder.io import DecoderIO
from builder.lazy import Weight
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"NemotronForCausalLM": {}}

IGNORED: tuple[str, ...] = ()


@dataclass(frozen=True)
class NemotronConfig:
    """config.json of NemotronForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "nemotron"
    vocab_size: int = 256000
    hidden_size: int = 6144
    intermediate_size: int = 24576
    num_hidden_layers: int = 32
    num_attention_heads: int = 48
    head_dim: int | None = None
    # transformers keeps None here and then fails to build the attention; every hub config sets it.
    num_key_value_heads: int | None = None
    hidden_act: str = "relu2"
    max_position_embeddings: int = 4096
    norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 3
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            raise ValueError("num_key_value_heads is not set (transformers' NemotronAttention needs it too)")

    def window(self, layer: int) -> int | None:
        return None


def parse_config(raw: dict[str, Any], architecture: str) -> NemotronConfig:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 4096))
    params.setdefault("partial_rotary_factor", 0.5)  # NemotronConfig's default, for configs that omit it
    return from_dict(NemotronConfig, raw, VARIANTS[architecture], rope_parameters=params)


class NemotronWeights(Weights):
    """Weights of a Nemotron module; `norm` reads a LayerNorm1P as a plain LayerNorm's (weight + 1, bias)."""

    def norm(self, name: str, size: int) -> tuple[Weight, Weight]:
        weight = self(f"{name}.weight", size).map(lambda x: x.astype(np.float32) + 1, np.float32)
        return weight, self(f"{name}.bias", size)


def decoder_layer(g: Graph, stream: ResidualStream, w: NemotronWeights, c: NemotronConfig, i: int, past, lengths,
                  rotary, target: Target):
    """NemotronDecoderLayer.forward: x + attn(ln1p(x)), then x + mlp(ln1p(x)); returns the layer's KV."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(*w.norm("input_layernorm", H))
    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim)
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(*w.norm("post_attention_layernorm", H))
    m = w.under("mlp.")
    biases = (m("up_proj.bias", I), m("down_proj.bias", H)) if c.mlp_bias else (None, None)
    with g.scope("mlp"):
        stream.add(plain_mlp(g, h, m("up_proj.weight", I, H), m("down_proj.weight", H, I), c.hidden_act, target,
                             biases))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: NemotronConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.norm_eps, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers, lambda i, w: decoder_layer(
        g, stream, w, c, i, io.past[i], lengths, rotary, target), weights=NemotronWeights)
    with g.scope("model", "norm"):
        h = stream.norm(*NemotronWeights(ckpt, "model.").norm("norm", c.hidden_size))
    return vocab.logits(g, h), presents


__all__ = ["IGNORED", "VARIANTS", "NemotronConfig", "NemotronWeights", "build", "decoder_layer", "parse_config"]
