"""gpt-oss (GptOssForCausalLM): a Llama-shaped decoder with a mixture of experts in every layer.

Reference: transformers/models/gpt_oss/modeling_gpt_oss.py. What sets it apart:
- attention sinks: a learned logit per head that joins each softmax's denominator only
  (GroupQueryAttention's `head_sink` input), and biases on q, k, v and o;
- sliding-window and full layers alternating by `layer_types` (the window 128 on the hub);
- YaRN rotary (factor 32 over 4096 positions, `truncate` false), rotate_half pairs;
- experts with biases and a clamped SwiGLU (gate·σ(1.702·gate)·(up + 1)), routed by the softmax of
  the top-k router logits: one com.microsoft::MoE / QMoE node (builder/blocks/gpt_oss_experts.py);
- the hub's checkpoints store the expert matrices in MXFP4 (`quantization_config` mxfp4,
  `*_blocks` and `*_scales` tensors): decoded exactly when written, then cast or requantized.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from architectures.moe import pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec
from builder.blocks.gpt_oss_experts import ExpertWeights, expert_matrices, gpt_oss_experts
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, parse, register

log = logging.getLogger("builder")

VARIANTS: dict[str, dict[str, Any]] = {
    "GptOssForCausalLM": dict(model_type="gpt_oss", vocab_size=201088, hidden_size=2880, intermediate_size=2880,
                              num_hidden_layers=36, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                              sliding_window=128, max_position_embeddings=131072, rms_norm_eps=1e-5,
                              attention_bias=True, bos_token_id=None, eos_token_id=None, default_theta=150000.0),
}

# What the modeling file fixes: onnxruntime-genai 0.18 calls this model type "gptoss".
STRUCTURE: dict[str, dict[str, Any]] = {"GptOssForCausalLM": dict(model_type="gptoss")}

# GptOssConfig.__post_init__'s rotary when config.json gives none.
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


@dataclass(frozen=True)
class GptOssConfig(DecoderConfig):
    """config.json of GptOssForCausalLM: the shared decoder keys and the experts'."""

    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def default_layer_types(self) -> list[str]:
        """Even layers slide, odd ones are global."""
        return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(self.num_hidden_layers)]


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> GptOssConfig:
    if not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        raw = dict(raw, rope_parameters=DEFAULT_ROPE)
    if "num_experts" in raw and "num_local_experts" not in raw:  # GptOssConfig's attribute_map
        raw = dict(raw, num_local_experts=raw["num_experts"])
    return parse(family, raw, architecture)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """GptOssDecoderLayer.forward: x + attn(norm(x)) with sinks, then x + experts(norm(x)); returns the KV."""
    c = d.c
    H, E, I = c.hidden_size, c.num_local_experts, c.intermediate_size
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    attention = dataclasses.replace(attention, sinks=a("sinks", c.num_attention_heads))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i))
    m, x = w.under("mlp."), w.under("mlp.experts.")
    experts = ExpertWeights(
        fc1=expert_matrices(x, "gate_up_proj", 2 * I, H, E), fc1_bias=x("gate_up_proj_bias", E, 2 * I),
        fc2=expert_matrices(x, "down_proj", H, I, E), fc2_bias=x("down_proj_bias", E, H),
        router=m("router.weight", E, H), router_bias=m("router.bias", E),
    )
    return pre_norm_layer(d, w, i, attention, spec, lambda h: gpt_oss_experts(
        d.g, h, experts, c.num_experts_per_tok, c.swiglu_alpha, c.swiglu_limit, d.target))


def warn_symmetric_experts(d: Decoder) -> None:
    """ORT's QMoE is proved here for these clamped, interleaved SwiGLU experts without zero points only."""
    if d.target.quantization is not None and not d.target.quantization.symmetric:
        log.warning("warning: gpt-oss experts are quantized symmetric (no zero points); the other layers as asked")


FAMILY = register(Family(
    "gpt_oss", GptOssConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    prepare=warn_symmetric_experts,
    # The hub's checkpoints are MXFP4 (experts only): read here, so the preflight lets them through.
    quant_methods=("mxfp4",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "GptOssConfig", "decoder_layer", "parse_config"]
