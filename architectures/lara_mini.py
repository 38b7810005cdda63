"""Lara Mini (LaraMiniForCausalLM): Qwen3.5's gated DeltaNet layers between Qwen3 attention layers
that slide and rotate or attend globally without positions, each followed by a softmax-routed
mixture of SwiGLU experts beside an ungated shared expert.

Reference: transformers/models/lara_mini/modular_lara_mini.py. Apart from what it reuses:
- "linear_attention" layers are Qwen3.5's gated DeltaNet (architectures/qwen3_5.py gated_deltanet,
  its conv and recurrent states and genai's `qwen3_5_text` contract); the hub's checkpoints (and
  save_pretrained) fuse its projections into one `in_proj`, rows [q|k|v|z|b|a], and call its gated
  norm `out_norm`: split and renamed as transformers' conversion rules do (MODEL_TYPES);
- the attention layers are Qwen3's (per-head q/k RMSNorms, biases by `attention_bias`), no output
  gate and no sinks; "sliding_attention" layers slide over `sliding_window` tokens and alone rotate
  (the whole head: its rotary ignores partial_rotary_factor), "full_attention" ones have no
  positional encoding (NoPE, as architectures/flint.py);
- every RMSNorm scales by its weight (HeliumRMSNorm), not Qwen3.5's (1 + weight);
- every layer's MLP is sparse: the router in float32, softmax over all experts, the top k
  renormalized by `norm_topk_prob`; the experts stacked (architectures/moe.py expert_matrices);
  the shared expert always added, without a gate (FlintSparseMoeBlock).
Refused: SwiGLU experts only (`hidden_act` silu; transformers runs others), a conv of one tap
(Qwen3.5's refusal: no conv state to carry; transformers runs it), top-k past the experts and a
zero window on sliding layers (transformers fails on both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import onnx_ir as ir

from architectures import qwen3_5
from architectures.flint import SharedExpertKeys, parse_config, shared_expert_block
from architectures.smollm3 import rotary_when_used
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, self_attention
from builder.blocks.linear import linear
from builder.family import Decoder, Family, ModelType, conv_padding, register
from builder.state import LayerState

LINEAR, FULL, SLIDING = "linear_attention", "full_attention", "sliding_attention"

# LaraMiniConfig's defaults where they differ from the shared ones (builder/decoder_config.py).
VARIANTS: dict[str, dict[str, Any]] = {
    "LaraMiniForCausalLM": dict(model_type="lara_mini", vocab_size=151936, hidden_size=1024, num_hidden_layers=34,
                                num_attention_heads=16, max_position_embeddings=131072, tie_word_embeddings=True,
                                bos_token_id=None, eos_token_id=151643, sliding_window=512,
                                shared_expert_intermediate_size=512, num_experts=128, num_experts_per_tok=4),
}
# onnxruntime-genai 0.18 knows no lara_mini: it runs as Qwen3.5 (the same KV, conv and recurrent states).
STRUCTURE: dict[str, dict[str, Any]] = {"LaraMiniForCausalLM": dict(model_type="qwen3_5_text")}


def split_in_proj(c: LaraMiniConfig) -> tuple:
    """conversion_mapping.py's lara_mini Split: `in_proj` rows [q|k|v] (the conv's), [z], [b], [a]."""
    value_dim, heads = c.heads.value_heads * c.heads.value_dim, c.heads.value_heads
    parts = (("in_proj_qkv", c.conv_dim), ("in_proj_z", value_dim), ("in_proj_b", heads), ("in_proj_a", heads))
    return ((r"\.linear_attn\.in_proj\.weight$", tuple((f".linear_attn.{n}.weight", rows) for n, rows in parts)),)


# transformers' auto classes dispatch on model_type, whatever config.json's `architectures` says; the
# tensors as the hub (and save_pretrained) stores them, under transformers' names. Names already
# split and renamed (transformers' in memory, which it loads as they are) pass unchanged.
MODEL_TYPES = {"lara_mini": ModelType("LaraMiniForCausalLM", splits=split_in_proj,
                                      renames=((r"\.linear_attn\.out_norm\.", ".linear_attn.norm."),))}


@dataclass(frozen=True)
class LaraMiniConfig(SharedExpertKeys, qwen3_5.Qwen3_5Config):
    """config.json of LaraMiniForCausalLM: Qwen3.5's DeltaNet keys, the window and Flint's expert keys
    (SharedExpertKeys; LaraMiniConfig's defaults in VARIANTS)."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (LINEAR, FULL, SLIDING)

    linear_num_key_heads: int = 8
    linear_num_value_heads: int = 16

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_experts(True)

    def default_layer_types(self) -> list[str]:
        """LaraMiniConfig.__post_init__: the released pattern, period 5."""
        pattern = (LINEAR, SLIDING, LINEAR, FULL, SLIDING)
        return [pattern[i % 5] for i in range(self.num_hidden_layers)]

    def layer_state(self, layer: int) -> LayerState:
        """Qwen3.5's; an attention layer, sliding or not, is listed "full_attention" (genai's KV
        layers: it takes any other type for a conv layer)."""
        state = super().layer_state(layer)
        return state if state.conv is not None else replace(state, kind=FULL)

    def rotates(self, layer: int) -> bool:
        """LaraMiniModel: only the sliding layers get the rotary."""
        return self.layer_types[layer] == SLIDING


def router(d: Decoder, h: ir.Value, m: Weights) -> tuple[ir.Value, ir.Value, ir.Value]:
    """LaraMiniTopKRouter.forward in float32: (logits, the top k of softmax(logits), their scores
    renormalized when norm_topk_prob, in h's dtype), as routed_experts takes them."""
    g, c = d.g, d.c
    float_target = replace(d.target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), m("gate.weight", c.num_experts, c.hidden_size),
                    float_target)
    weight, index = g.op.TopK(g.op.Softmax(logits, axis=-1), g.constant([c.num_experts_per_tok], "int64"), axis=-1,
                              _outputs=2)
    if c.norm_topk_prob:
        weight = g.op.Div(weight, g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1))
    return logits, index, g.op.CastLike(weight, h)


def sparse_block(d: Decoder, h: ir.Value, m: Weights) -> ir.Value:
    """LaraMiniSparseMoeBlock.forward: Flint's block (the routed experts plus the ungated shared
    expert) with this router."""
    return shared_expert_block(d, h, m, router)


def attention(d: Decoder, a: Weights, i: int, h: ir.Value):
    """LaraMiniAttention.forward: Qwen3's, rotated on sliding layers alone; returns (output, (key, value))."""
    c = d.c
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i),
                         norm_eps=c.rms_norm_eps)
    out, key, value = self_attention(d.g, h, d.past(i), d.lengths, d.rotary if c.rotates(i) else None,
                                     attention_weights(a, c, c.attention_bias, c.attention_bias, a), spec, d.target)
    return out, (key, value)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """LaraMiniDecoderLayer.forward: x + mixer(norm(x)), then x + moe(norm(x)); returns the layer's
    present state: (key, value), or (conv, recurrent)."""
    g, H = d.g, d.c.hidden_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w("input_layernorm.weight", H))
    if d.c.layer_types[i] == LINEAR:
        with g.scope("linear_attn"):
            h, *state = qwen3_5.gated_deltanet(d, w.under("linear_attn."), i, h)
    else:
        with g.scope("self_attn"):
            h, state = attention(d, w.under("self_attn."), i, h)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    with g.scope("mlp"):
        d.stream.add(sparse_block(d, h, w.under("mlp.")))
    return tuple(state)


FAMILY = register(Family(
    "lara_mini", LaraMiniConfig, decoder_layer, VARIANTS, structure=STRUCTURE, model_types=MODEL_TYPES,
    parser=parse_config, rotary=rotary_when_used, prepare=conv_padding,
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "LaraMiniConfig", "decoder_layer", "sparse_block"]
