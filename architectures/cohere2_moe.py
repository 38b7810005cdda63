"""Cohere 2 MoE (Cohere2MoeForCausalLM): Cohere 2's parallel layer with a mixture of SwiGLU experts.

Reference: transformers/models/cohere2_moe/modular_cohere2_moe.py. What Cohere 2 has
(architectures/cohere.py, imported): one norm feeds attention and the MLP in parallel,
x + attn(h) + mlp(h); interleaved rotary pairs; q/k/v/o biases with `attention_bias`; logits times
`logit_scale`; sliding layers every `sliding_window_pattern`-th global. What differs:
- the norms are LayerNorms without bias at `layer_norm_eps`, or RMSNorms where config.json gives
  `rms_norm_eps` (null by default);
- `head_dim` is its own key (128 by default, never derived);
- the MLP is dense where `mlp_layer_types` says "dense" (width `prefix_dense_intermediate_size`,
  else intermediate_size), a sparse block elsewhere; without the lists, the first
  `first_k_dense_replace` layers (0 unless given) are dense, and their attention layers follow
  `prefix_dense_sliding_window_pattern` (1: all global), the others `sliding_window_pattern`
  counted from the first sparse layer;
- a layer rotates where it slides, and also where it is dense while
  prefix_dense_sliding_window_pattern is 1 (Cohere2MoeAttention.force_rope);
- the sparse block: router logits x · gateᵀ; the top k logits; their weights softmax over those k
  (ONNX Runtime's MoE router exactly, builder/blocks/moe.py sparse_moe) or, with
  `expert_selection_fn` "sigmoid", sigmoid of each, divided by their sum with `norm_topk_prob`
  (routed_experts); experts of width intermediate_size, one Linear each in checkpoints (as
  transformers saves them, by its qwen2_moe conversion rules) or stacked: expert_matrices reads
  both; `num_shared_experts` shared experts as one MLP of
  num_shared_experts · intermediate_size, summed with the routed output or averaged with it
  (`shared_expert_combination_strategy`);
- Cohere2MoeConfig never reads `rope_scaling` (its rotary is `rope_parameters`', else the default
  one at rope_theta), nor a top-level partial_rotary_factor beside a rope_parameters.
Refused as transformers fails them: a null sliding_window (its model makes the sliding mask
whatever the layers are), a window of 0 with sliding layers, mlp_layer_types of another length or
kind, a null rope_parameters, an unknown expert_selection_fn or combination strategy, more
experts chosen than there are.
Refused though transformers runs them: experts that are not SwiGLU (ONNX Runtime's MoE computes
silu only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.cohere import COHERE, scaled_logits
from architectures.moe import dense_mlp, expert_matrices
from architectures.stablelm import biased_self_attn
from builder.architecture import Weights
from builder.blocks import AttentionSpec, ResidualStream, linear, self_attention, sparse_moe
from builder.blocks.moe import routed_experts
from builder.decoder_config import DecoderConfig
from builder.errors import BuildError
from builder.family import Decoder, Family, ModelType, parse, register

# Cohere2MoeConfig's defaults where they differ from the shared ones: Cohere's sizes and token ids.
VARIANTS: dict[str, dict[str, Any]] = {
    "Cohere2MoeForCausalLM": dict(COHERE, model_type="cohere2_moe", head_dim=128, sliding_window=4096,
                                  rms_norm_eps=None),
}

# transformers' auto classes build model_type cohere2_moe with Cohere2MoeForCausalLM whatever
# config.json's architectures says; so does builder.
MODEL_TYPES = {"cohere2_moe": ModelType("Cohere2MoeForCausalLM")}

# onnxruntime-genai 0.18 knows no cohere2_moe; its decoder contract is Llama's (same inputs,
# outputs and KV cache layout; the experts are one node of the graph), as for Cohere 2.
STRUCTURE: dict[str, dict[str, Any]] = {"Cohere2MoeForCausalLM": dict(model_type="llama")}


@dataclass(frozen=True)
class Cohere2MoeConfig(DecoderConfig):
    """config.json of Cohere2MoeForCausalLM: the shared decoder keys (head_dim an integer, as
    Cohere2MoeConfig types it) and its own."""

    head_dim: int = 128
    rms_norm_eps: float | None = None  # None: LayerNorms
    layer_norm_eps: float = 1e-5
    logit_scale: float = 0.0625
    sliding_window_pattern: int = 4
    prefix_dense_sliding_window_pattern: int = 1
    first_k_dense_replace: int = 0  # read by Cohere2MoeConfig.__post_init__, not kept
    mlp_layer_types: list[str] | None = None
    prefix_dense_intermediate_size: int | None = None
    num_experts: int = 8
    num_experts_per_tok: int = 2
    num_shared_experts: int = 0
    shared_expert_combination_strategy: str = "average"
    expert_selection_fn: str = "softmax"
    norm_topk_prob: bool = True

    def __post_init__(self) -> None:
        """Cohere2MoeConfig.__post_init__'s lists, and what its forward fails on refused."""
        k, layers = self.first_k_dense_replace, self.num_hidden_layers
        if self.mlp_layer_types is None:
            object.__setattr__(self, "mlp_layer_types", ["dense" if i < k else "sparse" for i in range(layers)])
        if len(self.mlp_layer_types) != layers or not set(self.mlp_layer_types) <= {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types {self.mlp_layer_types}: one of 'dense' or 'sparse' per layer "
                             f"({layers}), as transformers requires")
        if self.sliding_window is None:  # create_sliding_window_causal_mask fails whatever the layers are
            raise ValueError("sliding_window is null: Cohere2MoeModel makes its sliding-window mask for every "
                             "model, which transformers cannot do without one")
        super().__post_init__()
        if self.sliding_window == 0 and "sliding_attention" in self.layer_types:  # transformers' mask fails
            raise ValueError("sliding_window is 0 and some layers slide: transformers cannot run that window")
        if "sparse" in self.mlp_layer_types:
            if self.expert_selection_fn not in ("softmax", "sigmoid"):
                raise ValueError(f"expert_selection_fn {self.expert_selection_fn!r}: transformers takes softmax "
                                 "or sigmoid")
            if self.num_shared_experts and self.shared_expert_combination_strategy not in ("average", "sum"):
                raise ValueError(f"shared_expert_combination_strategy {self.shared_expert_combination_strategy!r}:"
                                 " transformers takes average or sum")
            if self.num_experts_per_tok > self.num_experts:  # transformers' topk fails
                raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of {self.num_experts} experts")
            if self.hidden_act != "silu":
                raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")

    def default_layer_types(self) -> list[str]:
        """The dense prefix's layers by prefix_dense_sliding_window_pattern, the rest by
        sliding_window_pattern counted from the first of them: every pattern-th layer global.
        (first_k_dense_replace past the layer count makes more entries than layers: refused, as
        transformers refuses them.)"""
        def run(count: int, pattern: int) -> list[str]:
            if count > 0 and pattern == 0:
                raise ValueError("a sliding window pattern of 0: transformers divides by it")
            return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(count)]

        k = self.first_k_dense_replace
        return (run(k, self.prefix_dense_sliding_window_pattern)
                + run(self.num_hidden_layers - k, self.sliding_window_pattern))

    def rotates(self, layer: int) -> bool:
        """Cohere2MoeAttention: rotary where the layer slides or is forced (a dense layer at prefix pattern 1)."""
        return self.layer_types[layer] == "sliding_attention" or (
            self.mlp_layer_types[layer] == "dense" and self.prefix_dense_sliding_window_pattern == 1)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Cohere2MoeConfig:
    """`parse` over config.json as Cohere2MoeConfig reads it: its `rope_scaling` is a field nothing
    reads (the rotary is rope_parameters', else the default one at rope_theta), and a
    rope_parameters given takes no top-level partial_rotary_factor; a null one fails its rotary."""
    if "rope_parameters" in raw and raw["rope_parameters"] is None:
        raise BuildError("config.json: rope_parameters is null, which Cohere2MoeConfig keeps as it is and its "
                         "rotary cannot read")
    unread = {"rope_scaling"} | ({"partial_rotary_factor"} if isinstance(raw.get("rope_parameters"), dict) else set())
    return parse(family, {k: v for k, v in raw.items() if k not in unread}, architecture)


def norm_stream(d: Decoder, x: ir.Value) -> ResidualStream:
    """Cohere2MoeRMSNorm where config.json gives rms_norm_eps, else Cohere2MoeLayerNorm (no bias)."""
    c = d.c
    if c.rms_norm_eps is not None:
        return ResidualStream(d.g, x, c.rms_norm_eps, d.target)
    return ResidualStream(d.g, x, c.layer_norm_eps, d.target, layer_norm=True)


def sigmoid_router(d: Decoder, h: ir.Value, router) -> tuple[ir.Value, ir.Value, ir.Value]:
    """Cohere2MoeTopKRouter with expert_selection_fn sigmoid, in float32: the top k logits, each
    weighted by its sigmoid, divided by their sum with norm_topk_prob. Returns what routed_experts takes."""
    g, c = d.g, d.c
    float_target = replace(d.target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), router, float_target)  # (B, S, E)
    top, index = g.op.TopK(logits, g.constant([c.num_experts_per_tok], "int64"), axis=-1, _outputs=2)
    weight = g.op.Sigmoid(top)
    if c.norm_topk_prob:
        weight = g.op.Div(weight, g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1))
    return logits, index, g.op.CastLike(weight, h)


def mlp(d: Decoder, m: Weights, i: int, h: ir.Value) -> ir.Value:
    """Cohere2MoeMLP on a dense layer, else Cohere2MoeSparseMoeBlock.forward."""
    g, c = d.g, d.c
    H, I, E, k = c.hidden_size, c.intermediate_size, c.num_experts, c.num_experts_per_tok
    if c.mlp_layer_types[i] == "dense":
        width = c.prefix_dense_intermediate_size
        return dense_mlp(d, h, m, I if width is None else width)
    experts = expert_matrices(m, E, H, I)
    if c.expert_selection_fn == "softmax":  # softmax over the top-k logits: the MoE node's own router
        y = sparse_moe(g, h, m("gate.weight", E, H), *experts, k, True, c.hidden_act, d.target)
    else:
        with g.scope("gate"):
            logits, index, weight = sigmoid_router(d, h, m("gate.weight", E, H))
        y = routed_experts(g, h, logits, index, weight, k, *experts, d.target)
    if not c.num_shared_experts:
        return y
    with g.scope("shared_experts"):
        y = g.op.Add(y, dense_mlp(d, h, m.under("shared_experts."), I * c.num_shared_experts))
        if c.shared_expert_combination_strategy == "average":
            y = g.op.Mul(y, g.constant(0.5, d.target.io_dtype))
    return y


def decoder_layer(d: Decoder, w: Weights, i: int) -> tuple[ir.Value, ir.Value]:
    """Cohere2MoeDecoderLayer.forward: x + attn(h) + mlp(h), h = input_layernorm(x)."""
    g, c = d.g, d.c
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", c.hidden_size))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         rotary_interleaved=True)
    with g.scope("self_attn"):
        attn, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary if c.rotates(i) else None,
                                          biased_self_attn(w.under("self_attn."), c), spec, d.target)
    with g.scope("mlp"):
        y = mlp(d, w.under("mlp."), i, h)
    d.stream.add(attn)
    d.stream.add(y)  # both branches join at the layer, after the MLP
    return key, value


FAMILY = register(Family(
    "cohere2_moe", Cohere2MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, model_types=MODEL_TYPES,
    parser=parse_config, stream=norm_stream, logits=scaled_logits,
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "Cohere2MoeConfig", "decoder_layer", "mlp", "parse_config"]
