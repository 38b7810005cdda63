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
from dataclasses import dataclass, field
from typing import Any

from builder.architecture import Weights, attention_weights, rms_norm_decoder
from builder.blocks import AttentionSpec, ResidualStream, Rope, rotary_tables, self_attention
from builder.blocks.gpt_oss_experts import ExpertWeights, expert_matrices, gpt_oss_experts
from builder.checkpoint import Checkpoint
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

log = logging.getLogger("builder")

VARIANTS: dict[str, dict[str, Any]] = {"GptOssForCausalLM": {}}

# What the modeling file fixes: onnxruntime-genai 0.18 calls this model type "gptoss".
STRUCTURE: dict[str, Any] = dict(model_type="gptoss")

# The hub's checkpoints are MXFP4 (experts only): read here, so the preflight lets them through.
QUANT_METHODS = ("mxfp4",)

IGNORED: tuple[str, ...] = ()

# GptOssConfig.__post_init__'s rotary when config.json gives none.
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


@dataclass(frozen=True)
class GptOssConfig:
    """config.json of GptOssForCausalLM; field names are the file's keys, defaults transformers' own."""

    model_type: str = "gpt_oss"
    vocab_size: int = 201088
    hidden_size: int = 2880
    intermediate_size: int = 2880
    num_hidden_layers: int = 36
    num_attention_heads: int = 64
    num_key_value_heads: int | None = 8
    head_dim: int | None = 64
    num_local_experts: int = 128
    num_experts_per_tok: int = 4
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    sliding_window: int | None = 128
    layer_types: list[str] | None = None
    max_position_embeddings: int = 131072
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = True
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.layer_types is None:  # even layers slide, odd ones are global
            set_(self, "layer_types", ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                       for i in range(self.num_hidden_layers)])
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_hidden_layers} layers")

    def window(self, layer: int) -> int | None:
        if self.layer_types[layer] != "sliding_attention":
            return None
        return effective_window(self.sliding_window, self.max_position_embeddings)


def parse_config(raw: dict[str, Any], architecture: str) -> GptOssConfig:
    if not (raw.get("rope_scaling") or raw.get("rope_parameters")):
        raw = dict(raw, rope_parameters=DEFAULT_ROPE)
    rope = rope_parameters(raw, raw.get("max_position_embeddings", 131072), 150000.0)
    if "num_experts" in raw and "num_local_experts" not in raw:  # GptOssConfig's attribute_map
        raw = dict(raw, num_local_experts=raw["num_experts"])
    return from_dict(GptOssConfig, raw, VARIANTS[architecture], rope_parameters=rope, **STRUCTURE)


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: GptOssConfig, i: int, past, lengths, rotary,
                  target: Target):
    """GptOssDecoderLayer.forward: x + attn(norm(x)) with sinks, then x + experts(norm(x)); returns the KV."""
    H, E, I = c.hidden_size, c.num_local_experts, c.intermediate_size
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, c.attention_bias)
    attention = dataclasses.replace(attention, sinks=a("sinks", c.num_attention_heads))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, window=c.window(i))
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    m, x = w.under("mlp."), w.under("mlp.experts.")
    experts = ExpertWeights(
        fc1=expert_matrices(x, "gate_up_proj", 2 * I, H, E), fc1_bias=x("gate_up_proj_bias", E, 2 * I),
        fc2=expert_matrices(x, "down_proj", H, I, E), fc2_bias=x("down_proj_bias", E, H),
        router=m("router.weight", E, H), router_bias=m("router.bias", E),
    )
    with g.scope("mlp"):
        stream.add(gpt_oss_experts(g, h, experts, c.num_experts_per_tok, c.swiglu_alpha, c.swiglu_limit, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: GptOssConfig, target: Target):
    if target.quantization is not None and not target.quantization.symmetric:
        # ORT's QMoE is proved here for these clamped, interleaved SwiGLU experts without zero points only.
        log.warning("warning: gpt-oss experts are quantized symmetric (no zero points); the other layers as asked")
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary)


__all__ = ["IGNORED", "QUANT_METHODS", "STRUCTURE", "VARIANTS", "GptOssConfig", "build", "decoder_layer",
           "parse_config"]
