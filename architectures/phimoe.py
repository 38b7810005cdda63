"""Phi-3.5-MoE (PhimoeForCausalLM): a Mixtral-shaped decoder with LayerNorms and the sparsemixer router.

Reference: transformers/models/phimoe/modeling_phimoe.py. Apart from Mixtral:
- every norm is a LayerNorm with a bias (eps `rms_norm_eps`); q/k/v/o biases by `attention_bias`;
  an lm_head bias by `lm_head_bias`; a sliding window on every layer when `sliding_window` is set;
- LongRoPE whose cos/sin are scaled by `short_mscale` / `long_mscale` instead of the attention
  factor (equal on the hub; different ones are refused: the tables switch, the scale would too);
- the router is `sparsemixer` (top-2 only): each choice's weight is a softmax over the logits near
  that choice, so the weights neither sum to 1 nor are a top-k of one softmax. ONNX Runtime's MoE
  cannot compute that; it is built from standard operators and the fused experts are fed only the
  choices and weights (builder/blocks/moe.py: sparsemixer, routed_experts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builder.architecture import Weights, attention_weights, decoder_layers, vocabulary
from builder.blocks import AttentionSpec, ResidualStream, Rope, linear, rotary_tables, self_attention, sequence_lengths
from builder.blocks.moe import routed_experts, sparsemixer
from builder.blocks.rope import longrope_tables
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

VARIANTS: dict[str, dict[str, Any]] = {"PhimoeForCausalLM": {}}

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class PhimoeConfig:
    """config.json of PhimoeForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "phimoe"
    vocab_size: int = 32064
    hidden_size: int = 4096
    intermediate_size: int = 6400
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 8
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5  # the LayerNorms' eps
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    sliding_window: int | None = None
    num_experts_per_tok: int = 2
    num_local_experts: int = 16
    router_jitter_noise: float = 0.01
    attention_bias: bool = False
    lm_head_bias: bool = False
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.num_key_value_heads is None:
            object.__setattr__(self, "num_key_value_heads", self.num_attention_heads)
        if self.num_experts_per_tok != 2:
            raise BuildError(f"Phi-MoE's sparsemixer routes to exactly 2 experts, not {self.num_experts_per_tok}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def window(self, layer: int) -> int | None:
        return effective_window(self.sliding_window, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str) -> PhimoeConfig:
    rope = rope_parameters(raw, raw.get("max_position_embeddings", 4096 * 32), 1e6)
    if rope["rope_type"] == "longrope":  # PhimoeRotaryEmbedding: mscale replaces the attention factor
        if rope.get("short_mscale") != rope.get("long_mscale"):
            raise BuildError("Phi-MoE with short_mscale != long_mscale is not supported")
        rope["attention_factor"] = rope["short_mscale"]
    elif rope["rope_type"] != "default":
        raise BuildError(f"Phi-MoE with rope_type {rope['rope_type']!r}: transformers' Phimoe rotary reads "
                         "short_mscale/long_mscale for it")
    return from_dict(PhimoeConfig, raw, VARIANTS[architecture], rope_parameters=rope)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: PhimoeConfig, i: int, past, lengths, rotary,
                  target: Target):
    """PhimoeDecoderLayer.forward: x + attn(ln(x)), then x + moe(ln(x)); returns the layer's KV."""
    H, I, E = c.hidden_size, c.intermediate_size, c.num_local_experts
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H), w("input_layernorm.bias", H))
    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H), w("post_attention_layernorm.bias", H))
    m = w.under("block_sparse_moe.")
    experts = [m.under(f"experts.{e}.") for e in range(E)]
    with g.scope("block_sparse_moe"):
        with g.scope("gate"):  # PhimoeSparseMoeBlock: the router stays in float, as every MoE router here
            scores = linear(g, h, m("gate.weight", E, H), replace(target, quantization=None))  # (B, S, E)
        with g.scope("sparsemixer"):
            index, weight = sparsemixer(g, scores, c.router_jitter_noise)  # (B, S, 2) each
        stream.add(routed_experts(g, h, scores, index, weight, 2, [x("w1.weight", I, H) for x in experts],
                                  [x("w3.weight", I, H) for x in experts], [x("w2.weight", H, I) for x in experts],
                                  target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: PhimoeConfig, target: Target):
    lengths = sequence_lengths(g, io.attention_mask)
    if c.rope_parameters["rope_type"] == "longrope":
        rotary = longrope_tables(g, c.rope_parameters, c.head_dim, c.max_position_embeddings,
                                 lengths.total_sequence_length, target)
    else:
        rotary = rotary_tables(g, Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings),
                               c.max_position_embeddings, target)
    vocab = vocabulary(g, ckpt, target, (c.vocab_size, c.hidden_size), c.tie_word_embeddings)
    stream = ResidualStream(g, vocab.embed(g, io.input_ids), c.rms_norm_eps, target, layer_norm=True)
    presents = decoder_layers(g, ckpt, c.num_hidden_layers,
                              lambda i, w: decoder_layer(g, stream, w, c, i, io.past[i], lengths, rotary, target))
    with g.scope("model", "norm"):
        h = stream.norm(ckpt.weight("model.norm.weight", (c.hidden_size,)), ckpt.weight("model.norm.bias",
                                                                                        (c.hidden_size,)))
    bias = ckpt.weight("lm_head.bias", (c.vocab_size,)) if c.lm_head_bias else None
    return vocab.logits(g, h, bias=bias), presents


__all__ = ["IGNORED", "VARIANTS", "PhimoeConfig", "build", "decoder_layer", "parse_config"]
