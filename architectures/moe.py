"""Llama-style decoders whose MLP is a sparse mixture of SwiGLU experts, the variants as data.

Reference: transformers/models/{qwen2_moe,qwen3_moe,mixtral,olmoe}/modeling_*.py. Each router is
softmax, top-k, and (Mixtral always, the others by `norm_topk_prob`) the top-k renormalized: ONNX
Runtime's MoE/QMoE router exactly (builder/blocks/moe.py). Qwen2-MoE: q/k/v biases, a shared expert
times sigmoid(shared_expert_gate(x)), dense layers by `mlp_only_layers`/`decoder_sparse_step`;
Qwen3-MoE: per-head q/k norms, the same dense layers; Mixtral: experts `w1/w3/w2`, a sliding window;
OLMoE: q/k norms over the whole projections. Each expert is its own Linear in checkpoints.

The pre-norm layer and the dense MLP here are also the other MoE families' (gpt-oss, Phi-MoE,
ERNIE 4.5 MoE, Granite MoE) and HunYuan's: they differ from these in the attention or the MLP only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import onnx_ir as ir

from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec, AttentionWeights, gated_mlp, linear, self_attention, sparse_moe
from builder.blocks.moe import unstacked
from builder.decoder_config import DecoderConfig
from builder.family import Decoder, Family, register

QWEN = dict(vocab_size=151936, max_position_embeddings=32768, bos_token_id=None, eos_token_id=None, sliding_window=4096)
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen2MoeForCausalLM": dict(model_type="qwen2_moe", **QWEN, hidden_size=2048, intermediate_size=5632,
                                num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                                moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
                                num_experts_per_tok=4, num_experts=60, max_window_layers=28),
    "Qwen3MoeForCausalLM": dict(model_type="qwen3_moe", **QWEN, hidden_size=2048, intermediate_size=6144,
                                num_hidden_layers=24, num_attention_heads=32, num_key_value_heads=4,
                                moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128),
    "MixtralForCausalLM": dict(model_type="mixtral", num_key_value_heads=8, intermediate_size=14336,
                               max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, num_experts_per_tok=2,
                               num_local_experts=8, default_theta=1e6),
    "OlmoeForCausalLM": dict(model_type="olmoe", vocab_size=50304, hidden_size=2048, intermediate_size=2048,
                             num_hidden_layers=16, num_attention_heads=16, max_position_embeddings=4096,
                             rms_norm_eps=1e-5, bos_token_id=None, pad_token_id=1, eos_token_id=50279,
                             num_experts_per_tok=8, num_experts=64),
}

# What each modeling file fixes; genai 0.18 runs these as their dense siblings' (plain decoder) types.
STRUCTURE: dict[str, dict[str, Any]] = {
    "Qwen2MoeForCausalLM": dict(model_type="qwen2", attention_bias=False),
    "Qwen3MoeForCausalLM": dict(model_type="qwen3", qk_norm="head", qkv_bias=False, max_window_layers=None),
    "MixtralForCausalLM": dict(model_type="mistral", norm_topk_prob=True, moe="block_sparse_moe",
                               experts=("w1", "w3", "w2"), use_sliding_window=True, max_window_layers=None,
                               layer_types=None, qkv_bias=False),
    "OlmoeForCausalLM": dict(model_type="olmo", qk_norm="whole", sliding_window=None, layer_types=None, qkv_bias=False),
}


@dataclass(frozen=True)
class MoeConfig(DecoderConfig):
    """config.json of these families: the shared decoder keys and the experts'. Each VARIANTS row sets
    intermediate_size: the dense layers' MLP in Qwen's, the experts' in Mixtral's and OLMoE's."""

    qkv_bias: bool = True  # Qwen2-MoE's key; the others follow attention_bias
    clip_qkv: float | None = None
    use_sliding_window: bool = False
    max_window_layers: int | None = None
    num_experts: int | None = None
    num_local_experts: int | None = None  # Mixtral's name for num_experts
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None  # None: intermediate_size
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    # Structure the modeling files fix per architecture (not config.json keys).
    qk_norm: str | None = None  # "head": per-head RMSNorm (Qwen3); "whole": over the projection (OLMoE)
    moe: str = "mlp"  # the sparse block's module name
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_local_experts is not None:
            set_(self, "num_experts", self.num_local_experts)
        if self.moe_intermediate_size is None:
            set_(self, "moe_intermediate_size", self.intermediate_size)
        if self.attention_bias:
            set_(self, "qkv_bias", True)
        if not self.use_sliding_window:
            set_(self, "sliding_window", None)
        if self.clip_qkv is not None:  # OLMoE clamps after its q/k norms; the attention block before
            raise ValueError("OLMoE's clip_qkv is not supported (it clamps after the q/k norms)")
        super().__post_init__()

    def default_layer_types(self) -> list[str]:
        """Qwen2MoeConfig: the even layers below max_window_layers slide; Mixtral/Qwen3-MoE: all."""
        last, w = self.max_window_layers, self.sliding_window
        return ["sliding_attention" if w and (last is None or i % 2 == 0 and i < last) else "full_attention"
                for i in range(self.num_hidden_layers)]

    def sparse(self, layer: int) -> bool:
        """Qwen2/3MoeDecoderLayer: experts unless listed dense or off the sparse step."""
        dense = layer in (self.mlp_only_layers or ()) or (layer + 1) % self.decoder_sparse_step
        return not dense and self.num_experts > 0


def pre_norm_layer(d: Decoder, w: Weights, i: int, attention: AttentionWeights | None, spec: AttentionSpec | None,
                   mlp: Callable[[ir.Value], ir.Value], mlp_scope: str = "mlp", norm_bias: bool = False,
                   branch: Callable[[ir.Value], ir.Value] = lambda h: h,
                   attend: Callable[[ir.Value], tuple[ir.Value, ir.Value, ir.Value]] | None = None):
    """x + branch(attn(norm(x))), then x + branch(mlp(norm(x))), Llama's layer with another attention
    or MLP: `input_layernorm` and `post_attention_layernorm` (with biases when `norm_bias`: LayerNorms),
    `mlp(h)` recorded under `mlp_scope`, `branch` inside each scope (Granite's residual multiplier).
    The attention is self_attention with `attention` and `spec`, or `attend(h)` -> (output, present
    key, present value) for another kind (MiniCPM5-MoE's gated one). Returns the layer's present
    key and value."""
    g, H = d.g, d.c.hidden_size
    def norm(name: str) -> ir.Value:
        with g.scope(name):
            return d.stream.norm(w(f"{name}.weight", H), w(f"{name}.bias", H) if norm_bias else None)

    h = norm("input_layernorm")
    with g.scope("self_attn"):
        if attend is not None:
            h, key, value = attend(h)
        else:
            h, key, value = self_attention(g, h, d.past(i), d.lengths, d.rotary, attention, spec, d.target)
        d.stream.add(branch(h))
    h = norm("post_attention_layernorm")
    with g.scope(mlp_scope):
        d.stream.add(branch(mlp(h)))
    return key, value


def expert_matrices(m: Weights, count: int, hidden: int, inter: int):
    """Each expert's (gate, up, down) matrices under `m` (a sparse block's weights): per-expert
    Linears (`experts.{e}.gate_proj`, ...) as on the hub, or the stacked [E, 2I, H] / [E, H, I]
    `experts.gate_up_proj` / `experts.down_proj` transformers 5 saves (gate rows first, then up)."""
    E, H, I = count, hidden, inter
    if m.prefix + "experts.gate_up_proj" in m.ckpt:
        gate_up = m("experts.gate_up_proj", E, 2 * I, H)
        return unstacked(gate_up, 0, I), unstacked(gate_up, I), unstacked(m("experts.down_proj", E, H, I))
    each = [m.under(f"experts.{e}.") for e in range(E)]
    return ([x("gate_proj.weight", I, H) for x in each], [x("up_proj.weight", I, H) for x in each],
            [x("down_proj.weight", H, I) for x in each])


def dense_mlp(d: Decoder, h: ir.Value, m: Weights, size: int, bias: bool = False) -> ir.Value:
    """A SwiGLU MLP under `m` (gate_proj, up_proj, down_proj, of width `size`), biased when `bias`."""
    H = d.c.hidden_size
    biases = (m("gate_proj.bias", size), m("up_proj.bias", size), m("down_proj.bias", H)) if bias else None
    return gated_mlp(d.g, h, m("gate_proj.weight", size, H), m("up_proj.weight", size, H),
                     m("down_proj.weight", H, size), d.c.hidden_act, d.target, biases)


def mlp(d: Decoder, h: ir.Value, m: Weights, i: int) -> ir.Value:
    """Qwen2Moe/Qwen3Moe/Mixtral/OlmoeSparseMoeBlock.forward, or a dense layer's MLP."""
    g, c = d.g, d.c
    H, E, I = c.hidden_size, c.num_experts, c.moe_intermediate_size
    if not c.sparse(i):
        return dense_mlp(d, h, m, c.intermediate_size)
    experts = [m.under(f"experts.{e}.") for e in range(E)]
    gate, up, down = ([x(f"{name}.weight", *shape) for x in experts]
                      for name, shape in zip(c.experts, ((I, H), (I, H), (H, I))))
    y = sparse_moe(g, h, m("gate.weight", E, H), gate, up, down, c.num_experts_per_tok, c.norm_topk_prob,
                   c.hidden_act, d.target)
    if c.shared_expert_intermediate_size:  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) · shared_expert(x)
        with g.scope("shared_expert"):
            shared = dense_mlp(d, h, m.under("shared_expert."), c.shared_expert_intermediate_size)
        with g.scope("shared_expert_gate"):  # a [1, H] gate, kept in float like the router
            float_target = replace(d.target, quantization=None)
            scale = g.op.Sigmoid(linear(g, h, m("shared_expert_gate.weight", 1, H), float_target))
        y = g.op.Add(y, g.op.Mul(shared, scale))
    return y


def decoder_layer(d: Decoder, w: Weights, i: int, mlp: Callable[[Decoder, ir.Value, Weights, int], ir.Value] = mlp):
    """Qwen2Moe/Qwen3Moe/Mixtral/OlmoeDecoderLayer.forward: x + attn(norm(x)), then x + moe(norm(x));
    `mlp(d, h, weights under the block, i)` (this module's by default: Qwen3-VL-MoE's reads stacked experts)."""
    c, D = d.c, d.c.head_dim
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.qkv_bias, c.attention_bias, a if c.qk_norm == "head" else None)
    if c.qk_norm == "whole":  # OlmoeAttention: RMSNorm over the whole q and k projections
        attention = replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads * D),
                            k_norm=a("k_norm.weight", c.num_key_value_heads * D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps,
                         qk_norm_whole=c.qk_norm == "whole")
    return pre_norm_layer(d, w, i, attention, spec, lambda h: mlp(d, h, w.under(c.moe + "."), i), c.moe)


FAMILY = register(Family(
    "moe", MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, 
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "MoeConfig", "decoder_layer", "dense_mlp", "expert_matrices", "mlp", 
           "pre_norm_layer"]
