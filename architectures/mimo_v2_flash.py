"""MiMo-V2-Flash (MiMoV2FlashForCausalLM): GLM-4.5's pre-norm layer with its own attention.

Reference: transformers/models/mimo_v2_flash/modular_mimo_v2_flash.py. What differs from the
families it is assembled from (architectures/glm4_moe.py, deepseek_v3.py, gemma.py, gpt_oss.py):
- the attention is Qwen2's (q/k/v biases with `attention_bias`, none on o_proj, no q/k norms) with
  query/key heads of `head_dim` (192) and value heads of `v_head_dim` (128), the values times
  `attention_value_scale` (null: 1), the scores times head_dim^-0.5. GroupQueryAttention takes one
  head size: each head of q, k and v is projected kv_head_size(max(head_dim, v_head_dim)) wide, by
  zero rows after its own (q·k unchanged; v's extra outputs zero, cut off before o_proj); the KV
  cache holds the padded heads;
- the sliding layers (`layer_types`; by default all but layer 0 and every sixth) have twice
  `num_key_value_heads` KV heads (their own KV shape) and a learned sink per query head
  (GroupQueryAttention's head_sink; the hub stores it as `attention_sink_bias`); their window is
  `sliding_window`, or the hub's `sliding_window_size` + 1 (MiMoV2FlashConfig.__post_init__);
- the rotary is Gemma 3's, per layer type: `rope_parameters` holds one dict per layer type (by
  default theta 5e6 on full layers, 1e4 on sliding ones); the first int(head_dim · factor) dims of
  each head rotate in rotate_half halves, factor 0.334 where a default rope's dict says none;
  config.json's top-level rope_theta and partial_rotary_factor are ignored, as transformers does;
- the MLP is dense (`intermediate_size`) where `mlp_layer_types` says "dense" (by default layer 0
  alone), else DeepSeek-V3's experts: the grouped sigmoid router with its correction bias in
  float32 feeding MoE/QMoE, no shared experts;
- the hub's multi-token-prediction layers (model.mtp.*) are left unread, as transformers leaves
  them, and so are the hub's keys transformers' config does not read (hybrid_layer_pattern,
  moe_layer_freq, swa_*, add_*_attention_sink_bias, n_shared_experts, ...).
Refused, as transformers fails on them: a rope_parameters (or rope_scaling) that is not one dict
per layer type, query heads that do not group over a sliding layer's KV heads. Refused though
transformers runs it: a LongRoPE layer type (its switch to the long factors is not built per type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.glm4_moe import Glm4MoeConfig, layer_with
from builder.architecture import Weights
from builder.blocks import AttentionSpec
from builder.blocks.attention import group_query_attention
from builder.blocks.linear import linear
from builder.blocks.rope import ExplicitRotary, Rope, rotary_tables
from builder.family import Decoder, Family, ModelType, register
from builder.hf_config import from_dict
from builder.lazy import Weight
from builder.state import KV, LayerState, kv_head_size

FULL, SLIDING = "full_attention", "sliding_attention"
# MiMoV2FlashConfig's defaults of the keys every decoder shares; its own are MiMoV2FlashConfig's below.
VARIANTS: dict[str, dict[str, Any]] = {
    "MiMoV2FlashForCausalLM": dict(
        model_type="mimo_v2_flash", vocab_size=152576, hidden_size=4096, intermediate_size=16384, num_hidden_layers=48,
        num_attention_heads=64, num_key_value_heads=4, max_position_embeddings=131072, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=None, pad_token_id=None, moe_intermediate_size=2048,
        num_experts_per_tok=8, n_routed_experts=256, routed_scaling_factor=1.0, n_group=1, topk_group=1,
        norm_topk_prob=True,
    ),
}
# The hub's config.json says MiMoV2FlashForCausalLM with auto_map; its stored sinks are renamed as
# transformers' conversion rules rename them (conversion_mapping.py: mimo_v2_flash).
MODEL_TYPES = {"mimo_v2_flash": ModelType(
    "MiMoV2FlashForCausalLM", renames=((r"\.self_attn\.attention_sink_bias$", ".self_attn.sinks"),))}
# onnxruntime-genai 0.18 knows no mimo_v2_flash; the decoder contract is Llama's (inputs, outputs,
# a KV cache per layer, whose shape genai reads per layer from the model), so genai runs it as
# "llama". The modeling file has no shared experts, no q/k norms, no next-token layers in the decoder.
STRUCTURE: dict[str, dict[str, Any]] = {
    "MiMoV2FlashForCausalLM": dict(model_type="llama", n_shared_experts=0, use_qk_norm=False, num_nextn_predict_layers=0),
}
# GLM-4.5's keys MiMoV2FlashConfig removes (transformers ignores them in config.json, even null).
REMOVED = ("first_k_dense_replace", "n_shared_experts", "use_qk_norm", "num_nextn_predict_layers")
# MiMoV2FlashConfig.__post_init__'s rotary when config.json gives none.
DEFAULT_ROPE = {FULL: {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
                SLIDING: {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}
# The rope types built per layer type (not longrope), and the keys transformers requires of each
# besides rope_theta.
ROPE_KEYS = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
             "yarn": ("factor", "original_max_position_embeddings"),
             "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
             "proportional": ()}


@dataclass(frozen=True)
class MiMoV2FlashConfig(Glm4MoeConfig):
    """config.json of MiMoV2FlashForCausalLM: GLM-4.5's expert keys and MiMo's own."""

    head_dim: int = 192  # int: transformers refuses null for these three
    v_head_dim: int = 128
    sliding_window: int = 129
    sliding_window_size: int | None = None  # the hub's: the previous tokens seen, besides the query
    attention_value_scale: float | None = 0.707
    routed_scaling_factor: float | None = 1.0  # the hub says null: 1
    mlp_layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.sliding_window_size is not None:
            set_(self, "sliding_window", self.sliding_window_size + 1)
        if self.routed_scaling_factor is None:
            set_(self, "routed_scaling_factor", 1.0)
        if self.mlp_layer_types is None:
            set_(self, "mlp_layer_types", ["dense"] + ["sparse"] * (self.num_hidden_layers - 1))
        if len(self.mlp_layer_types) != self.num_hidden_layers or not set(self.mlp_layer_types) <= {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types {self.mlp_layer_types}: transformers takes one 'dense' or 'sparse' "
                             f"per layer ({self.num_hidden_layers})")
        super().__post_init__()
        if "sparse" in self.mlp_layer_types and self.n_routed_experts // self.n_group < 2:
            raise ValueError(f"{self.n_routed_experts} expert(s) in {self.n_group} group(s): the group score needs "
                             "two per group")
        if SLIDING in self.layer_types and self.num_attention_heads % (2 * self.num_key_value_heads):
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) is not a multiple of the sliding "
                             f"layers' {2 * self.num_key_value_heads} KV heads (twice num_key_value_heads): "
                             "transformers cannot run it")
        rope = dict(self.rope_parameters)
        for kind in dict.fromkeys(self.layer_types):  # what transformers' validate_rope and rotary read
            params = rope.get(kind)
            if not isinstance(params, dict):
                raise ValueError(f"rope_parameters has no {kind} entry: transformers reads one rope dict per layer "
                                 "type (a flat or null rope_parameters or rope_scaling fails there)")
            params = rope[kind] = {**params, "rope_type": params.get("rope_type", params.get("type", "default"))}
            if params["rope_type"] not in ROPE_KEYS:
                raise ValueError(f"rope_parameters.{kind}: rope_type {params['rope_type']!r} is not built per layer "
                                 f"type; builder builds {', '.join(ROPE_KEYS)}")
            missing = [k for k in ("rope_theta", *ROPE_KEYS[params["rope_type"]]) if params.get(k) is None]
            if missing:
                raise ValueError(f"rope_parameters.{kind} has no {missing[0]}, which transformers needs")
        set_(self, "rope_parameters", rope)

    def default_layer_types(self) -> list[str]:
        """MiMoV2FlashConfig's: layer 0 and every sixth layer global, the others sliding."""
        return [FULL if i == 0 or (i + 1) % 6 == 0 else SLIDING for i in range(self.num_hidden_layers)]

    @property
    def head_size(self) -> int:
        """The head size attention runs at and the KV cache holds: the wider of the two, padded."""
        return kv_head_size(max(self.head_dim, self.v_head_dim))

    def sparse(self, layer: int) -> bool:
        """MiMoV2FlashDecoderLayer.__init__: experts where mlp_layer_types says "sparse"."""
        return self.mlp_layer_types[layer] == "sparse"

    def kv_heads(self, layer: int) -> int:
        """MiMoV2FlashAttention: twice num_key_value_heads in the sliding layers."""
        return self.num_key_value_heads * (2 if self.layer_types[layer] == SLIDING else 1)

    def layer_state(self, layer: int) -> LayerState:
        return LayerState(kv=KV(self.kv_heads(layer), self.head_size, self.window(layer)), kind=self.layer_types[layer])

    def rope(self, kind: str) -> dict[str, Any]:
        """A layer type's rope dict as its rotary reads it: MiMo's default rope rotates 0.334 of the head
        unless told (its compute_default_rope_parameters); the other types, transformers' own, the whole."""
        params = self.rope_parameters[kind]
        return {"partial_rotary_factor": 0.334, **params} if params["rope_type"] == "default" else params


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> MiMoV2FlashConfig:
    """config.json over MiMoV2FlashConfig's defaults, the rotary as transformers resolves it: its
    rope_scaling (even null) over its rope_parameters, else the default per layer type."""
    raw = {k: v for k, v in raw.items() if k not in REMOVED}
    if "rope_scaling" in raw:  # set after the default rotary, even when null
        rope = raw["rope_scaling"]
    else:
        rope = DEFAULT_ROPE if raw.get("rope_parameters") is None else raw["rope_parameters"]
    if not isinstance(rope, dict):
        rope = {}  # the config refuses it: no entry per layer type
    return from_dict(family.config, raw, family.variants[architecture], rope_parameters=rope,
                     **family.structure[architecture])


def rotary(d: Decoder) -> dict[str, Any]:
    """The rotary tables per layer type (MiMoV2FlashRotaryEmbedding), for the padded heads."""
    c = d.c
    return {kind: rotary_tables(d.g, Rope.from_parameters(c.rope(kind), c.head_dim, c.max_position_embeddings),
                                c.max_position_embeddings, d.target, kind.split("_")[0] + "_", head_size=c.head_size)
            for kind in dict.fromkeys(c.layer_types)}


def head_rows(w: Weight, heads: int, size: int, padded: int) -> Weight:
    """A projection's [heads·size, ...] rows (or bias) as [heads·padded, ...]: each head's rows, then
    zero rows, so the projection gives each head padded wide, its extra entries zero (no Pad in the
    graph: ONNX Runtime has no bfloat16 Pad)."""
    if size == padded:
        return w
    zeros = Weight.constant(np.zeros((padded - size, *w.shape[1:]), w.dtype))
    return Weight.concat([part for h in range(heads) for part in (w.slice(0, h * size, (h + 1) * size), zeros)])


def attention(d: Decoder, a: Weights, i: int, h: ir.Value):
    """MiMoV2FlashAttention.forward: returns (output after o_proj, present key, present value)."""
    g, c, target = d.g, d.c, d.target
    H, D, Dv, P = c.hidden_size, c.head_dim, c.v_head_dim, c.head_size
    heads, kv, kind = c.num_attention_heads, c.kv_heads(i), c.layer_types[i]
    parts = (("q_proj", heads, D), ("k_proj", kv, D), ("v_proj", kv, Dv))  # each head padded to P
    weight = Weight.concat([head_rows(a(f"{n}.weight", m * size, H), m, size, P) for n, m, size in parts])
    bias = Weight.concat([head_rows(a(f"{n}.bias", m * size), m, size, P) for n, m, size in parts]) \
        if c.attention_bias else None
    with g.scope("qkv_proj"):
        qkv = linear(g, h, weight, target, bias)  # (B, S, (heads + 2·kv)·P)
    q, k, v = g.op.Split(qkv, g.constant([heads * P, kv * P, kv * P], "int64"), axis=-1, _outputs=3)
    scale = 1.0 if c.attention_value_scale is None else c.attention_value_scale
    if scale != 1.0:
        v = g.op.Mul(v, g.constant(scale, target.io_dtype))
    rotary = d.rotary[kind]
    if isinstance(rotary, ExplicitRotary):  # a rotary width GroupQueryAttention cannot fuse
        with g.scope("q_rotary"):
            q = rotary.rotate(g, q, heads, d.lengths.seqlens_k, False)
        with g.scope("k_rotary"):
            k = rotary.rotate(g, k, kv, d.lengths.seqlens_k, False)
        rotary = None
    sinks = a("sinks", heads) if kind == SLIDING else None
    spec = AttentionSpec(heads, kv, P, scale=D ** -0.5, window=c.window(i))
    out, present_k, present_v = group_query_attention(g, (q, k, v), d.past(i), d.lengths, rotary, sinks, spec, target)
    if P != Dv:
        with g.scope("unpad_heads"):  # (B, S, heads·P) -> (B, S, heads·Dv)
            out = g.op.Reshape(out, g.constant([0, 0, heads, P], "int64"))
            out = g.op.Slice(out, g.constant([0], "int64"), g.constant([Dv], "int64"), g.constant([3], "int64"))
            out = g.op.Reshape(out, g.constant([0, 0, heads * Dv], "int64"))
    with g.scope("o_proj"):
        out = linear(g, out, a("o_proj.weight", H, heads * Dv), target)
    return out, present_k, present_v


# MiMoV2FlashDecoderLayer.forward: GLM-4.5's layer with this attention; returns the layer's KV.
decoder_layer = layer_with(attention)


FAMILY = register(Family(
    "mimo_v2_flash", MiMoV2FlashConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    rotary=rotary, model_types=MODEL_TYPES, ignored=("model.mtp.*",),
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "MiMoV2FlashConfig", "decoder_layer", "parse_config"]
