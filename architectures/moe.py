"""Llama-style decoders whose MLP is a sparse mixture of SwiGLU experts, the variants as data.

Reference: transformers/models/{qwen2_moe,qwen3_moe,mixtral,olmoe}/modeling_*.py. Each router is
softmax, top-k, and (Mixtral always, the others by `norm_topk_prob`) the top-k renormalized: ONNX
Runtime's MoE/QMoE router exactly (builder/blocks/moe.py). Qwen2-MoE: q/k/v biases, a shared expert
times sigmoid(shared_expert_gate(x)), dense layers by `mlp_only_layers`/`decoder_sparse_step`;
Qwen3-MoE: per-head q/k norms, the same dense layers; Mixtral: experts `w1/w3/w2`, a sliding window;
OLMoE: q/k norms over the whole projections. Each expert is its own Linear in checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from builder.architecture import Weights, attention_weights, rms_norm_decoder
from builder.blocks import (AttentionSpec, ResidualStream, Rope, gated_mlp, linear, rotary_tables, self_attention,
                            sparse_moe)
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.graph import Graph
from builder.hf_config import effective_window, from_dict, rope_parameters
from builder.io import DecoderIO
from builder.target import Target

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

IGNORED = ("model.layers.*.self_attn.rotary_emb.inv_freq",)


@dataclass(frozen=True)
class MoeConfig:
    """config.json of these families; field names are the file's keys, defaults transformers' own."""

    model_type: str = "mixtral"
    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 14336  # dense layers' MLP (Qwen); the experts' (Mixtral, OLMoE)
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-6  # Qwen's; Mixtral's and OLMoE's in VARIANTS
    tie_word_embeddings: bool = False
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_bias: bool = False
    qkv_bias: bool = True  # Qwen2-MoE's key; the others follow attention_bias
    clip_qkv: float | None = None
    sliding_window: int | None = None
    use_sliding_window: bool = False
    max_window_layers: int | None = None
    layer_types: list[str] | None = None
    num_experts: int | None = None
    num_local_experts: int | None = None  # Mixtral's name for num_experts
    num_experts_per_tok: int = 2
    moe_intermediate_size: int | None = None  # None: intermediate_size
    shared_expert_intermediate_size: int | None = None
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: list[int] | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = None
    # Structure the modeling files fix per architecture (not config.json keys).
    qk_norm: str | None = None  # "head": per-head RMSNorm (Qwen3); "whole": over the projection (OLMoE)
    moe: str = "mlp"  # the sparse block's module name
    experts: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.head_dim is None:
            set_(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.num_key_value_heads is None:
            set_(self, "num_key_value_heads", self.num_attention_heads)
        if self.num_local_experts is not None:
            set_(self, "num_experts", self.num_local_experts)
        if self.moe_intermediate_size is None:
            set_(self, "moe_intermediate_size", self.intermediate_size)
        if self.attention_bias:
            set_(self, "qkv_bias", True)
        if not self.use_sliding_window:
            set_(self, "sliding_window", None)
        if self.layer_types is None:
            # Qwen2MoeConfig: the even layers below max_window_layers slide; Mixtral/Qwen3-MoE: all.
            last, w = self.max_window_layers, self.sliding_window
            set_(self, "layer_types", ["sliding_attention" if w and (last is None or i % 2 == 0 and i < last)
                                       else "full_attention" for i in range(self.num_hidden_layers)])
        if self.clip_qkv is not None:  # OLMoE clamps after its q/k norms; the attention block before
            raise ValueError("OLMoE's clip_qkv is not supported (it clamps after the q/k norms)")

    def window(self, layer: int) -> int | None:
        sliding = self.layer_types[layer] == "sliding_attention"
        return effective_window(self.sliding_window, self.max_position_embeddings) if sliding else None

    def sparse(self, layer: int) -> bool:
        """Qwen2/3MoeDecoderLayer: experts unless listed dense or off the sparse step."""
        dense = layer in (self.mlp_only_layers or ()) or (layer + 1) % self.decoder_sparse_step
        return not dense and self.num_experts > 0


def parse_config(raw: dict[str, Any], architecture: str) -> MoeConfig:
    defaults = dict(VARIANTS[architecture])
    theta, max_pos = defaults.pop("default_theta", 10_000.0), defaults.get("max_position_embeddings", 2048)
    rope = rope_parameters(raw, raw.get("max_position_embeddings", max_pos), theta)
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise BuildError(f"{architecture} with partial_rotary_factor: transformers rotates the whole head")
    return from_dict(MoeConfig, raw, defaults, rope_parameters=rope, **STRUCTURE[architecture])


def mlp(g: Graph, h, m: Weights, c: MoeConfig, i: int, target: Target):
    """Qwen2Moe/Qwen3Moe/Mixtral/OlmoeSparseMoeBlock.forward, or a dense layer's MLP."""
    H, E, I = c.hidden_size, c.num_experts, c.moe_intermediate_size
    if not c.sparse(i):
        D = c.intermediate_size
        return gated_mlp(g, h, m("gate_proj.weight", D, H), m("up_proj.weight", D, H), m("down_proj.weight", H, D),
                         c.hidden_act, target)
    experts = [m.under(f"experts.{e}.") for e in range(E)]
    gate, up, down = ([x(f"{name}.weight", *shape) for x in experts]
                      for name, shape in zip(c.experts, ((I, H), (I, H), (H, I))))
    y = sparse_moe(g, h, m("gate.weight", E, H), gate, up, down, c.num_experts_per_tok, c.norm_topk_prob,
                   c.hidden_act, target)
    if c.shared_expert_intermediate_size:  # Qwen2-MoE: sigmoid(shared_expert_gate(x)) · shared_expert(x)
        S, s = c.shared_expert_intermediate_size, m.under("shared_expert.")
        with g.scope("shared_expert"):
            shared = gated_mlp(g, h, s("gate_proj.weight", S, H), s("up_proj.weight", S, H),
                               s("down_proj.weight", H, S), c.hidden_act, target)
        with g.scope("shared_expert_gate"):  # a [1, H] gate, kept in float like the router
            scale = g.op.Sigmoid(linear(g, h, m("shared_expert_gate.weight", 1, H), replace(target, quantization=None)))
        y = g.op.Add(y, g.op.Mul(shared, scale))
    return y


def decoder_layer(g: Graph, stream: ResidualStream, w: Weights, c: MoeConfig, i: int, past, lengths, rotary,
                  target: Target):
    """Qwen2Moe/Qwen3Moe/Mixtral/OlmoeDecoderLayer.forward: x + attn(norm(x)), then x + moe(norm(x))."""
    H, D = c.hidden_size, c.head_dim
    with g.scope("input_layernorm"):
        h = stream.norm(w("input_layernorm.weight", H))
    a = w.under("self_attn.")
    attention = attention_weights(a, c, c.qkv_bias, c.attention_bias, a if c.qk_norm == "head" else None)
    if c.qk_norm == "whole":  # OlmoeAttention: RMSNorm over the whole q and k projections
        attention = replace(attention, q_norm=a("q_norm.weight", c.num_attention_heads * D),
                            k_norm=a("k_norm.weight", c.num_key_value_heads * D))
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, D, window=c.window(i), norm_eps=c.rms_norm_eps,
                         qk_norm_whole=c.qk_norm == "whole")
    with g.scope("self_attn"):
        h, key, value = self_attention(g, h, past, lengths, rotary, attention, spec, target)
    stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = stream.norm(w("post_attention_layernorm.weight", H))
    with g.scope(c.moe):
        stream.add(mlp(g, h, w.under(c.moe + "."), c, i, target))
    return key, value


def build(g: Graph, io: DecoderIO, ckpt: Checkpoint, c: MoeConfig, target: Target):
    rope = Rope.from_parameters(c.rope_parameters, c.head_dim, c.max_position_embeddings)
    rotary = rotary_tables(g, rope, c.max_position_embeddings, target)
    return rms_norm_decoder(g, io, ckpt, c, target, decoder_layer, rotary)


__all__ = ["IGNORED", "STRUCTURE", "VARIANTS", "MoeConfig", "build", "decoder_layer", "mlp", "parse_config"]
