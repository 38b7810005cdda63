"""Phi-3.5-MoE (PhimoeForCausalLM): a Mixtral-shaped decoder with LayerNorms and the sparsemixer router.

Reference: transformers/models/phimoe/modeling_phimoe.py. Apart from Mixtral:
- every norm is a LayerNorm with a bias (eps `rms_norm_eps`); q/k/v/o biases by `attention_bias`;
  an lm_head bias by `lm_head_bias`; a sliding window on every layer when `sliding_window` is set;
- LongRoPE whose cos/sin are scaled by `short_mscale` / `long_mscale` instead of the attention
  factor: PhimoeRotaryEmbedding.forward takes long_mscale once max(position_ids) + 1 passes
  original_max_position_embeddings, the same switch that picks the long tables, so each mscale
  is folded into its own tables (equal on the hub);
- the router is `sparsemixer` (top-2 only): each choice's weight is a softmax over the logits near
  that choice, so the weights neither sum to 1 nor are a top-k of one softmax. ONNX Runtime's MoE
  cannot compute that; it is built from standard operators and the fused experts are fed only the
  choices and weights (builder/blocks/moe.py: sparsemixer, routed_experts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from architectures.moe import pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, ResidualStream, Rope, linear, longrope_tables, rotary_tables
from builder.blocks.moe import routed_experts, sparsemixer
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, ModelType, parse, register

VARIANTS: dict[str, dict[str, Any]] = {"PhimoeForCausalLM": dict(default_theta=1e6)}
# microsoft/Phi-3.5-MoE-instruct's config.json says PhiMoEForCausalLM (its remote code's class);
# transformers builds its model_type with PhimoeForCausalLM.
MODEL_TYPES = {"phimoe": ModelType("PhimoeForCausalLM")}

# Every layer slides when there is a window: the modeling file reads no layer_types.
STRUCTURE: dict[str, dict[str, Any]] = {"PhimoeForCausalLM": dict(layer_types=None)}


@dataclass(frozen=True)
class PhimoeConfig(DecoderConfig):
    """config.json of PhimoeForCausalLM: the shared decoder keys and the experts'."""

    model_type: str = "phimoe"
    vocab_size: int = 32064
    intermediate_size: int = 6400
    num_key_value_heads: int | None = 8
    max_position_embeddings: int = 4096 * 32
    rms_norm_eps: float = 1e-5  # the LayerNorms' eps
    num_experts_per_tok: int = 2
    num_local_experts: int = 16
    router_jitter_noise: float = 0.01
    lm_head_bias: bool = False

    def __post_init__(self) -> None:
        if self.num_experts_per_tok != 2:
            raise BuildError(f"Phi-MoE's sparsemixer routes to exactly 2 experts, not {self.num_experts_per_tok}")
        super().__post_init__()


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> PhimoeConfig:
    c = parse(family, raw, architecture)
    rope = dict(c.rope_parameters)
    if rope["rope_type"] == "longrope":  # PhimoeRotaryEmbedding: mscale replaces the attention factor
        for key in ("short_mscale", "long_mscale"):  # PhimoeConfig refuses a LongRoPE without either
            if isinstance(rope.get(key), bool) or not isinstance(rope.get(key), (int, float)):
                raise BuildError(f"Phi-MoE's LongRoPE needs a number for rope_parameters' {key}, "
                                 f"not {rope.get(key)!r}")
        rope["attention_factor"] = rope["short_mscale"]  # the short tables'; rotary gives the long ones theirs
    elif rope["rope_type"] != "default":
        raise BuildError(f"Phi-MoE with rope_type {rope['rope_type']!r}: transformers' Phimoe rotary reads "
                         "short_mscale/long_mscale for it")
    return dataclasses.replace(c, rope_parameters=rope)


def rotary(d: Decoder):
    """LongRoPE's short and long tables, switched by the sequence length, each scaled by its own
    mscale (short_mscale, long_mscale), or plain ones."""
    c, lengths = d.c, d.lengths  # the lengths first, whichever tables follow
    if c.rope_parameters["rope_type"] == "longrope":
        return longrope_tables(d.g, c.rope_parameters, c.head_dim, c.max_position_embeddings,
                               lengths.total_sequence_length, d.target,
                               long_attention_factor=c.rope_parameters["long_mscale"])
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    return rotary_tables(d.g, rope, c.max_position_embeddings, d.target, head_size=c.head_dim)


def sparse_moe_block(d: Decoder, h, m: Weights):
    """PhimoeSparseMoeBlock.forward: the sparsemixer's two choices of experts, weighted."""
    g, c = d.g, d.c
    H, I, E = c.hidden_size, c.intermediate_size, c.num_local_experts
    experts = [m.under(f"experts.{e}.") for e in range(E)]
    with g.scope("gate"):  # the router stays in float, as every MoE router here
        scores = linear(g, h, m("gate.weight", E, H), replace(d.target, quantization=None))  # (B, S, E)
    with g.scope("sparsemixer"):
        index, weight = sparsemixer(g, scores, c.router_jitter_noise, d.target.io_dtype)  # (B, S, 2) each
    return routed_experts(g, h, scores, index, weight, 2, [x("w1.weight", I, H) for x in experts],
                          [x("w3.weight", I, H) for x in experts], [x("w2.weight", H, I) for x in experts], d.target)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """PhimoeDecoderLayer.forward: x + attn(ln(x)), then x + moe(ln(x)); returns the layer's KV."""
    c = d.c
    attention = attention_weights(w.under("self_attn."), c, c.attention_bias, c.attention_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i))
    return pre_norm_layer(d, w, i, attention, spec, lambda h: sparse_moe_block(d, h, w.under("block_sparse_moe.")),
                          "block_sparse_moe", norm_bias=True)


def layer_norm_stream(d: Decoder, x) -> ResidualStream:
    return ResidualStream(d.g, x, d.c.rms_norm_eps, d.target, layer_norm=True)


def final_norm(d: Decoder):
    """model.norm, a LayerNorm with a bias."""
    with d.g.scope("model", "norm"):
        H = d.c.hidden_size
        return d.stream.norm(d.ckpt.weight("model.norm.weight", (H,)), d.ckpt.weight("model.norm.bias", (H,)))


def logits(d: Decoder, h):
    """lm_head, with a bias by `lm_head_bias`."""
    bias = d.ckpt.weight("lm_head.bias", (d.c.vocab_size,)) if d.c.lm_head_bias else None
    return d.vocab.logits(d.g, h, bias=bias)


FAMILY = register(Family(
    "phimoe", PhimoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config, rotary=rotary,
    stream=layer_norm_stream, final_norm=final_norm, logits=logits, model_types=MODEL_TYPES,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "PhimoeConfig", "decoder_layer", "parse_config"]
