"""GLM-4.5 / GLM-4.6 / GLM-4.5-Air (Glm4MoeForCausalLM): a pre-norm decoder with sparse SwiGLU experts.

Reference: transformers/models/glm4_moe/modeling_glm4_moe.py. Llama's layer with:
- q/k/v biases (`attention_bias`; o_proj never has one), optional per-head q/k RMSNorm
  (`use_qk_norm`), and a partial rotary (`partial_rotary_factor`, 0.5 unless given) on the first
  dims of each head in rotate_half halves (not GLM-4's interleaved pairs); `head_dim` is its own
  key (GLM-4.5: 96 heads of 128 on a hidden size of 5120);
- layers below `first_k_dense_replace` keep a dense MLP (intermediate_size); the others a router
  (Glm4MoeTopkRouter: sigmoid scores, a correction bias, grouped top-k; builder/blocks/moe.py
  grouped_sigmoid_router) feeding ONNX Runtime's MoE/QMoE with the chosen experts and weights
  (routed_experts), plus `n_shared_experts` shared experts as one dense MLP, added;
- the multi-token-prediction layers the hub checkpoints carry after the last decoder layer
  (`model.layers.{num_hidden_layers + j}.*`, j < num_nextn_predict_layers) are no part of the
  decoder (transformers skips them too); the first is built as the draft head mtp.onnx
  (builder/draft_head.py's nextn_head: enorm, hnorm, eh_proj, the layer, shared_head.norm),
  unless --no-mtp.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from architectures.moe import dense_mlp, expert_matrices, pre_norm_layer
from builder.architecture import Weights, attention_weights
from builder.blocks import AttentionSpec
from builder.blocks.moe import grouped_sigmoid_router, routed_experts
from builder.decoder_config import DecoderConfig
from builder.draft_head import nextn_head
from builder.family import Decoder, Family, ModelType, register

VARIANTS: dict[str, dict[str, Any]] = {
    "Glm4MoeForCausalLM": dict(model_type="glm4_moe", vocab_size=151552, intermediate_size=10944,
                               num_hidden_layers=46, num_attention_heads=96, num_key_value_heads=8,
                               max_position_embeddings=131072, rms_norm_eps=1e-5, bos_token_id=None,
                               eos_token_id=None, partial_rotary_factor=0.5),
    # The hub's model types transformers builds as Glm4MoeForCausalLM (MODEL_TYPES below), each
    # with its config class's defaults (SarvamMoEConfig, Param2MoeConfig: the whole head rotates).
    "SarvamMoEForCausalLM": dict(
        model_type="sarvam_moe", vocab_size=262144, intermediate_size=8192, num_hidden_layers=19,
        num_attention_heads=64, num_key_value_heads=4, head_dim=64, rms_norm_eps=1e-6, default_theta=8_000_000.0,
        partial_rotary_factor=1.0, moe_intermediate_size=1024, num_experts_per_tok=6, routed_scaling_factor=2.5,
        use_qk_norm=True, bos_token_id=None, eos_token_id=1, pad_token_id=0, num_nextn_predict_layers=0,
        max_position_embeddings=131072,
    ),
    "Param2MoeForCausalLM": dict(
        model_type="param2moe", vocab_size=128000, hidden_size=2048, intermediate_size=9216, num_hidden_layers=21,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=32768, rms_norm_eps=1e-6,
        tie_word_embeddings=True, default_theta=500_000.0, partial_rotary_factor=1.0, moe_intermediate_size=2048,
        num_experts_per_tok=6, n_shared_experts=2, n_routed_experts=64, routed_scaling_factor=2.5, use_qk_norm=True,
        bos_token_id=None, eos_token_id=3, pad_token_id=0, num_nextn_predict_layers=0,
    ),
}

# onnxruntime-genai 0.18 knows no glm4_moe; "chatglm" is the GLM family's type there, whose decoder
# contract is Llama's (same inputs, outputs and KV cache layout). No sliding window in the modeling file.
STRUCTURE: dict[str, dict[str, Any]] = {
    "Glm4MoeForCausalLM": dict(model_type="chatglm", sliding_window=None, layer_types=None),
    "SarvamMoEForCausalLM": dict(model_type="chatglm", sliding_window=None, layer_types=None),
    "Param2MoeForCausalLM": dict(model_type="chatglm", sliding_window=None, layer_types=None),
}


@dataclass(frozen=True)
class Glm4MoeConfig(DecoderConfig):
    """config.json of Glm4MoeForCausalLM: the shared decoder keys, the experts' and the router's."""

    use_qk_norm: bool = False
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 8
    n_shared_experts: int = 1
    n_routed_experts: int = 128
    num_local_experts: int | None = None  # transformers' alias of n_routed_experts
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    first_k_dense_replace: int = 1
    norm_topk_prob: bool = True
    num_nextn_predict_layers: int = 1

    def __post_init__(self) -> None:
        if self.num_local_experts is not None:
            object.__setattr__(self, "n_routed_experts", self.num_local_experts)
        E, G = self.n_routed_experts, self.n_group
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act {self.hidden_act!r}: the experts run as SwiGLU (silu) only")
        if G < 1 or E % G or not 1 <= self.topk_group <= G:
            raise ValueError(f"{E} experts in n_group={G} groups, topk_group={self.topk_group} of them: "
                             "the groups must split the experts evenly and topk_group be 1 to n_group")
        if G > 1 and E // G < 2:  # each group is scored by its two best experts
            raise ValueError(f"n_group={G} leaves {E // G} expert per group; the group score needs two")
        if not 1 <= self.num_experts_per_tok <= self.topk_group * (E // G):
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} of the "
                             f"{self.topk_group * (E // G)} experts the chosen groups hold")
        super().__post_init__()

    def sparse(self, layer: int) -> bool:
        """Glm4MoeDecoderLayer.__init__: experts from layer first_k_dense_replace on."""
        return layer >= self.first_k_dense_replace


def sigmoid_router(d: Decoder, h, m: Weights):
    """Glm4MoeTopkRouter (`gate`), in float32 as transformers runs it: (logits, index, weight)."""
    c = d.c
    E, H = c.n_routed_experts, c.hidden_size
    return grouped_sigmoid_router(d.g, h, m("gate.weight", E, H), m("gate.e_score_correction_bias", E),
                                  c.num_experts_per_tok, c.n_group, c.topk_group, c.norm_topk_prob,
                                  c.routed_scaling_factor, d.target)


def moe_block(d: Decoder, h, m: Weights, router=sigmoid_router):
    """Glm4MoeMoE.forward: the routed experts plus the shared experts; `router(d, h, m)` gives
    (logits, index, weight) under the `gate` scope (DeepSeek-V2's is a softmax)."""
    g, c = d.g, d.c
    with g.scope("gate"):
        logits, index, weight = router(d, h, m)
    y = routed_experts(g, h, logits, index, weight, c.num_experts_per_tok, *expert_matrices(m, c.n_routed_experts, c.hidden_size, c.moe_intermediate_size), d.target)
    if c.n_shared_experts == 0:  # transformers still makes (and saves) the zero-wide MLP: nothing to add
        for name in ("gate_proj", "up_proj", "down_proj"):
            if f"{m.prefix}shared_experts.{name}.weight" in m.ckpt:
                m.ckpt.consume(f"{m.prefix}shared_experts.{name}.weight")
        return y
    with g.scope("shared_experts"):
        return g.op.Add(y, dense_mlp(d, h, m.under("shared_experts."), c.moe_intermediate_size * c.n_shared_experts))


def layer_with(attention):
    """Glm4MoeDecoderLayer's layer (x + attn(norm(x)), then x + experts or the dense MLP of norm(x))
    with another attention: `attention(d, weights under self_attn., i, h)` -> (output, present key,
    present value) (MiniCPM5-MoE's gated one, MiMo-V2-Flash's)."""
    def decoder_layer(d: Decoder, w: Weights, i: int):
        c, m = d.c, w.under("mlp.")
        return pre_norm_layer(d, w, i, None, None,
                              lambda h: moe_block(d, h, m) if c.sparse(i) else dense_mlp(d, h, m, c.intermediate_size),
                              attend=lambda h: attention(d, w.under("self_attn."), i, h))

    return decoder_layer


def decoder_layer(d: Decoder, w: Weights, i: int):
    """Glm4MoeDecoderLayer.forward: x + attn(norm(x)), then x + mlp(norm(x)); returns the layer's KV."""
    c, m, a = d.c, w.under("mlp."), w.under("self_attn.")
    attention = attention_weights(a, c, c.attention_bias, False, a if c.use_qk_norm else None)
    spec = AttentionSpec(c.num_attention_heads, c.num_key_value_heads, c.head_dim, norm_eps=c.rms_norm_eps)
    if c.sparse(i):
        return pre_norm_layer(d, w, i, attention, spec, lambda h: moe_block(d, h, m))
    return pre_norm_layer(d, w, i, attention, spec, lambda h: dense_mlp(d, h, m, c.intermediate_size))


def split_query_key_value(c: Glm4MoeConfig) -> tuple:
    """The rows of a fused `query_key_value` (weight and bias): the queries', the keys', the values'."""
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    return ((r"\.query_key_value\.", ((".q_proj.", q), (".k_proj.", kv), (".v_proj.", kv))),)


# config.json's model_type -> the row transformers 5.25 builds as Glm4MoeForCausalLM, with its
# config class's attribute_map and its conversion rules (conversion_mapping.py: sarvam_moe, which
# param2moe copies): Ling-style names, the fused query_key_value split by the heads' sizes.
SARVAM = ModelType(
    "SarvamMoEForCausalLM",
    keys={"num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts", "use_qkv_bias": "attention_bias",
          "num_mtp_layers": "num_nextn_predict_layers"},
    renames=((r"^model\.word_embeddings\.", "model.embed_tokens."), (r"\.attention\.", ".self_attn."),
             (r"\.self_attn\.dense\.", ".self_attn.o_proj."), (r"\.self_attn\.query_layernorm\.", ".self_attn.q_norm."),
             (r"\.self_attn\.key_layernorm\.", ".self_attn.k_norm."),
             (r"\.mlp\.gate\.expert_bias", ".mlp.gate.e_score_correction_bias")),
    splits=split_query_key_value,
)
MODEL_TYPES: dict[str, ModelType] = {"sarvam_moe": SARVAM,
                                     "param2moe": dataclasses.replace(SARVAM, architecture="Param2MoeForCausalLM")}


def skip_next_token_layers(d: Decoder) -> None:
    """Marks the multi-token-prediction layers (model.layers.{num_hidden_layers + j}.*) as
    deliberately unused: what config.json counts (num_nextn_predict_layers), not any extra layer."""
    c = d.c
    prefixes = tuple(f"model.layers.{c.num_hidden_layers + j}." for j in range(c.num_nextn_predict_layers))
    for name in list(d.ckpt.tensors):
        if prefixes and name.startswith(prefixes):
            d.ckpt.consume(name)


def nextn_layer(c: Glm4MoeConfig, **changes: Any) -> Glm4MoeConfig:
    """The next-token-prediction module's decoder layer as layer 0 of a one-layer config: with
    experts where layer num_hidden_layers has them (it always has: it lies past first_k_dense_replace)."""
    return dataclasses.replace(c, num_hidden_layers=1, layer_types=["full_attention"], num_nextn_predict_layers=0,
                               first_k_dense_replace=0 if c.sparse(c.num_hidden_layers) else 1, **changes)


# model.layers.{num_hidden_layers}: the next-token-prediction module, built as mtp.onnx (--no-mtp: left out).
FAMILY = register(Family(
    "glm4_moe", Glm4MoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, prepare=skip_next_token_layers,
    partial_rotary=True, model_types=MODEL_TYPES,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",), mtp=nextn_head(nextn_layer),
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "Glm4MoeConfig", "decoder_layer", "layer_with", "moe_block",
           "nextn_layer"]
