"""Kimi Linear (KimiLinearForCausalLM): Kimi Delta Attention layers interleaved with DeepSeek-V3's
multi-head latent attention, DeepSeek-V3's experts.

Reference: transformers/models/kimi_linear/modeling_kimi_linear.py. `layer_types` (default: layer i
attends when i > 0 and i % 4 == 0; the hub's `linear_attn_config` lists 1-based full_attn_layers
and kda_layers) says which layers are
- "linear_attention" (KimiLinearDeltaAttention): q/k/v_proj -> one depthwise causal conv over
  their concatenated channels (conv state (batch, 3·heads·head_dim, kernel − 1)) and silu; the
  gated delta rule with one decay per key channel, g = −exp(A_log[head]) · softplus(f_b(f_a(x)) +
  dt_bias), β = sigmoid(b_proj(x)), decay before the update (builder.blocks.kda); a per-head
  RMSNorm gated by sigmoid(g_b(g_a(x))); o_proj. No biases.
- "full_attention" (KimiLinearAttention): architectures/deepseek_v3.py's absorbed MLA (the latent
  cached, one KV head of rope + rank), but with no rotary at all ("NoPE": the shared k_rot part is
  left unrotated) and its q_a/kv_a RMSNorms at eps 1e-6 (their class default), not rms_norm_eps.
The MLP is dense below first_k_dense_replace (`mlp_layer_types`), else DeepSeek-V3's sparse block
(architectures/glm4_moe.py: sigmoid router, correction bias, groups, shared experts).

Hub checkpoints store transformers' conversion sources (conversion_mapping.py "kimi_linear"):
separate q/k/v_conv1d (concatenated here), the forget gate's tensors directly under self_attn,
`block_sparse_moe` with per-expert w1/w3/w2; renamed by MODEL_TYPES.

State contract: Qwen3.5's (genai type qwen3_5_text): MLA layers past_key_values.%d.key/value
(one head of qk_rope_head_dim + kv_lora_rank); KDA layers past.%d.conv and past.%d.recurrent
(batch, heads, head_dim, head_dim), in the activation dtype.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from architectures.deepseek_v3 import DeepseekV3Config, latent_attention
from architectures.glm4_moe import moe_block
from architectures.moe import dense_mlp
from builder.architecture import Weights
from builder.blocks.float_ops import in_op_dtype
from builder.blocks.kda import kda_rule
from builder.blocks.linear import linear
from builder.blocks.mlp import activation
from builder.blocks.norm import rms_norm
from builder.blocks.short_conv import causal_conv
from builder.errors import BuildError
from builder.family import Decoder, Family, ModelType, conv_padding, normed_attention, register
from builder.hf_config import from_dict
from builder.lazy import Weight
from builder.state import Conv, LayerState, Recurrent

LINEAR, ATTENTION = "linear_attention", "full_attention"

# KimiLinearConfig's defaults (transformers 5.25).
VARIANTS: dict[str, dict[str, Any]] = {
    "KimiLinearForCausalLM": dict(
        model_type="kimi_linear", vocab_size=163840, hidden_size=2304, intermediate_size=9216,
        moe_intermediate_size=1024, num_hidden_layers=27, num_attention_heads=32, num_key_value_heads=32,
        n_shared_experts=1, routed_scaling_factor=2.446, kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        v_head_dim=128, qk_nope_head_dim=128, n_group=1, topk_group=1, num_experts_per_tok=8, norm_topk_prob=True,
        hidden_act="silu", max_position_embeddings=1048576, rms_norm_eps=1e-5, pad_token_id=163839,
        bos_token_id=163584, eos_token_id=163586, tie_word_embeddings=False, attention_bias=False,
        num_local_experts=256, linear_head_dim=128, linear_num_heads=32, linear_conv_kernel_dim=4,
        first_k_dense_replace=1,
    ),
}
# What the modeling file fixes: no rotary, no window, no next-token layers, V3's router.
STRUCTURE: dict[str, dict[str, Any]] = {
    "KimiLinearForCausalLM": dict(model_type="qwen3_5_text", sliding_window=None, topk_method="noaux_tc",
                                  num_nextn_predict_layers=0),
}
# KimiLinearConfig.attribute_map (config.json's names) and the conversion rules' renames.
MODEL_TYPES: dict[str, ModelType] = {"kimi_linear": ModelType(
    "KimiLinearForCausalLM",
    keys={"model_max_length": "max_position_embeddings", "moe_renormalize": "norm_topk_prob",
          "num_expert_group": "n_group", "num_experts": "num_local_experts",
          "num_experts_per_token": "num_experts_per_tok", "num_shared_experts": "n_shared_experts"},
    renames=((r"\.self_attn\.f_a_proj\.", ".self_attn.forget_gate.f_a_proj."),
             (r"\.self_attn\.f_b_proj\.", ".self_attn.forget_gate.f_b_proj."),
             (r"\.self_attn\.dt_bias$", ".self_attn.forget_gate.dt_bias"),
             (r"\.self_attn\.A_log$", ".self_attn.forget_gate.A_log"),
             (r"\.block_sparse_moe\.", ".mlp."),
             (r"\.experts\.(\d+)\.w1\.", r".experts.\1.gate_proj."),
             (r"\.experts\.(\d+)\.w3\.", r".experts.\1.up_proj."),
             (r"\.experts\.(\d+)\.w2\.", r".experts.\1.down_proj.")),
)}
LATENT_NORM_EPS = 1e-6  # KimiLinearRMSNorm's default: q_a_layernorm and kv_a_layernorm are made without eps


@dataclass(frozen=True)
class KimiLinearConfig(DeepseekV3Config):
    """config.json of Kimi Linear: DeepSeek-V3's MLA and expert keys and the KDA layers'."""

    LAYER_TYPES: ClassVar[tuple[str, ...]] = (LINEAR, ATTENTION)

    linear_head_dim: int = 128
    linear_num_heads: int = 32
    linear_conv_kernel_dim: int = 4
    mlp_layer_types: list[str] | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.linear_conv_kernel_dim < 2:
            raise ValueError(f"linear_conv_kernel_dim {self.linear_conv_kernel_dim}: the convolution needs 2 taps")
        if self.mlp_layer_types is None:
            set_(self, "mlp_layer_types", ["dense" if i < self.first_k_dense_replace else "sparse"
                                           for i in range(self.num_hidden_layers)])
        if len(self.mlp_layer_types) != self.num_hidden_layers or set(self.mlp_layer_types) - {"dense", "sparse"}:
            raise ValueError(f"mlp_layer_types {self.mlp_layer_types}: one 'dense' or 'sparse' per layer")
        super().__post_init__()
        set_(self, "rope_parameters", None)  # no rotary anywhere: KimiLinearConfig has no rope_parameters

    def default_layer_types(self) -> list[str]:
        """KimiLinearConfig's rule: layer i attends when i > 0 and i % 4 == 0."""
        return [ATTENTION if i and i % 4 == 0 else LINEAR for i in range(self.num_hidden_layers)]

    @property
    def softmax_scale(self) -> float:
        return float((self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5)

    @property
    def qkv_dim(self) -> int:
        return self.linear_num_heads * self.linear_head_dim

    @property
    def conv_layers(self) -> list[int]:
        return [i for i, kind in enumerate(self.layer_types) if kind == LINEAR]

    def sparse(self, layer: int) -> bool:
        return self.mlp_layer_types[layer] == "sparse"

    def layer_state(self, layer: int) -> LayerState:
        """A KDA layer carries its conv's last inputs (q, k, v channels) and (heads, head_dim, head_dim)."""
        if self.layer_types[layer] != LINEAR:
            return super().layer_state(layer)
        D = self.linear_head_dim
        return LayerState(conv=Conv(3 * self.qkv_dim, self.linear_conv_kernel_dim - 1),
                          recurrent=Recurrent((self.linear_num_heads, D, D)), kind=LINEAR)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> KimiLinearConfig:
    """config.json with the hub's `linear_attn_config` read as KimiLinearConfig.__post_init__ reads it."""
    raw, linear_cfg = dict(raw), raw.get("linear_attn_config") or {}
    for key, source in (("linear_head_dim", "head_dim"), ("linear_num_heads", "num_heads"),
                        ("linear_conv_kernel_dim", "short_conv_kernel_size")):
        if source in linear_cfg:
            raw[key] = linear_cfg[source]
    if raw.get("layer_types") is None and {"full_attn_layers", "kda_layers"} <= set(linear_cfg):
        layers = raw.get("num_hidden_layers", family.variants[architecture]["num_hidden_layers"])
        kinds: list[Any] = [None] * layers
        for kind, key in ((ATTENTION, "full_attn_layers"), (LINEAR, "kda_layers")):
            for layer in linear_cfg[key]:
                if not isinstance(layer, int) or not 1 <= layer <= layers:
                    raise BuildError(f"config.json: linear_attn_config.{key}: {layer!r} is not a layer from 1 to {layers}")
                kinds[layer - 1] = kind
        raw["layer_types"] = kinds
    for key in ("rope_parameters", "rope_scaling"):  # never read: no rotary
        raw.pop(key, None)
    return from_dict(family.config, raw, family.variants[architecture], **family.structure.get(architecture, {}))


class _LatentNorms:
    """The config as latent_attention reads it, its q_a/kv_a RMSNorm eps KimiLinearRMSNorm's default."""

    rms_norm_eps = LATENT_NORM_EPS

    def __init__(self, c: KimiLinearConfig):
        self._c = c

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def nope_latent_attention(d: Decoder, a: Weights, i: int, h):
    """KimiLinearAttention.forward: DeepSeek-V3's absorbed MLA without rotary (d.rotary is None)."""
    inner = copy.copy(d)
    inner.c = _LatentNorms(d.c)
    out, key, value = latent_attention(inner, a, i, h)
    return out, (key, value)


def _float_proj(g, h, w: Weight, name: str, dtype):
    """A small projection kept float in every precision (as Qwen3.5's in_proj_a/b)."""
    with g.scope(name):
        return g.op.MatMul(h, g.weight("weight", w.transpose().astype(dtype)))


def delta_attention(d: Decoder, a: Weights, i: int, h):
    """KimiLinearDeltaAttention.forward; returns (output, (present conv state, present recurrent state))."""
    g, c, target = d.g, d.c, d.target
    H, heads, D, Q, K, dtype = (c.hidden_size, c.linear_num_heads, c.linear_head_dim, c.qkv_dim,
                                c.linear_conv_kernel_dim, target.io_dtype)
    with g.scope("qkv_proj"):  # q_proj, k_proj, v_proj as one MatMul: the conv's channel order
        mixed = linear(g, h, Weight.concat([a(f"{p}_proj.weight", Q, H) for p in "qkv"]), target)
    if a.prefix + "conv1d.weight" in a.ckpt:
        kernel = a("conv1d.weight", 3 * Q, 1, K)
    else:  # the hub's separate convs (conversion_mapping.py concatenates them)
        kernel = Weight.concat([a(f"{p}_conv1d.weight", Q, 1, K) for p in "qkv"])
    mixed, present_conv = causal_conv(g, mixed, d.io.conv[i], kernel, None, d.prepared, target, scope="conv1d")
    mixed = activation(g, mixed, c.hidden_act)
    shape = g.constant([0, 0, heads, D], "int64")
    q, k, v = (g.op.Reshape(x, shape) for x in g.op.Split(mixed, g.constant([Q, Q, Q], "int64"), axis=-1, _outputs=3))
    f = a.under("forget_gate.")
    with g.scope("forget_gate"):
        gate = _float_proj(g, _float_proj(g, h, f("f_a_proj.weight", D, H), "f_a_proj", dtype),
                           f("f_b_proj.weight", Q, D), "f_b_proj", dtype)
        shifted = g.op.Reshape(g.op.Add(gate, g.weight("dt_bias", f("dt_bias", Q)
                                                       .astype(dtype))), shape)
        neg_a = g.weight("neg_exp_A_log", f("A_log", 1, 1, heads, 1).reshaped(heads, 1)
                         .map(lambda x: -np.exp(x.astype(np.float32)), np.float32).astype(dtype))
        decay = g.op.Mul(neg_a, in_op_dtype(g, shifted, dtype, g.op.Softplus))  # (B, S, heads, D)
    beta = g.op.Sigmoid(_float_proj(g, h, a("b_proj.weight", heads, H), "b_proj", dtype))
    out, present_state = kda_rule(g, q, k, v, decay, beta, d.prepared.keep, d.io.recurrent[i], D, dtype)
    with g.scope("o_norm"):  # KimiLinearRMSNormGated: weight · RMSNorm(out) · sigmoid(g_b(g_a(x))), per head
        z = _float_proj(g, _float_proj(g, h, a("g_a_proj.weight", D, H), "g_a_proj", dtype),
                        a("g_b_proj.weight", Q, D), "g_b_proj", dtype)
        out = g.op.Mul(rms_norm(g, out, a("o_norm.weight", D), c.rms_norm_eps, target),
                       g.op.Sigmoid(g.op.Reshape(z, shape)))
        out = g.op.Reshape(out, g.constant([0, 0, Q], "int64"))
    with g.scope("o_proj"):
        out = linear(g, out, a("o_proj.weight", H, Q), target)
    return out, (present_conv, present_state)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """KimiLinearDecoderLayer.forward: x + mixer(norm(x)), then x + mlp(norm(x)); returns its state."""
    g, c = d.g, d.c
    attend = delta_attention if c.layer_types[i] == LINEAR else nope_latent_attention
    h, state = normed_attention(d, w, i, attend)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", c.hidden_size))
    m = w.under("mlp.")
    with g.scope("mlp"):
        d.stream.add(moe_block(d, h, m) if c.sparse(i) else dense_mlp(d, h, m, c.intermediate_size))
    return state


FAMILY = register(Family(
    "kimi_linear", KimiLinearConfig, decoder_layer, VARIANTS, structure=STRUCTURE, parser=parse_config,
    rotary=lambda d: None, prepare=conv_padding, model_types=MODEL_TYPES,
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "KimiLinearConfig", "decoder_layer"]
