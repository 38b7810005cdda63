"""ERNIE 4.5 MoE (Ernie4_5_MoeForCausalLM): the ERNIE 4.5 decoder with sparse SwiGLU experts.

Reference: transformers/models/ernie4_5_moe/modeling_ernie4_5_moe.py. As ERNIE 4.5 dense
(architectures/llama.py's row): `use_bias` on q/k/v/o, every dense MLP and the lm_head; rotary on
interleaved pairs (x0, x1), (x2, x3), … Its own:
- layer i is sparse when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index ≤ i ≤
  moe_layer_end_index (−1: the last layer); the others keep the dense MLP (intermediate_size);
- the router (Ernie4_5_MoeTopKRouter): p = softmax(x · gateᵀ); the experts are the top k of
  p + e_score_correction_bias (`moe_statics`), their weights p itself (without the bias), divided
  by max(Σ, moe_norm_min). ONNX Runtime's MoE ranks by its own softmax, not a biased one: the
  routing is built from standard operators and the fused experts get only the choices and weights
  (builder/blocks/moe.py: routed_experts). The experts have no biases;
- shared experts: one dense MLP of moe_intermediate_size · moe_num_shared_experts, added.
Multi-token-prediction tensors (`mtp*`) are not part of the decoder; transformers skips them too.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from architectures.moe import dense_mlp, expert_matrices, pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, linear
from builder.blocks.float_ops import op_dtype, to_dtype
from builder.blocks.moe import routed_experts
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register

VARIANTS: dict[str, dict[str, Any]] = {
    "Ernie4_5_MoeForCausalLM": dict(model_type="ernie4_5_moe", vocab_size=103424, hidden_size=2560,
                                    intermediate_size=12288, num_hidden_layers=28, num_attention_heads=20,
                                    num_key_value_heads=4, max_position_embeddings=131072, rms_norm_eps=1e-5,
                                    tie_word_embeddings=True, pad_token_id=0, default_theta=500_000.0),
}

# onnxruntime-genai 0.18 knows "ernie4_5" (a plain decoder), not "ernie4_5_moe": the same contract.
STRUCTURE: dict[str, dict[str, Any]] = {"Ernie4_5_MoeForCausalLM": dict(model_type="ernie4_5", sliding_window=None)}


@dataclass(frozen=True)
class Ernie4_5_MoeConfig(DecoderConfig):
    """config.json of Ernie4_5_MoeForCausalLM: the shared decoder keys and the experts'."""

    use_bias: bool = False
    moe_intermediate_size: int = 1536
    moe_k: int = 6
    moe_num_experts: int = 64
    moe_num_shared_experts: int = 2
    moe_layer_start_index: int = 1
    moe_layer_end_index: int = -1
    moe_layer_interval: int = 1
    moe_norm_min: float = 1e-12

    def __post_init__(self) -> None:
        if self.moe_layer_end_index == -1:  # Ernie4_5_MoeConfig.__post_init__
            object.__setattr__(self, "moe_layer_end_index", self.num_hidden_layers - 1)
        super().__post_init__()

    def sparse(self, layer: int) -> bool:
        """Ernie4_5_MoeDecoderLayer.__init__: experts on every interval-th layer in [start, end]."""
        return ((layer + 1) % self.moe_layer_interval == 0
                and self.moe_layer_start_index <= layer <= self.moe_layer_end_index)


def sparse_moe_block(d: Decoder, h, m: Weights):
    """Ernie4_5_MoeSparseMoeBlock.forward: routed experts plus the shared experts."""
    g, c, target = d.g, d.c, d.target
    H, E, k = c.hidden_size, c.moe_num_experts, c.moe_k
    with g.scope("gate"):  # Ernie4_5_MoeTopKRouter, in float (transformers keeps it in fp32)
        scores = linear(g, h, m("gate.weight", E, H), replace(target, quantization=None))  # (B, S, E)
        p = g.op.Softmax(scores, axis=-1)  # (B, S, E)
        bias = g.weight("moe_statics.e_score_correction_bias",
                        m("moe_statics.e_score_correction_bias", 1, E).astype(target.io_dtype))  # (1, E)
        biased = to_dtype(g, g.op.Add(p, bias), target.io_dtype, op_dtype(target.io_dtype))
        index = g.op.TopK(biased, g.constant([k], "int64"), axis=-1, _outputs=2)[1]  # (B, S, k)
        weight = g.op.GatherElements(p, index, axis=-1)  # (B, S, k): unbiased
        total = g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1)  # (B, S, 1)
        floor = g.op.CastLike(g.constant(c.moe_norm_min, "float32"), total)
        weight = g.op.Div(weight, g.op.Max(total, floor))
    y = routed_experts(g, h, scores, index, weight, k, *expert_matrices(m, c.moe_num_experts, c.hidden_size, c.moe_intermediate_size), target)
    if c.moe_num_shared_experts > 0:
        with g.scope("shared_experts"):
            shared = dense_mlp(d, h, m.under("shared_experts."), c.moe_intermediate_size * c.moe_num_shared_experts,
                               c.use_bias)
        y = g.op.Add(y, shared)
    return y


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Ernie4_5_MoeDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV."""
    c, m = d.c, w.under("mlp.")
    attention = attention_weights(w.under("self_attn."), c, c.use_bias, c.use_bias)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, rotary_interleaved=True)
    if c.sparse(i):
        return pre_norm_layer(d, w, i, attention, spec, lambda h: sparse_moe_block(d, h, m))
    return pre_norm_layer(d, w, i, attention, spec, lambda h: dense_mlp(d, h, m, c.intermediate_size, c.use_bias))


def biased_logits(d: Decoder, h):
    """lm_head, nn.Linear(bias=use_bias)."""
    bias = d.ckpt.weight("lm_head.bias", (d.c.vocab_size,)) if d.c.use_bias else None
    return d.vocab.logits(d.g, h, bias=bias)


FAMILY = register(Family(
    "ernie4_5_moe", Ernie4_5_MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE,
    logits=biased_logits,
    # Multi-token-prediction tensors (`mtp*`) are not part of the decoder; transformers skips them too.
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq", "*mtp*"),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Ernie4_5_MoeConfig", "decoder_layer"]
