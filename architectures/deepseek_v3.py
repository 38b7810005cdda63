"""DeepSeek-V3 / R1 and Kimi K2 (DeepseekV3ForCausalLM), DeepSeek-V2 (DeepseekV2ForCausalLM):
multi-head latent attention with a mixture of experts.

Reference: transformers/models/deepseek_v3/modeling_deepseek_v3.py. The attention (MLA) compresses
the keys and values of a token into one latent c = kv_a_layernorm(kv_a_proj_with_mqa(x)[:rank])
(kv_lora_rank wide) and one rotary key k_pe (qk_rope_head_dim wide, shared by the heads); per head
kv_b_proj expands c into k_nope and v. The query is q_proj(x), or q_b_proj(q_a_layernorm(q_a_proj(x)))
with q_lora_rank, per head [q_nope | q_pe]. Scores are q_nope·k_nope + q_pe·k_pe after the rotary
(on pairs (x0, x1), (x2, x3), … with rope_interleave), times qk_head_dim^-0.5 and, with YaRN, the
square of its mscale(factor, mscale_all_dim).

The cache keeps the latent, not the per-head keys and values ("absorbed" MLA, as DeepSeek's own
inference code does): q_nope·k_nope = (W_UKᵀ q_nope)·c with W_UK the head's k_nope rows of kv_b_proj,
so each head's query becomes [q_pe | W_UKᵀ q_nope] (rope + rank wide) against one shared key
[k_pe | c]: GroupQueryAttention with one KV head of head size rope + rank, its fused rotary on the
first qk_rope_head_dim of each head. The value is that same key (its c part is what the heads
average; the k_pe part of the output is dropped), and each head's output (its last rank entries)
goes through W_UV, the head's v rows of kv_b_proj, then o_proj. A token's cache is 2·(rank + rope)
values per layer (1,152 for V3) instead of 2·heads·(192) decompressed (49,152): 43× smaller, the
same scores to rounding. kv_b_proj's two halves are per-head batched MatMuls and stay float in
int4 (MatMulNBits has no batch of weights).

Layers below first_k_dense_replace have a dense SwiGLU; the others GLM-4.5's sparse block
(architectures/glm4_moe.py: sigmoid router with e_score_correction_bias and groups, routed
experts, shared experts). DeepSeek-V2 (modeling_deepseek_v2.py) is the same attention, its
rotary always on interleaved pairs (a complex product), with a softmax router: the top k of p
("greedy", or within the topk_group groups of largest max p: "group_limited_greedy"), weighted by
p times routed_scaling_factor, not renormalized (builder.blocks.moe.grouped_softmax_router). The next-token-prediction
module past num_hidden_layers (model.layers.{num_hidden_layers}: enorm, hnorm, eh_proj, a decoder layer,
shared_head.norm) is built as the draft head mtp.onnx (builder/draft_head.py), unless --no-mtp.
onnxruntime-genai 0.18 knows no deepseek_v3: its cache is an ordinary one-KV-head cache, so genai
runs it as "llama" (head_size rope + rank, one KV head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from architectures.glm4_moe import Glm4MoeConfig, moe_block, nextn_layer, sigmoid_router, skip_next_token_layers
from architectures.moe import dense_mlp
from builder.architecture import Weights
from builder.blocks import AttentionSpec, Rope, rotary_tables
from builder.blocks.rope import ExplicitRotary
from builder.blocks.attention import group_query_attention
from builder.blocks.linear import linear
from builder.blocks.moe import grouped_softmax_router
from builder.blocks.norm import rms_norm
from builder.draft_head import nextn_head
from builder.family import Decoder, Family, ModelType, normed_attention, register

VARIANTS: dict[str, dict[str, Any]] = {
    "DeepseekV3ForCausalLM": dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432, num_hidden_layers=61,
        num_attention_heads=128, max_position_embeddings=4096, bos_token_id=0, eos_token_id=1,
        moe_intermediate_size=2048, n_routed_experts=256, routed_scaling_factor=2.5, n_group=8, topk_group=4,
        num_experts_per_tok=8, first_k_dense_replace=3, num_nextn_predict_layers=1,
    ),
    "DeepseekV2ForCausalLM": dict(
        model_type="deepseek_v2", vocab_size=102400, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
        num_attention_heads=32, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
        moe_intermediate_size=1407, n_routed_experts=64, n_shared_experts=2, routed_scaling_factor=1.0,
        first_k_dense_replace=0, topk_method="greedy", n_group=None, topk_group=None,
    ),
}
# genai 0.18 has no deepseek_v2/v3 type; the latent cache is a plain one-head KV cache to it.
# DeepSeek-V2's modeling file rotates interleaved pairs always, ignores norm_topk_prob and has no
# next-token layers.
# config.json's model_type sarvam_mla (sarvamai/sarvam-105b) -> the row transformers 5.25 builds as
# DeepseekV3ForCausalLM: SarvamMLAConfig's defaults, its attribute_map; the tensors are DeepSeek's.
VARIANTS["SarvamMLAForCausalLM"] = {
    **VARIANTS["DeepseekV3ForCausalLM"], "model_type": "sarvam_mla", "vocab_size": 262144, "hidden_size": 4096,
    "intermediate_size": 16384, "num_hidden_layers": 32, "num_attention_heads": 64, "num_key_value_heads": 64,
    "n_routed_experts": 128, "q_lora_rank": None, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
    "num_nextn_predict_layers": 0,
}
MODEL_TYPES: dict[str, ModelType] = {"sarvam_mla": ModelType("SarvamMLAForCausalLM", keys={
    "num_experts": "n_routed_experts", "num_shared_experts": "n_shared_experts", "num_mtp_layers": "num_nextn_predict_layers",
})}
STRUCTURE: dict[str, dict[str, Any]] = {
    "DeepseekV3ForCausalLM": dict(model_type="llama", sliding_window=None, topk_method="noaux_tc"),
    "SarvamMLAForCausalLM": dict(model_type="llama", sliding_window=None, topk_method="noaux_tc"),
    "DeepseekV2ForCausalLM": dict(model_type="llama", sliding_window=None, rope_interleave=True,
                                  norm_topk_prob=False, num_nextn_predict_layers=0),
}


def latent_cache(c) -> None:
    """Checks what transformers' MLA needs of a config (DeepSeek-V3's, LongCat-Flash's) and sets the
    latent cache's shape in its place: one KV head of the rotated part and the rank."""
    if c.head_dim is not None and c.head_dim != c.qk_rope_head_dim:
        # transformers' rotary spans config.json's head_dim (DeepseekV3Config sets it to
        # qk_rope_head_dim only when absent): any other width fails in its forward.
        raise ValueError(f"head_dim {c.head_dim} is not qk_rope_head_dim ({c.qk_rope_head_dim}), the width "
                         "transformers rotates: it cannot run this config")
    if c.num_key_value_heads not in (None, c.num_attention_heads):
        # transformers' MLA repeats no KV heads: any other count fails its forward
        raise ValueError(f"num_key_value_heads {c.num_key_value_heads} is not num_attention_heads "
                         f"({c.num_attention_heads}), which transformers' MLA needs: it cannot run this config")
    object.__setattr__(c, "head_dim", c.qk_rope_head_dim + c.kv_lora_rank)
    object.__setattr__(c, "num_key_value_heads", 1)


@dataclass(frozen=True)
class DeepseekV3Config(Glm4MoeConfig):
    """config.json of DeepSeek-V3: GLM-4.5's expert keys (the router is the same) and MLA's.

    `head_dim` and `num_key_value_heads` become the latent cache's: rope + rank wide, one head (what
    genai_config.json and the cache inputs declare); the attention's own sizes are MLA's keys."""

    n_group: int | None = 1  # DeepSeek-V2's config.json may say null (one group)
    topk_group: int | None = 1
    topk_method: str = "noaux_tc"  # V3's sigmoid router whatever config.json says; V2: "greedy" or "group_limited_greedy"
    mlp_bias: bool = False
    kv_lora_rank: int = 512
    q_lora_rank: int | None = 1536
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 128
    v_head_dim: int = 128
    rope_interleave: bool = True

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.n_group is None:
            set_(self, "n_group", 1)
        if self.topk_group is None:
            set_(self, "topk_group", self.n_group)
        if self.topk_method not in ("noaux_tc", "greedy", "group_limited_greedy"):
            raise ValueError(f"topk_method {self.topk_method!r}: builder builds noaux_tc (V3), greedy and "
                             "group_limited_greedy (V2)")
        if self.mlp_bias:
            raise ValueError("mlp_bias: DeepSeek-V2 MLPs with biases are not built (no released checkpoint has them)")
        latent_cache(self)
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim {self.qk_rope_head_dim}: the rotary needs pairs")
        super().__post_init__()

    @property
    def softmax_scale(self) -> float:
        """qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)² (transformers' yarn_apply_mscale)."""
        scale = (self.qk_nope_head_dim + self.qk_rope_head_dim) ** -0.5
        rope = self.rope_parameters
        if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
            factor, m = rope["factor"], rope["mscale_all_dim"]
            mscale = 0.1 * m * np.log(factor) + 1.0 if factor > 1 else 1.0
            scale *= mscale * mscale
        return float(scale)


def latent_rotary(d: Decoder):
    """The rotary tables over qk_rope_head_dim (the query's and key's rotary part)."""
    c = d.c
    rope = Rope.from_parameters(c.rope_parameters, c.qk_rope_head_dim, c.max_position_embeddings)
    return rotary_tables(d.g, rope, c.max_position_embeddings, d.target,
                         head_size=c.qk_rope_head_dim + c.kv_lora_rank)  # the attention's head: [k_pe | latent]


def latent_attention(d: Decoder, a: Weights, i: int, h):
    """DeepseekV3Attention.forward, absorbed: returns (output after o_proj, present key, present value)."""
    g, c, target = d.g, d.c, d.target
    H, heads, rank, rope = c.hidden_size, c.num_attention_heads, c.kv_lora_rank, c.qk_rope_head_dim
    nope, v_dim, dtype = c.qk_nope_head_dim, c.v_head_dim, target.io_dtype
    qk = nope + rope
    if c.q_lora_rank is None:
        with g.scope("q_proj"):
            q = linear(g, h, a("q_proj.weight", heads * qk, H), target)
    else:
        with g.scope("q_a_proj"):
            q = linear(g, h, a("q_a_proj.weight", c.q_lora_rank, H), target,
                       a("q_a_proj.bias", c.q_lora_rank) if c.attention_bias else None)
        with g.scope("q_a_layernorm"):
            q = rms_norm(g, q, a("q_a_layernorm.weight", c.q_lora_rank), c.rms_norm_eps, target)
        with g.scope("q_b_proj"):
            q = linear(g, q, a("q_b_proj.weight", heads * qk, c.q_lora_rank), target)
    q = g.op.Reshape(q, g.constant([0, 0, heads, qk], "int64"))  # (B, S, heads·qk) -> (B, S, heads, qk)
    q_nope, q_pe = g.op.Split(q, g.constant([nope, rope], "int64"), axis=-1, _outputs=2)
    with g.scope("kv_a_proj_with_mqa"):
        kv = linear(g, h, a("kv_a_proj_with_mqa.weight", rank + rope, H), target,
                    a("kv_a_proj_with_mqa.bias", rank + rope) if c.attention_bias else None)
    latent, k_pe = g.op.Split(kv, g.constant([rank, rope], "int64"), axis=-1, _outputs=2)
    with g.scope("kv_a_layernorm"):
        latent = rms_norm(g, latent, a("kv_a_layernorm.weight", rank), c.rms_norm_eps, target)
    # kv_b_proj [heads·(nope + v), rank]: per head its k_nope rows (W_UK) then its v rows (W_UV).
    per_head = a("kv_b_proj.weight", heads * (nope + v_dim), rank).reshaped(heads, nope + v_dim, rank)
    with g.scope("kv_b_proj"):
        w_uk = g.weight("absorbed_k", per_head.slice(1, 0, nope).astype(dtype))  # (heads, nope, rank)
        w_uv = g.weight("absorbed_v", per_head.slice(1, nope, nope + v_dim).permuted(0, 2, 1).astype(dtype))
    with g.scope("absorb_q"):  # W_UKᵀ q_nope per head: (B, heads, S, nope) @ (heads, nope, rank)
        q_latent = g.op.MatMul(g.op.Transpose(q_nope, perm=[0, 2, 1, 3]), w_uk)  # (B, heads, S, rank)
        q_latent = g.op.Transpose(q_latent, perm=[0, 2, 1, 3])  # (B, S, heads, rank)
    rotary = d.rotary
    if isinstance(rotary, ExplicitRotary):  # a rotary width (or a provider) the fused rotary cannot take
        with g.scope("q_rotary"):
            q_pe = g.op.Reshape(q_pe, g.constant([0, 0, heads * rope], "int64"))  # (B, S, heads, rope) -> (B, S, heads·rope)
            q_pe = rotary.rotate(g, q_pe, heads, d.lengths.seqlens_k, c.rope_interleave)
            q_pe = g.op.Reshape(q_pe, g.constant([0, 0, heads, rope], "int64"))  # back to (B, S, heads, rope)
        with g.scope("k_rotary"):
            k_pe = rotary.rotate(g, k_pe, 1, d.lengths.seqlens_k, c.rope_interleave)  # (B, S, rope)
        rotary = None
    query = g.op.Reshape(g.op.Concat(q_pe, q_latent, axis=-1), g.constant([0, 0, heads * (rope + rank)], "int64"))
    key = g.op.Concat(k_pe, latent, axis=-1)  # (B, S, rope + rank): the one KV head
    spec = AttentionSpec(heads, 1, rope + rank, scale=c.softmax_scale, rotary_interleaved=c.rope_interleave)
    out, present_k, present_v = group_query_attention(g, (query, key, key), d.past(i), d.lengths, rotary, None,
                                                      spec, target)
    with g.scope("absorb_v"):  # each head's averaged latent through its W_UV
        out = g.op.Reshape(out, g.constant([0, 0, heads, rope + rank], "int64"))
        out = g.op.Slice(out, g.constant([rope], "int64"), g.constant([rope + rank], "int64"),
                         g.constant([3], "int64"))  # (B, S, heads, rank)
        out = g.op.MatMul(g.op.Transpose(out, perm=[0, 2, 1, 3]), w_uv)  # (B, heads, S, v)
        out = g.op.Reshape(g.op.Transpose(out, perm=[0, 2, 1, 3]), g.constant([0, 0, heads * v_dim], "int64"))
    with g.scope("o_proj"):
        out = linear(g, out, a("o_proj.weight", H, heads * v_dim), target,
                     a("o_proj.bias", H) if c.attention_bias else None)
    return out, present_k, present_v


def softmax_router(d: Decoder, h, m: Weights):
    """DeepseekV2TopkRouter (`gate`): (logits, index, weight) for routed_experts."""
    c = d.c
    return grouped_softmax_router(d.g, h, m("gate.weight", c.n_routed_experts, c.hidden_size), c.num_experts_per_tok,
                                  c.n_group, c.topk_group if c.topk_method == "group_limited_greedy" else c.n_group,
                                  c.routed_scaling_factor, d.target)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """DeepseekV3DecoderLayer.forward: x + mla(norm(x)), then x + mlp(norm(x)); returns the latent KV."""
    g, c = d.g, d.c
    H, m = c.hidden_size, w.under("mlp.")
    h, key, value = normed_attention(d, w, i, latent_attention)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w("post_attention_layernorm.weight", H))
    with g.scope("mlp"):
        router = sigmoid_router if c.topk_method == "noaux_tc" else softmax_router
        d.stream.add(moe_block(d, h, m, router) if c.sparse(i) else dense_mlp(d, h, m, c.intermediate_size))
    return key, value


def nextn_latent_layer(c: DeepseekV3Config) -> DeepseekV3Config:
    """GLM-4.5's next-token layer config (glm4_moe.nextn_layer) from MLA's own sizes, which the
    config's latent cache replaced (latent_cache runs again)."""
    return nextn_layer(c, head_dim=c.qk_rope_head_dim, num_key_value_heads=c.num_attention_heads)


FAMILY = register(Family(
    "deepseek_v3", DeepseekV3Config, decoder_layer, VARIANTS, structure=STRUCTURE, rotary=latent_rotary,
    prepare=skip_next_token_layers, ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",), model_types=MODEL_TYPES,
    mtp=nextn_head(nextn_latent_layer),  # model.layers.{num_hidden_layers}, built as mtp.onnx (--no-mtp: left out)
))

__all__ = ["FAMILY", "MODEL_TYPES", "STRUCTURE", "VARIANTS", "DeepseekV3Config", "decoder_layer"]
