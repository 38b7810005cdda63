"""Qwen3.5-MoE's text decoder and Qwen3-Next: Qwen3.5's gated DeltaNet and gated attention layers,
each followed by a sparse mixture of SwiGLU experts with a gated shared expert.

Reference: transformers/models/{qwen3_5_moe,qwen3_next}/modeling_*.py. The attention and DeltaNet
layers, their norms and their state contract are Qwen3.5's (architectures/qwen3_5.py). The MLP is
the sparse block: a softmax router `mlp.gate.weight` (a bare [E, H] parameter), the top k
renormalized (always in Qwen3.5-MoE, by `norm_topk_prob` in Qwen3-Next), the experts as per-expert
Linears (`experts.{e}.gate_proj`, as the hub and save_pretrained store them) or stacked
(`experts.gate_up_proj` [E, 2I, H], `experts.down_proj` [E, H, I]), plus
sigmoid(shared_expert_gate(x)) · shared_expert(x). Qwen3.5-MoE has no dense layers; Qwen3-Next's
are those in `mlp_only_layers` or off `decoder_sparse_step` (an `intermediate_size` SwiGLU), and its
DeltaNet reads fused in_proj_qkvz / in_proj_ba (FusedDeltaNetWeights).
onnxruntime-genai 0.18 runs both as its `qwen3_5_moe_text` type.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import onnx_ir as ir

from architectures import qwen3_5
from architectures.moe import dense_mlp, expert_matrices
from builder.architecture import Weights
from builder.blocks import linear, sparse_moe
from builder.blocks.gated_deltanet import DeltaHeads
from builder.family import Decoder, Family, parse, register
from builder.hf_config import text_config
from builder.lazy import Weight

# Qwen3_5MoeTextConfig's defaults where they differ from the shared ones.
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen3_5MoeForCausalLM": dict(
        model_type="qwen3_5_moe_text", vocab_size=248320, hidden_size=2048, num_hidden_layers=40,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256, max_position_embeddings=32768,
        bos_token_id=None, eos_token_id=None, partial_rotary_factor=0.25,
    ),
}
# The hub's checkpoints: the text decoder under model.language_model.*, its settings under text_config.
VARIANTS["Qwen3_5MoeForConditionalGeneration"] = VARIANTS["Qwen3_5MoeForCausalLM"]
VARIANTS["Qwen3NextForCausalLM"] = dict(
    VARIANTS["Qwen3_5MoeForCausalLM"], vocab_size=151936, num_hidden_layers=48, intermediate_size=5632,
    num_experts=512, num_experts_per_tok=10,
)

# What each modeling file fixes. Qwen3.5-MoE: every layer sparse, the top k always renormalized (its
# config has no decoder_sparse_step, mlp_only_layers, norm_topk_prob). Qwen3-Next: the DeltaNet's
# projections fused per key head; genai 0.18 has no qwen3_next type and runs it as Qwen3.5-MoE (the
# same layers and states; text positions make Qwen3.5's M-RoPE Qwen3-Next's partial rotary).
QWEN3_5_MOE = dict(decoder_sparse_step=1, mlp_only_layers=None, norm_topk_prob=True)
STRUCTURE: dict[str, dict[str, Any]] = {
    "Qwen3_5MoeForCausalLM": QWEN3_5_MOE,
    "Qwen3_5MoeForConditionalGeneration": QWEN3_5_MOE,
    "Qwen3NextForCausalLM": dict(model_type="qwen3_5_moe_text", fused_projections=True),
}


@dataclass(frozen=True)
class Qwen3_5MoeConfig(qwen3_5.Qwen3_5Config):
    """config.json of Qwen3.5-MoE's text decoder: Qwen3.5's keys and the experts'."""

    num_experts: int = 256
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 512
    shared_expert_intermediate_size: int = 512
    decoder_sparse_step: int = 1  # Qwen3-Next's: dense layers off the step or in mlp_only_layers
    mlp_only_layers: list[int] | None = None
    norm_topk_prob: bool = True
    fused_projections: bool = False  # Qwen3-Next's in_proj_qkvz / in_proj_ba (structure, not a key)

    def __post_init__(self) -> None:
        if not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} of {self.num_experts} experts")
        super().__post_init__()

    def sparse(self, layer: int) -> bool:
        """Qwen3NextDecoderLayer: experts unless listed dense or off the sparse step."""
        dense = layer in (self.mlp_only_layers or ()) or (layer + 1) % self.decoder_sparse_step
        return not dense and self.num_experts > 0


class FusedDeltaNetWeights:
    """A Qwen3-Next DeltaNet's weights under Qwen3.5's names: in_proj_qkvz holds, per key head, its
    query, key, the values of its value heads and their z rows; in_proj_ba per key head its value
    heads' b, then their a. Split and regrouped here (q, k, v of all heads: the conv's channel
    order), the rest read as stored."""

    def __init__(self, w: Weights, heads: DeltaHeads, hidden: int):
        self.w, self.heads, self.hidden = w, heads, hidden

    def _per_key_head(self, name: str, width: int, parts: tuple[tuple[int, int], ...]) -> Weight:
        """Rows [start, start + size) of each key head's `width` rows, for each (start, size) in `parts`."""
        fused = self.w(name, self.heads.key_heads * width, self.hidden)
        return Weight.concat([fused.slice(0, j * width + start, j * width + start + size)
                              for start, size in parts for j in range(self.heads.key_heads)])

    def __call__(self, name: str, *shape: int) -> Weight:
        h = self.heads
        Dk, per = h.key_dim, h.value_heads // h.key_heads
        Dv = per * h.value_dim  # one key head's share of the value rows
        qkvz, ba = 2 * Dk + 2 * Dv, 2 * per
        split = {
            "in_proj_qkv.weight": ("in_proj_qkvz.weight", qkvz, ((0, Dk), (Dk, Dk), (2 * Dk, Dv))),
            "in_proj_z.weight": ("in_proj_qkvz.weight", qkvz, ((2 * Dk + Dv, Dv),)),
            "in_proj_b.weight": ("in_proj_ba.weight", ba, ((0, per),)),
            "in_proj_a.weight": ("in_proj_ba.weight", ba, ((per, per),)),
        }
        return self._per_key_head(*split[name]) if name in split else self.w(name, *shape)


def parse_config(family: Family, raw: dict[str, Any], architecture: str) -> Qwen3_5MoeConfig:
    """The config of `architecture`: config.json's, or the multimodal one's `text_config`."""
    if architecture == "Qwen3_5MoeForConditionalGeneration":
        raw = {**text_config(raw, "text_config"), "architectures": [architecture]}
    return parse(family, raw, architecture)


def sparse_block(d: Decoder, h: ir.Value, m: qwen3_5.Qwen3_5Weights) -> ir.Value:
    """Qwen3_5Moe/Qwen3NextSparseMoeBlock.forward: the routed experts plus the sigmoid-gated shared expert."""
    g, c = d.g, d.c
    H, E = c.hidden_size, c.num_experts
    gate, up, down = expert_matrices(m, E, H, c.moe_intermediate_size)
    y = sparse_moe(g, h, m("gate.weight", E, H), gate, up, down, c.num_experts_per_tok, c.norm_topk_prob,
                   c.hidden_act, d.target)
    with g.scope("shared_expert"):
        shared = dense_mlp(d, h, m.under("shared_expert."), c.shared_expert_intermediate_size)
    with g.scope("shared_expert_gate"):  # a [1, H] gate, kept in float like the router
        scale = g.op.Sigmoid(linear(g, h, m("shared_expert_gate.weight", 1, H), replace(d.target, quantization=None)))
    return g.op.Add(y, g.op.Mul(shared, scale))


def decoder_layer(d: Decoder, w: qwen3_5.Qwen3_5Weights, i: int):
    """Qwen3_5Moe/Qwen3NextDecoderLayer.forward; returns the layer's present state: (key, value), or
    (conv, recurrent)."""
    g, H = d.g, d.c.hidden_size
    with g.scope("input_layernorm"):
        h = d.stream.norm(w.norm("input_layernorm.weight", H))
    if d.c.layer_types[i] == qwen3_5.LINEAR:
        a = w.under("linear_attn.")
        if d.c.fused_projections:
            a = FusedDeltaNetWeights(a, d.c.heads, H)
        with g.scope("linear_attn"):
            h, conv, recurrent = qwen3_5.gated_deltanet(d, a, i, h)
        state = (conv, recurrent)
    else:
        with g.scope("self_attn"):
            h, state = qwen3_5.attention(d, w.under("self_attn."), i, h)
    d.stream.add(h)
    with g.scope("post_attention_layernorm"):
        h = d.stream.norm(w.norm("post_attention_layernorm.weight", H))
    with g.scope("mlp"):
        m = w.under("mlp.")
        d.stream.add(sparse_block(d, h, m) if d.c.sparse(i) else dense_mlp(d, h, m, d.c.intermediate_size))
    return state


FAMILY = register(qwen3_5.FAMILY.with_(
    name="qwen3_5_moe", config=Qwen3_5MoeConfig, layer=decoder_layer, variants=VARIANTS, structure=STRUCTURE,
    parser=parse_config,
))

__all__ = ["FAMILY", "VARIANTS", "Qwen3_5MoeConfig", "decoder_layer", "sparse_block"]
