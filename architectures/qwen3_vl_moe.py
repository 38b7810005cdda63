"""The text decoder of Qwen3-VL-MoE (Qwen3VLMoeForConditionalGeneration, the A3B/A22B models):
Qwen3-VL's decoder (architectures/qwen3_vl.py: interleaved M-RoPE, DeepStack) with Qwen3-MoE's
sparse block (architectures/moe.py) in place of the dense MLP.

Reference: transformers/models/qwen3_vl_moe/modeling_qwen3_vl_moe.py. The router always
renormalizes its top k (Qwen3VLMoeTextTopKRouter); the experts are stored stacked: as x · W on the
hub ([E, H, 2I] gate_up_proj, gate columns first, and [E, I, H] down_proj), which transformers
transposes when it loads, or as transformers 5 saves them ([E, 2I, H], [E, H, I]). As in
transformers, a stored shape that is already the model's is read as it is (a square one too).
The vision tower and the package are Qwen3-VL's.
"""

from __future__ import annotations

from typing import Any

from architectures import qwen2_5_vl, qwen3_vl
from architectures.moe import MoeConfig, dense_mlp, decoder_layer as moe_layer
from builder.architecture import Weights
from builder.blocks import sparse_moe
from builder.blocks.moe import unstacked
from builder.family import Decoder, Family, register

__all__ = ["FAMILY", "VARIANTS"]

# Qwen3VLMoeTextConfig's defaults where they differ from the shared decoder's.
VARIANTS: dict[str, dict[str, Any]] = {
    "Qwen3VLMoeForConditionalGeneration": dict(
        model_type="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24,
        num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=128000, rms_norm_eps=1e-6,
        moe_intermediate_size=1408, num_experts_per_tok=4, num_experts=60,
        bos_token_id=None, eos_token_id=None, default_theta=500_000.0,
    ),
}
STRUCTURE = {"Qwen3VLMoeForConditionalGeneration": dict(
    model_type="qwen3", qk_norm="head", qkv_bias=False, norm_topk_prob=True, max_window_layers=None)}


def stacked(m: Weights, name: str, experts: int, rows: int, cols: int):
    """The stacked expert tensor `name` as a function of a row range -> E [stop − start, cols]
    matrices: stored [E, rows, cols] (transformers' own) or [E, cols, rows] (the hub's x · W)."""
    shape = tuple(m.ckpt.info(m.prefix + name).shape)
    transposed = shape != (experts, rows, cols)
    w = m(name, *((experts, cols, rows) if transposed else (experts, rows, cols)))
    return lambda start=0, stop=rows: unstacked(w, start, stop, transposed=transposed)


def mlp(d: Decoder, h, m: Weights, i: int):
    """Qwen3VLMoeTextSparseMoeBlock (softmax, top k renormalized, SwiGLU experts), or a dense layer's MLP."""
    c = d.c
    H, E, I = c.hidden_size, c.num_experts, c.moe_intermediate_size
    if not c.sparse(i):
        return dense_mlp(d, h, m, c.intermediate_size)
    gate_up, down = stacked(m, "experts.gate_up_proj", E, 2 * I, H), stacked(m, "experts.down_proj", E, H, I)
    gate, up = gate_up(0, I), gate_up(I, 2 * I)
    return sparse_moe(d.g, h, m("gate.weight", E, H), gate, up, down(), c.num_experts_per_tok, True, c.hidden_act,
                      d.target)


def layer(d: Decoder, w: Weights, i: int):
    """Qwen3VLMoeTextDecoderLayer, then layer i's DeepStack features added to the stream."""
    presents = moe_layer(d, w, i, mlp)
    qwen3_vl.add_deepstack(d, i)
    return presents


FAMILY = register(Family(
    "qwen3_vl_moe", MoeConfig, layer, VARIANTS, structure=STRUCTURE,
    parser=qwen2_5_vl.vl_parser([24, 20, 20], interleaved=True, text_ties=False),
    rotary=qwen2_5_vl.mrope, embed=qwen3_vl.embed,
    prefix=qwen2_5_vl.decoder_prefix,
    ignored=("visual.*", "model.visual.*"),
))
