"""LFM2-MoE (Liquid AI's LFM2-8B-A1B): LFM2's convolution and attention layers with sparse SwiGLU experts.

Reference: transformers/models/lfm2_moe/modeling_lfm2_moe.py. Each layer is LFM2's (architectures/
lfm2.py: operator_norm -> short conv or attention -> residual, ffn_norm -> feed-forward -> residual,
the same carried conv state); the feed-forward of the first `num_dense_layers` layers is LFM2's
dense MLP at `intermediate_size` as given (Lfm2MoeConfig has no block_auto_adjust_ff_dim), every
later one Lfm2MoeSparseMoeBlock:
- the router (Lfm2MoeTopKRouter): s = sigmoid(x · gateᵀ); the experts are the top k of s +
  `expert_bias` (with `use_expert_bias`, else of s); their weights are s, divided by their sum
  + 1e-6 when `norm_topk_prob`, times `routed_scaling_factor`; computed in float32 from standard
  operators and fed to ONNX Runtime's MoE/QMoE as chosen experts and weights (routed_experts);
- the experts: per expert w1 (gate), w3 (up), w2 (down) as the hub saves them, or transformers 5's
  stacked `experts.gate_up_proj` / `experts.down_proj`.
`layer_types` is required: Lfm2MoeConfig reads no `full_attn_idxs` and its model cannot run without.

onnxruntime-genai 0.18 runs the `lfm2_moe` type (its builder's builders/lfm2.py LFM2MoEModel, and
its runtime's model types): the same state contract as LFM2's (builder/genai_config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.lfm2 import Lfm2Config, decoder_layer as lfm2_layer, dense_feed_forward, final_norm
from architectures.moe import expert_matrices
from builder.architecture import Weights
from builder.blocks.linear import linear
from builder.blocks.moe import routed_experts
from builder.family import Decoder, Family, conv_padding, register

VARIANTS: dict[str, dict[str, Any]] = {
    "Lfm2MoeForCausalLM": dict(
        model_type="lfm2_moe", vocab_size=65536, hidden_size=2048, intermediate_size=7168, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=128_000, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, tie_word_embeddings=True, default_theta=1_000_000.0,
    ),
}
# LFM2's keys Lfm2MoeConfig does not read, pinned whatever config.json says: the dense MLP is
# intermediate_size as is, and layer_types comes from config.json alone.
STRUCTURE: dict[str, dict[str, Any]] = {
    "Lfm2MoeForCausalLM": dict(block_auto_adjust_ff_dim=False, block_ff_dim=None, full_attn_idxs=None),
}


@dataclass(frozen=True)
class Lfm2MoeConfig(Lfm2Config):
    """config.json of LFM2-MoE: LFM2's keys and the experts' (Lfm2MoeConfig's defaults)."""

    moe_intermediate_size: int = 1792
    num_dense_layers: int = 2
    num_experts: int = 32
    num_experts_per_tok: int = 4
    use_expert_bias: bool = True
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of {self.num_experts} experts")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        raise ValueError("no layer_types: Lfm2MoeConfig reads no full_attn_idxs, and its model needs layer_types")

    def sparse(self, layer: int) -> bool:
        """Lfm2MoeDecoderLayer.__init__: experts from layer num_dense_layers on."""
        return layer >= self.num_dense_layers


def sigmoid_router(d: Decoder, h: ir.Value, m: Weights) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Lfm2MoeTopKRouter.forward in float32: (router logits (B, S, E), chosen experts (B, S, k)
    int64, their weights (B, S, k) in h's dtype), what routed_experts takes. Call it inside `gate`."""
    g, c = d.g, d.c
    E, k = c.num_experts, c.num_experts_per_tok
    float_target = replace(d.target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), m("gate.weight", E, c.hidden_size), float_target)
    scores = g.op.Sigmoid(logits)  # (B, S, E)
    choice = scores
    if c.use_expert_bias:  # the bias picks the experts; the weights are the unbiased scores
        choice = g.op.Add(scores, g.weight("expert_bias", m("expert_bias", E).astype(np.float32)))
    index = g.op.TopK(choice, g.constant([k], "int64"), axis=-1, _outputs=2)[1]  # (B, S, k)
    weight = g.op.GatherElements(scores, index, axis=-1)
    if c.norm_topk_prob:
        total = g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1)  # (B, S, 1)
        weight = g.op.Div(weight, g.op.Add(total, g.constant(1e-6, np.float32)))
    if c.routed_scaling_factor != 1.0:
        weight = g.op.Mul(weight, g.constant(c.routed_scaling_factor, np.float32))
    return logits, index, g.op.CastLike(weight, h)


def expert_weights(m: Weights, c: Lfm2MoeConfig):
    """Each expert's (gate, up, down): the hub's experts.{e}.w1 / w3 / w2, or the stacked tensors."""
    E, H, I = c.num_experts, c.hidden_size, c.moe_intermediate_size
    if m.prefix + "experts.gate_up_proj" in m.ckpt:
        return expert_matrices(m, E, H, I)
    each = [m.under(f"experts.{e}.") for e in range(E)]
    return ([x("w1.weight", I, H) for x in each], [x("w3.weight", I, H) for x in each],
            [x("w2.weight", H, I) for x in each])


def feed_forward(d: Decoder, m: Weights, i: int, h: ir.Value) -> ir.Value:
    """Lfm2MoeSparseMoeBlock.forward, or LFM2's dense MLP in the first num_dense_layers layers."""
    c = d.c
    if not c.sparse(i):
        return dense_feed_forward(d, m, i, h)
    with d.g.scope("gate"):
        logits, index, weight = sigmoid_router(d, h, m)
    return routed_experts(d.g, h, logits, index, weight, c.num_experts_per_tok, *expert_weights(m, c), d.target)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Lfm2MoeDecoderLayer.forward: LFM2's layer with this feed-forward; returns its present state."""
    return lfm2_layer(d, w, i, feed_forward)


FAMILY = register(Family(
    "lfm2_moe", Lfm2MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, prepare=conv_padding,
    final_norm=final_norm,
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Lfm2MoeConfig", "decoder_layer", "feed_forward", "sigmoid_router"]
