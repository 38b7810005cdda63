"""Phi-1, Phi-1.5 and Phi-2 (PhiForCausalLM): a GPT-style decoder with parallel branches.

Reference: transformers/models/phi/modeling_phi.py. Apart from Llama: one LayerNorm (with bias)
feeds both the attention and the MLP, whose outputs join the residual together
(x + attn(ln(x)) + mlp(ln(x))); the MLP is fc1 -> gelu_new -> fc2; every projection has a bias,
lm_head included; attention's output projection is called `dense`; partial rotary (half the head
by default); an optional LayerNorm on q and k (`qk_layernorm`, one per projection, shared by the
heads); a final LayerNorm, `final_layernorm`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, decoder_layers, vocabulary
from builder.blocks import (
    AttentionSpec,
    AttentionWeights,
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
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"PhiForCausalLM": {}}

IGNORED: tuple[str, ...] = ()


@dataclass(frozen=True)
class PhiConfig:
    """config.json of PhiForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "phi"
    vocab_size: int = 51200
    hidden_size: int = 2048
    intermediate_size: int = 8192
    num_hidden_layers: int = 24
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None  # not a PhiConfig field, but PhiAttention reads it when given
    hidden_act: str = "gelu_new"
    max_position_embeddings: int = 2048
    layer_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    qk_layernorm: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    def window(self, layer: int) -> int | None:
        return None


def parse_config(raw: dict[str, Any], architecture: str) -> PhiConfig:
    params = rope_parameters(raw, raw.get("max_position_embeddings", 2048))
    params.setdefault("partial_rotary_factor", 0.5)  # PhiConfig's default, for configs that omit it
    return from_dict(PhiConfig, raw, VARIANTS[architecture], rope_parameters=params)


def attention_weights(a: Weights, c: PhiConfig) -> AttentionWeights:
    """PhiAttention's q/k/v_proj and dense, all with biases, and its optional q/k LayerNorms."""
    H, D = c.hidden_size, c.head_dim
    q_dim, kv_dim = c.num_attention_heads * D, c.num_key_value_heads * D
    norms = {}
    if c.qk_layernorm:
        norms = dict(q_norm=a("q_layernorm.weight", D), q_norm_bias=a("q_layernorm.bias", D),
                     k_norm=a("k_layernorm.weight", D), k_norm_bias=a("k_layernorm.bias", D))
    return AttentionWeights(
        q=a("q_proj.weight", q_dim, H), k=a("k_proj.weight", kv_dim, H), v=a("v_proj.weight", kv_dim, H),
        o=a("dense.weight", H, q_dim), q_bias=a("q_proj.bias", q_dim), k_bias=a("k_proj.bias", kv_dim),
        v_bias=a("v_proj.bias", kv_dim), o_bias=a("dense.bias", H), **norms,
    )


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: PhiConfig, i: int, past, lengths, rotary,
                  target: Target):
    """PhiDecoderLayer.forward: x + attn(ln(x)) + mlp(ln(x)); returns the layer's KV."""
    H, I = c.hidden_size, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H), w("input_layernorm.bias", H))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, norm_eps=c.layer_norm_eps,
                         qk_layer_norm=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, past, lengths, rotary, attention_weights(w.under("self_attn."), c),
                                          spec, target)
    stream.add(attn)
    m = w.under("mlp.")
    with g.scope("mlp"):
        stream.add(plain_mlp(g, h, m("fc1.weight", I, H), m("fc2.weight", H, I), c.hidden_act, target,
                             (m("fc1.bias", I), m("fc2.bias", H)), names=("fc1", "fc2")))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: PhiConfig, target: Target):
    H, V = c.hidden_size, c.vocab_size
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    lengths = sequence_lengths(g, io.attention_mask)
    vocab = vocabulary(g, ckpt, target, (V, H), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.layer_norm_eps, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    final = Weights(ckpt, "model.final_layernorm.")
    with g.scope("model", "final_layernorm"):
        h = stream.norm(final("weight", H), final("bias", H))
    return vocab.logits(g, h, bias=ckpt.weight("lm_head.bias", (V,))), presents


__all__ = ["IGNORED", "VARIANTS", "PhiConfig", "attention_weights", "build", "decoder_layer", "parse_config"]
