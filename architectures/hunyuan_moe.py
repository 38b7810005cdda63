"""HunYuan MoE (HunYuanMoEV1ForCausalLM: Hunyuan-A13B).

Reference: transformers/models/hunyuan_v1_moe/modeling_hunyuan_v1_moe.py. HunYuan dense's decoder
(architectures/hunyuan.py: per-head q/k RMSNorm after an explicit rotary, the NTK-alpha base, genai
type `hunyuandensev1`) with every layer's MLP HunYuanMoEV1Moe instead:
- the router `gate.wg`: softmax over all `num_experts`, the top `moe_topk` (one number, or one per
  layer), always renormalized: ONNX Runtime's MoE/QMoE router (builder/blocks/moe.py sparse_moe);
- the experts SwiGLU of width intermediate_size (each its own Linear on the hub, or transformers 5's
  stacked gate_up_proj / down_proj: moe.expert_matrices);
- `shared_mlp`, a SwiGLU of the same width on every token, added without a gate.

The hub's config.json also carries keys of the checkpoint's original code that transformers ignores
(moe_intermediate_size, num_shared_expert, use_mixed_mlp_moe, use_cla): a value that would make
that code differ from transformers' is refused, not built as something else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from architectures.hunyuan import GENAI_MODEL_TYPE, HunYuanDenseConfig, attention, rotary
from architectures.moe import dense_mlp, expert_matrices, pre_norm_layer
from builder.architecture import Weights
from builder.blocks import sparse_moe
from builder.family import Decoder, Family, register

VARIANTS: dict[str, dict[str, Any]] = {"HunYuanMoEV1ForCausalLM": {}}

# genai 0.18 knows no HunYuan MoE type; its dense one's decoder contract is this model's (Llama's inputs,
# outputs and KV cache: the experts live inside the graph). No sliding window in the modeling file.
STRUCTURE: dict[str, dict[str, Any]] = {"HunYuanMoEV1ForCausalLM": dict(model_type=GENAI_MODEL_TYPE,
                                                                        sliding_window=None)}


def _each(value: int | list[int] | None) -> set[int]:
    return set(value) if isinstance(value, list) else {value}


@dataclass(frozen=True)
class HunYuanMoeConfig(HunYuanDenseConfig):
    """config.json of HunYuanMoEV1ForCausalLM (HunYuanMoEV1Config's defaults, HunYuan dense's rope)."""

    num_experts: int = 1
    num_local_experts: int | None = None  # transformers' alias of num_experts
    moe_topk: int | list[int] = 1
    num_experts_per_tok: int | list[int] | None = None  # transformers' alias of moe_topk
    # The original code's keys (transformers ignores them): checked, see the module's docstring.
    moe_intermediate_size: int | list[int] | None = None
    num_shared_expert: int | list[int] | None = None
    use_mixed_mlp_moe: bool = True
    use_cla: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.num_local_experts is not None:
            set_(self, "num_experts", self.num_local_experts)
        if self.num_experts_per_tok is not None:
            set_(self, "moe_topk", self.num_experts_per_tok)
        super().__post_init__()
        n, E, I = self.num_hidden_layers, self.num_experts, self.intermediate_size
        if self.num_experts < 1:
            raise ValueError(f"num_experts is {E}; expected at least 1")
        if isinstance(self.moe_topk, list) and len(self.moe_topk) < n:
            raise ValueError(f"moe_topk has {len(self.moe_topk)} entries for {n} layers")
        if not all(1 <= self.top_k(i) <= E for i in range(n)):
            raise ValueError(f"moe_topk {self.moe_topk}: each layer picks 1 to num_experts ({E}) experts")
        if self.moe_intermediate_size is not None and _each(self.moe_intermediate_size) != {I}:
            raise ValueError(f"moe_intermediate_size {self.moe_intermediate_size}: transformers' experts are "
                             f"intermediate_size ({I}) wide")
        if self.num_shared_expert is not None and _each(self.num_shared_expert) != {1}:
            raise ValueError(f"num_shared_expert {self.num_shared_expert}: transformers' shared MLP is one expert")
        if not self.use_mixed_mlp_moe:
            raise ValueError("use_mixed_mlp_moe false: transformers always adds the shared MLP")
        if self.use_cla:
            raise ValueError("use_cla (cross-layer attention) is not supported: transformers ignores it")

    def top_k(self, layer: int) -> int:
        """HunYuanMoEV1Gate: the layer's experts per token."""
        return self.moe_topk[layer] if isinstance(self.moe_topk, list) else self.moe_topk


def moe_block(d: Decoder, h, m: Weights, i: int):
    """HunYuanMoEV1Moe.forward: the routed experts plus the shared MLP."""
    g, c = d.g, d.c
    E, H, I = c.num_experts, c.hidden_size, c.intermediate_size
    with g.scope("shared_mlp"):
        shared = dense_mlp(d, h, m.under("shared_mlp."), I)
    y = sparse_moe(g, h, m("gate.wg.weight", E, H), *expert_matrices(m, E, H, I), c.top_k(i), True, c.hidden_act,
                   d.target)
    return g.op.Add(y, shared)


def decoder_layer(d: Decoder, w: Weights, i: int):
    """HunYuanMoEV1DecoderLayer.forward: x + attn(norm(x)), then x + moe(norm(x))."""
    return pre_norm_layer(d, w, i, *attention(d, w), lambda h: moe_block(d, h, w.under("mlp."), i))


FAMILY = register(Family(
    "hunyuan_moe", HunYuanMoeConfig, decoder_layer, VARIANTS, structure=STRUCTURE, rotary=rotary,
    ignored=("model.layers.*.self_attn.rotary_emb.inv_freq",),
    partial_rotary=True,  # HunYuanDenseConfig.rope reads it (its NTK-alpha rope ignores it)
))

__all__ = ["FAMILY", "STRUCTURE", "VARIANTS", "HunYuanMoeConfig", "decoder_layer", "moe_block"]
