"""Flint (FlintForCausalLM): Qwen3-MoE's layer with attention sinks, sliding windows that alone
rotate, a sigmoid router and an ungated shared expert.

Reference: transformers/models/flint/modular_flint.py. Apart from Qwen3-MoE (architectures/moe.py:
its pre-norm layer, dense and shared MLP, expert matrices, imported):
- attention: per-head q/k RMSNorms (GptOssRMSNorm: weight · x/rms, the same in float32), biases on
  q, k, v and o by `attention_bias`, and gpt-oss's sinks, a learned logit per head in each
  softmax's denominator (GroupQueryAttention's `head_sink`; the hub stores it as
  `self_attn.softmax_offset`, which transformers renames `sinks`);
- `layer_types` (by default full attention on layers 0, 1, every fourth from 1 and the last, the
  others sliding over `sliding_window` tokens); only the sliding layers rotate, the full ones have
  no positional encoding (NoPE), so a config where no layer slides never reads the rotary settings;
- the router (FlintTopKRouter, in float32): s = sigmoid(x · gateᵀ), the top k of s, divided by their
  sum when `norm_topk_prob`: no correction bias, no groups, no scaling; fed to ONNX Runtime's
  MoE/QMoE as chosen experts and weights (builder/blocks/moe.py routed_experts);
- the shared expert (`shared_expert_intermediate_size` wide) is always added, without Qwen2-MoE's
  sigmoid gate; dense layers by `mlp_only_layers` (default [0, 1]) and `decoder_sparse_step`.
Refused: SwiGLU experts only (`hidden_act` silu where a layer is sparse; transformers runs others),
top-k past the experts, a zero window on sliding layers (transformers fails on both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.moe import MoeConfig, dense_mlp, expert_matrices, pre_norm_layer
from architectures.smollm3 import rotary_when_used
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, self_attention
from builder.blocks.linear import linear
from builder.blocks.moe import routed_experts
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, ModelType, parse, register, strip_partial_rotary

# FlintConfig's defaults where they differ from the shared ones (builder/decoder_config.py).
VARIANTS: dict[str, dict[str, Any]] = {
    "FlintForCausalLM": dict(model_type="flint", vocab_size=150144, hidden_size=2048, intermediate_size=6144,
                             num_hidden_layers=49, num_attention_heads=32, max_position_embeddings=262144,
                             bos_token_id=None, eos_token_id=None),
}

# transformers' auto classes dispatch on model_type, whatever config.json's `architectures` says.
MODEL_TYPES = {"flint": ModelType("FlintForCausalLM")}

# onnxruntime-genai 0.18 knows no flint; its Qwen3-MoE sibling runs as "qwen3" (a plain decoder:
# Llama's inputs, outputs and KV cache, sliding-window layers declared in genai_config.json).
STRUCTURE: dict[str, dict[str, Any]] = {"FlintForCausalLM": dict(model_type="qwen3")}


@dataclass(frozen=True)
class SharedExpertKeys:
    """config.json's keys of a sparse block of routed experts beside an always-on shared expert (Flint's,
    LaraMini's), typed as their config classes type them, and the checks transformers' modeling
    needs of them."""

    num_key_value_heads: int = 4
    head_dim: int = 128
    sliding_window: int = 513
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 1024
    num_experts: int = 256
    num_experts_per_tok: int = 6
    norm_topk_prob: bool = True

    def check_experts(self, sparse: bool) -> None:
        """Refuses experts builder cannot run or transformers cannot (`sparse`: some layer has them),
        and a zero window on sliding layers."""
        if sparse:
            if self.hidden_act != "silu":
                raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")
            if self.num_experts_per_tok > self.num_experts:  # transformers' topk fails
                raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of {self.num_experts} experts")
        if self.sliding_window == 0 and "sliding_attention" in self.layer_types:  # transformers' mask fails
            raise ValueError("sliding_window 0 on sliding_attention layers")


@dataclass(frozen=True)
class FlintConfig(SharedExpertKeys, DecoderConfig):
    """config.json of FlintForCausalLM: the shared decoder keys, the experts' (SharedExpertKeys) and
    which layers have them."""

    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None

    sparse = MoeConfig.sparse  # FlintDecoderLayer's rule is Qwen2/3-MoE's

    def __post_init__(self) -> None:
        if self.mlp_only_layers is None:  # FlintConfig.__post_init__
            object.__setattr__(self, "mlp_only_layers", [0, 1])
        super().__post_init__()
        self.check_experts(any(map(self.sparse, range(self.num_hidden_layers))))

    def default_layer_types(self) -> list[str]:
        """FlintConfig.__post_init__: full attention on layers 0, 1, every fourth from 1 and the last."""
        n = self.num_hidden_layers
        return ["full_attention" if i < 2 or i % 4 == 1 or i == n - 1 else "sliding_attention" for i in range(n)]

    def rotates(self, layer: int) -> bool:
        """FlintAttention: only the sliding layers rotate (a window past the context included)."""
        return self.layer_types[layer] == "sliding_attention"


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> FlintConfig:
    """The shared parse; where no layer rotates, transformers never applies its rotary, so a
    partial_rotary_factor it could not apply is no refusal there (whole_head_rotary)."""
    c = parse(family, strip_partial_rotary(raw), architecture)
    return parse(family, raw, architecture) if any(map(c.rotates, range(c.num_hidden_layers))) else c


def router(d: Decoder, h: ir.Value, m: Weights) -> tuple[ir.Value, ir.Value, ir.Value]:
    """FlintTopKRouter.forward in float32: (router logits (B, S, E), the top k of sigmoid(logits)
    (B, S, k) int64, their scores renormalized when norm_topk_prob, in h's dtype), as
    routed_experts takes them. Call it inside `gate`."""
    g, c = d.g, d.c
    float_target = replace(d.target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), m("gate.weight", c.num_experts, c.hidden_size),
                    float_target)
    weight, index = g.op.TopK(g.op.Sigmoid(logits), g.constant([c.num_experts_per_tok], "int64"), axis=-1,
                              _outputs=2)
    if c.norm_topk_prob:
        weight = g.op.Div(weight, g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1))
    return logits, index, g.op.CastLike(weight, h)


def shared_expert_block(d: Decoder, h: ir.Value, m: Weights, route=None) -> ir.Value:
    """FlintSparseMoeBlock.forward: the routed experts (chosen by `route(d, h, m)` -> (logits, index,
    weight), default this module's router) plus the ungated shared expert (LaraMini's block too)."""
    g, c = d.g, d.c
    with g.scope("gate"):
        logits, index, weight = (route or router)(d, h, m)
    experts = expert_matrices(m, c.num_experts, c.hidden_size, c.moe_intermediate_size)
    y = routed_experts(g, h, logits, index, weight, c.num_experts_per_tok, *experts, d.target)
    with g.scope("shared_expert"):
        return g.op.Add(y, dense_mlp(d, h, m.under("shared_expert."), c.shared_expert_intermediate_size))


def mlp(d: Decoder, h: ir.Value, m: Weights, i: int) -> ir.Value:
    """The sparse block, or a dense layer's MLP."""
    return shared_expert_block(d, h, m) if d.c.sparse(i) else dense_mlp(d, h, m, d.c.intermediate_size)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """FlintDecoderLayer.forward: x + attn(norm(x)) with sinks (rotated on sliding layers alone), then
    x + mlp(norm(x)); returns the layer's KV."""
    c, a = d.c, w.under("self_attn.")
    sinks = "softmax_offset" if a.prefix + "softmax_offset" in a.ckpt else "sinks"  # the hub's name, or transformers'
    attention = replace(attention_weights(a, c, c.attention_bias, c.attention_bias, a),
                        sinks=a(sinks, c.num_attention_heads))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps)
    rotary = d.rotary if c.rotates(i) else None
    return pre_norm_layer(d, w, i, None, None, lambda h: mlp(d, h, w.under("mlp."), i), attend=lambda h: self_attention(
        d.g, h, d.past(i), d.lengths, rotary, attention, spec, d.target))


FAMILY = register(Family(
    "flint", FlintConfig, decoder_layer, VARIANTS, structure=STRUCTURE, model_types=MODEL_TYPES,
    parser=parse_config, rotary=rotary_when_used, ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "FlintConfig", "decoder_layer", "mlp", "parse_config", "router"]
