"""LongCat-Flash (LongcatFlashForCausalLM): DeepSeek-V3's latent attention, two of them per layer,
around two dense MLPs and a shortcut-connected mixture of experts with "zero" (identity) experts.

Reference: transformers/models/longcat_flash/modular_longcat_flash.py. One decoder layer is

    x = x + attn0(n0(x));  h = m0(x);  s = moe(h);  x = x + mlp0(h)
    x = x + attn1(n1(x));  x = x + mlp1(m1(x)) + s

(n: input_layernorm[j], m: post_attention_layernorm[j]): the experts read the first sublayer's
normed stream and are added at the end of the second. What differs from DeepSeek-V3
(architectures/deepseek_v3.py, whose absorbed attention and latent cache this reuses):
- each attention (LongcatFlashMLA) always has q_lora_rank; the query is scaled by
  sqrt(hidden / q_lora_rank) (folded into the softmax scale here) and the normed latent, keys and
  values alike, by sqrt(hidden / kv_lora_rank) (folded into kv_a_layernorm's weight); the rotary is
  always on interleaved pairs;
- transformers numbers the caches per attention (layer_idx·2 + j), so builder builds the decoder as
  2·num_layers half-layers, each one attention with one latent KV cache (genai_config.json's
  num_hidden_layers is 2·num_layers): half-layer 2l + j reads `model.layers.{l}.*.{j}`, the even one
  leaves the experts' output for the odd one to add (`d.prepared`);
- the router (`mlp.router`) is a float32 softmax over n_routed_experts + zero_expert_num
  (`classifier`, whose bias transformers never applies), the top moe_topk of p +
  e_score_correction_bias, weighted by p · routed_scaling_factor (not renormalized); a chosen zero
  expert adds its weight times the normed input itself, the real ones run in MoE/QMoE;
- the next-token-prediction module (`model.mtp.*`) is left out, as transformers does.
genai 0.18 knows no longcat_flash: like DeepSeek-V3 it runs as "llama" (one KV head of rope + rank).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from architectures.deepseek_v3 import DeepseekV3Config, latent_attention, latent_cache, latent_rotary
from architectures.moe import dense_mlp, expert_matrices
from builder.architecture import Weights
from builder.blocks.linear import linear
from builder.blocks.moe import routed_experts
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register

VARIANTS: dict[str, dict[str, Any]] = {
    "LongcatFlashForCausalLM": dict(
        model_type="longcat_flash", vocab_size=131072, hidden_size=6144, num_attention_heads=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, head_dim=64, default_theta=10_000_000.0,
    ),
}
STRUCTURE: dict[str, dict[str, Any]] = {
    "LongcatFlashForCausalLM": dict(model_type="llama", sliding_window=None, layer_types=None),
}
# LongcatFlashConfig's attribute_map: transformers' generic names -> its own keys.
ALIASES = {"num_local_experts": "n_routed_experts", "num_experts_per_tok": "moe_topk",
           "intermediate_size": "ffn_hidden_size", "moe_intermediate_size": "expert_ffn_hidden_size"}


@dataclass(frozen=True)
class LongcatFlashConfig(DecoderConfig):
    """config.json of LongCat-Flash (LongcatFlashConfig's keys and defaults). `num_hidden_layers`
    is 2·num_layers (its setter halves a given one), `head_dim`/`num_key_value_heads` become the
    latent cache's as in DeepseekV3Config."""

    num_layers: int = 28
    num_hidden_layers: int | None = None
    intermediate_size: int | None = None
    ffn_hidden_size: int = 12288
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    qk_head_dim: int | None = None
    moe_topk: int = 12
    num_experts_per_tok: int | None = None
    n_routed_experts: int = 512
    num_local_experts: int | None = None
    zero_expert_num: int = 256
    zero_expert_type: str = "identity"  # the remote code's key; transformers knows identity experts only
    expert_ffn_hidden_size: int = 2048
    moe_intermediate_size: int | None = None
    routed_scaling_factor: float = 6.0
    mla_scale_q_lora: bool = True  # the remote code's switches; transformers always scales
    mla_scale_kv_lora: bool = True
    rope_interleave: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for alias, key in ALIASES.items():
            if getattr(self, alias) is not None:
                set_(self, key, getattr(self, alias))
            set_(self, alias, getattr(self, key))
        if self.num_hidden_layers is not None:  # LongcatFlashConfig.num_hidden_layers' setter
            set_(self, "num_layers", self.num_hidden_layers // 2)
        set_(self, "num_hidden_layers", 2 * self.num_layers)
        if self.qk_head_dim is None:
            set_(self, "qk_head_dim", self.qk_nope_head_dim + self.qk_rope_head_dim)
        E, Z, k = self.n_routed_experts, self.zero_expert_num, self.moe_topk
        if self.qk_head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ValueError(f"qk_head_dim {self.qk_head_dim} is not qk_nope_head_dim + qk_rope_head_dim "
                             f"({self.qk_nope_head_dim + self.qk_rope_head_dim}): transformers cannot split its queries")
        if not (self.mla_scale_q_lora and self.mla_scale_kv_lora):
            raise ValueError("mla_scale_q_lora/mla_scale_kv_lora false: transformers scales the latents whatever "
                             "they say, the remote code does not; builder builds the scaled attention only")
        if self.zero_expert_type != "identity":
            raise ValueError(f"zero_expert_type {self.zero_expert_type!r}: only identity zero experts are built")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")
        if not 1 <= k <= E + Z:
            raise ValueError(f"moe_topk {k} of {E} experts and {Z} zero experts: transformers' top-k cannot pick them")
        if Z and k >= E:
            raise ValueError(f"moe_topk {k} with only {E} routed experts and zero experts: builder routes fewer "
                             "than all of the routed experts")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim}: the rotary needs pairs")
        latent_cache(self)  # DeepSeek-V3's checks; the latent cache: one head of rope + rank
        super().__post_init__()

    @property
    def softmax_scale(self) -> float:
        """DeepSeek-V3's (YaRN's mscale² included) times the query's LoRA scale sqrt(hidden / q_lora_rank)."""
        return DeepseekV3Config.softmax_scale.fget(self) * (self.hidden_size / self.q_lora_rank) ** 0.5


class ScaledLatent(Weights):
    """An attention's tensors, kv_a_layernorm's weight times sqrt(hidden / kv_lora_rank): the latent
    is scaled after its norm (keys and values alike)."""

    def __init__(self, ckpt, prefix: str, scale: float):
        super().__init__(ckpt, prefix)
        self.scale = scale

    def __call__(self, name: str, *shape: int):
        weight = super().__call__(name, *shape)
        if name != "kv_a_layernorm.weight":
            return weight
        return weight.astype(np.float32).map(lambda a: a * np.float32(self.scale))


def zero_expert_moe(d: Decoder, h: ir.Value, m: Weights) -> ir.Value:
    """LongcatFlashMoE.forward: the routed experts plus h times the weight of the zero experts chosen."""
    g, c = d.g, d.c
    E, Z, k, H = c.n_routed_experts, c.zero_expert_num, c.moe_topk, c.hidden_size
    with g.scope("router"):  # LongcatFlashTopkRouter, in float32
        f32 = replace(d.target, quantization=None, io_dtype=np.dtype(np.float32))
        with g.scope("classifier"):
            logits = linear(g, g.op.Cast(h, to=ir.DataType.FLOAT), m("router.classifier.weight", E + Z, H), f32)
        scores = g.op.Softmax(logits, axis=-1)  # (B, S, E + Z)
        bias = g.weight("e_score_correction_bias", m("router.e_score_correction_bias", E + Z).astype(np.float32))
        index = g.op.TopK(g.op.Add(scores, bias), g.constant([k], "int64"), axis=-1, _outputs=2)[1]  # (B, S, k)
        weight = g.op.Mul(g.op.GatherElements(scores, index, axis=-1), g.constant(c.routed_scaling_factor, np.float32))
        if Z:
            with g.scope("zero_experts"):  # the real experts' weights over E, then their (≤ k) largest
                placed = g.op.ScatterElements(g.op.Expand(g.constant(0.0, np.float32), g.op.Shape(scores)), index,
                                              weight, axis=-1)
                real = g.op.Slice(placed, g.constant([0], "int64"), g.constant([E], "int64"), g.constant([-1], "int64"))
                identity = g.op.ReduceSum(g.op.Slice(placed, g.constant([E], "int64"), g.constant([E + Z], "int64"),
                                                     g.constant([-1], "int64")), g.constant([-1], "int64"), keepdims=1)
                weight, index = g.op.TopK(real, g.constant([k], "int64"), axis=-1, _outputs=2)  # 0: a zero expert's slot
                logits = real  # (B, S, E): routed_experts reads only its shape
    y = routed_experts(g, h, logits, index, g.op.CastLike(weight, h), k,
                       *expert_matrices(m, E, H, c.expert_ffn_hidden_size), d.target)
    if not Z:
        return y
    with g.scope("zero_experts"):
        return g.op.Add(y, g.op.Mul(h, g.op.CastLike(identity, h)))  # (B, S, H) · (B, S, 1)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Half of LongcatFlashDecoderLayer.forward (sublayer j = i % 2 of layer i // 2); returns its latent KV."""
    g, c = d.g, d.c
    layer, j = divmod(i, 2)
    w, H = Weights(d.ckpt, f"{d.prefix}layers.{layer}."), c.hidden_size
    with g.scope(f"input_layernorm.{j}"):
        h = d.stream.norm(w(f"input_layernorm.{j}.weight", H))
    with g.scope(f"self_attn.{j}"):
        a = ScaledLatent(d.ckpt, f"{w.prefix}self_attn.{j}.", (H / c.kv_lora_rank) ** 0.5)
        h, key, value = latent_attention(d, a, i, h)  # its cache: transformers' layer·2 + j
    d.stream.add(h)
    with g.scope(f"post_attention_layernorm.{j}"):
        h = d.stream.norm(w(f"post_attention_layernorm.{j}.weight", H))
    if j == 0:
        with g.scope("mlp"):
            d.prepared[layer] = zero_expert_moe(d, h, w.under("mlp."))
    with g.scope(f"mlps.{j}"):
        d.stream.add(dense_mlp(d, h, w.under(f"mlps.{j}."), c.ffn_hidden_size))
    if j == 1:
        d.stream.add(d.prepared.pop(layer))  # the shortcut: x + mlp1 + moe
    return key, value


def prepare(d: Decoder) -> dict:
    """The build's state across half-layers (layer l's expert output, from its first half to its
    second), and the zero experts' tensors marked unused: transformers 5.23 saved weights for
    experts n_routed_experts .. + zero_expert_num, which its forward never reads (they are identity)."""
    c = d.c
    zero = tuple(f".mlp.experts.{e}." for e in range(c.n_routed_experts, c.n_routed_experts + c.zero_expert_num))
    for name in list(d.ckpt.tensors) if zero else ():
        if any(z in name for z in zero):
            d.ckpt.consume(name)
    return {}


FAMILY = register(Family(
    "longcat_flash", LongcatFlashConfig, decoder_layer, VARIANTS, structure=STRUCTURE, rotary=latent_rotary,
    prepare=prepare, ignored=("model.mtp.*", "model.layers.*.mlp.router.classifier.bias"),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "LongcatFlashConfig", "decoder_layer"]
