"""Phi-1, Phi-1.5 and Phi-2 (PhiForCausalLM): a GPT-style decoder with parallel branches.

Reference: transformers/models/phi/modeling_phi.py. StableLM's LayerNorm layer with parallel
branches (architectures/stablelm.py): one LayerNorm (with bias) feeds both the attention and the
MLP, whose outputs join the residual together (x + attn(ln(x)) + mlp(ln(x))). Apart from it: the
MLP is fc1 -> gelu_new -> fc2; every projection has a bias, lm_head included; attention's output
projection is called `dense`; partial rotary (half the head by default); an optional LayerNorm on
q and k (`qk_layernorm`, one per projection, shared by the heads); a final LayerNorm, `final_layernorm`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import onnx_ir as ir

from architectures import stablelm
from builder.architecture import Weights
from builder.blocks import AttentionWeights
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, register

# PhiConfig's defaults where they differ from the shared ones (partial_rotary_factor: for configs
# that omit it).
VARIANTS: dict[str, dict[str, Any]] = {"PhiForCausalLM": dict(
    model_type="phi", vocab_size=51200, hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
    hidden_act="gelu_new", partial_rotary_factor=0.5,
)}

# No layer slides, whatever config.json says.
STRUCTURE: dict[str, dict[str, Any]] = {"PhiForCausalLM": dict(sliding_window=None, layer_types=None)}


@dataclass(frozen=True)
class PhiConfig(DecoderConfig):
    """config.json of PhiForCausalLM: the shared decoder keys and its own."""

    layer_norm_eps: float = 1e-5
    qk_layernorm: bool = False
    use_parallel_residual: ClassVar[bool] = True


def self_attn_weights(a: Weights, c: PhiConfig) -> AttentionWeights:
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


def mlp(d: Decoder, m: Weights, h: ir.Value) -> ir.Value:
    """PhiMLP: fc2(gelu_new(fc1(h))), with biases."""
    return stablelm.plain(d, m, h, ("fc1", "fc2"), biased=True)


def biased_logits(d: Decoder, h: ir.Value) -> ir.Value:
    """lm_head with its bias."""
    return d.vocab.logits(d.g, h, bias=d.ckpt.weight("lm_head.bias", (d.c.vocab_size,)))


# PhiDecoderLayer.forward: x + attn(ln(x)) + mlp(ln(x)), as StableLM's layer with parallel branches.
FAMILY = register(stablelm.FAMILY.with_(
    name="phi", config=PhiConfig, variants=VARIANTS, structure=STRUCTURE,
    layer=partial(stablelm.decoder_layer, self_attn=self_attn_weights, mlp=mlp),
    final_norm=partial(stablelm.final_norm, name="final_layernorm"), logits=biased_logits,
))

__all__ = ["FAMILY", "VARIANTS", "PhiConfig", "self_attn_weights"]
