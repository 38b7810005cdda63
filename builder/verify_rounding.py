"""The build's int4 / int8 rounding, applied to transformers' float weights so that --verify's
reference computes with the values the package holds (fake quantization with this package's
quantizer, proved bit-exact with ONNX Runtime's): the comparison then measures the graph, not the
expected quantization error.

Works on numpy views of the parameters, rounded in place: builder/verify.py walks transformers'
modules and hands their weights here. Which layers are rounded, and how, is the build's target
(its quantization and layer patterns), and for stacked experts what the built graph's QMoE nodes
hold; never the model's type.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from builder.blocks.moe import expert_block_size
from builder.quantize import dequantize, quantize
from builder.target import Quantization, Target

# Modules of an image-and-text checkpoint that its package keeps in float (the vision model).
FLOAT_TOWERS = ("vision_tower", "multi_modal_projector", "visual")

# The Linear modules of transformers' mixtures of experts that the build keeps in float, as every
# router (HunYuan's gate.wg, PhiMoE's router, Qwen2-MoE's shared-expert gate): not rounded here.
FLOAT_ROUTERS = (".mlp.gate", ".mlp.gate.wg", ".mlp.router", ".mlp.shared_expert_gate",
                 # a gated DeltaNet's per-head gate projections (Qwen3.5, Qwen3-Next): float in every
                 # build, as architectures/qwen3_5.py writes them (quantizing them moves the logits)
                 ".linear_attn.in_proj_a", ".linear_attn.in_proj_b", ".linear_attn.in_proj_ba",
                 # MLA's kv_b_proj, absorbed into per-head MatMuls (architectures/deepseek_v3.py): float
                 ".self_attn.kv_b_proj",
                 ".feed_forward.router")  # Llama 4's

# The per-layer token tables the build gathers from 8-bit symmetric blocks (Gemma 4's, gemma4.py).
PER_LAYER_TABLE = "embed_tokens_per_layer"

# com.microsoft QMoE's inputs fc1_zero_points and fc2_zero_points: absent where its experts are symmetric.
QMOE_ZERO_POINTS = slice(11, 13)


def graph_linears(name: str, rows: int) -> list[tuple[str, tuple[str, ...], slice]]:
    """The graph's linear layers a transformers Linear feeds: (module path, the checkpoint modules it
    is made of, its rows). q/k/v become one qkv_proj; Phi-3's gate_up_proj becomes gate_proj and
    up_proj; Phi's self_attn.dense is the graph's o_proj; a multimodal prefix is dropped."""
    module = graph_path(name)
    module = re.sub(r"\.self_attn\.dense$", ".self_attn.o_proj", module)  # Phi's attention output
    fused = re.match(r"(.*)\.(q|k|v)_proj$", name)
    if fused:
        parts = tuple(f"{fused.group(1)}.{p}_proj" for p in "qkv")
        return [(re.sub(r"\.(q|k|v)_proj$", ".qkv_proj", module), parts, slice(None))]
    if name.endswith(".gate_up_proj"):
        half = rows // 2
        return [(module[: -len("gate_up_proj")] + "gate_proj", (name,), slice(0, half)),
                (module[: -len("gate_up_proj")] + "up_proj", (name,), slice(half, rows))]
    return [(module, (name,), slice(None))]


def graph_path(name: str) -> str:
    """A transformers module's path in the graph: a multimodal checkpoint's text prefix dropped."""
    return name.replace("language_model.model.", "model.").replace("model.language_model.", "model.")


def in_float_tower(name: str) -> bool:
    return any(part in name for part in FLOAT_TOWERS)


def round_rows(rows: np.ndarray, bits: int, block_size: int, symmetric: bool, method: str) -> None:
    """dequantize(quantize(rows)) in place, for [out, in] rows blocked along the input."""
    m = quantize(np.ascontiguousarray(rows), bits, block_size, symmetric, np.float32, method)
    rows[...] = dequantize(m, rows.shape[1], bits)


def round_lookup(table: np.ndarray, bits: int, q: Quantization) -> None:
    """A token lookup table the build quantizes on its own (blocks/embedding.py, vocabulary.py)."""
    round_rows(table, bits, q.block_size, q.symmetric, q.method)


def is_per_layer_table(name: str) -> bool:
    return name.endswith(PER_LAYER_TABLE)


def round_per_layer_table(table: np.ndarray, q: Quantization) -> None:
    round_rows(table, 8, q.block_size, True, "rtn")


def round_linear(name: str, weight: np.ndarray, target: Target) -> None:
    """A transformers Linear's [out, in] weight as the graph's linear layers made of it hold it:
    each part at its layer's bits where the target quantizes that layer; routers and the vision
    model stay float."""
    if in_float_tower(name) or name.endswith(FLOAT_ROUTERS):
        return
    q = target.quantization
    for graph_module, sources, rows in graph_linears(name, weight.shape[0]):
        if target.quantizes(graph_module, sources):
            bits = q.bits_for(graph_module, sources)
            round_rows(weight[rows], bits, q.block_size, q.symmetric, q.method)


def lookup_bits(q: Quantization, target: Target, untied: bool, was_tied: bool) -> int | None:
    """The bits the build quantizes the token lookup table to on its own, or None where it is float
    or rounded with lm_head: a standard-ops build's tied lookup (8-bit: ONNX's Gather has no 4-bit
    type); an untied table with --quantize-embeddings, or among an int4 build's int8 layers (the
    mixed preset's `*embed_tokens`), where the provider has GatherBlockQuantized."""
    if was_tied:
        return target.lookup_bits(q.bits) if untied and target.standard_ops else None
    if not (target.provider.quantized_gather or target.standard_ops):
        return None
    bits = q.bits_for("model.embed_tokens", ("model.embed_tokens",))
    if (q.embeddings and q.bits == 4) or (q.bits == 4 and bits == 8):
        return target.lookup_bits(bits)
    return None


def experts_transposed(up: tuple[int, ...], down: tuple[int, ...], hidden: int | None,
                       declared: bool | None) -> bool:
    """Whether stacked experts of these shapes are kept as x · W ([E, H, 2I] and [E, I, H]) rather
    than [out, in] ([E, 2I, H] and [E, H, I]): as the module declares it (transformers'
    `is_transposed`), else read from the shapes against the hidden size, which gate_up_proj (or
    up_proj) reads and down_proj writes; an undecidable (all square) layout is [out, in]."""
    if declared is not None:
        return bool(declared)
    if hidden is None:
        return False
    rows_first = up[2] == hidden and down[1] == hidden
    inputs_first = up[1] == hidden and down[2] == hidden
    return inputs_first and not rows_first


def round_experts(name: str, up: np.ndarray, down: np.ndarray, transposed: bool, target: Target,
                  symmetric: bool | None) -> None:
    """Rounds, in place, a transformers experts module's stacked gate_up_proj (or up_proj) and
    down_proj as the build's QMoE holds them (builder/blocks/moe.py, gpt_oss_experts.py): each
    expert's matrix alone, [out, in] rows blocked along the input, at the block size
    expert_block_size picks for the layer, with the precision's bits (no int8_layers: a QMoE node
    has one width) and method, and the symmetry the graph's QMoE nodes show (`symmetric`, None: the
    precision's). Row order within a matrix (gate/up concatenated or interleaved) does not matter
    to a row-wise rounding."""
    if in_float_tower(name) or not target.quantizes(graph_path(name), (name,)):
        return
    h, i = (down.shape[2], down.shape[1]) if transposed else (down.shape[1], down.shape[2])
    q = target.quantization
    if symmetric is not None:
        q = replace(q, symmetric=symmetric)
    q = replace(q, block_size=expert_block_size(h, i, q))
    for stacked in (up, down):
        for expert in stacked:  # views of the parameter: edited in place
            round_rows(expert.T if transposed else expert, q.bits, q.block_size, q.symmetric, q.method)


def experts_symmetric(model: Path) -> bool | None:
    """Whether the built graph's QMoE nodes hold their experts without zero points (what the build
    chose, whatever the precision asked), read from the nodes' inputs; None where it has none."""
    import onnx

    nodes = [n for n in onnx.load(str(model), load_external_data=False).graph.node if n.op_type == "QMoE"]
    if not nodes:
        return None
    return not any(any(node.input[QMOE_ZERO_POINTS]) for node in nodes)


__all__ = ["FLOAT_ROUTERS", "FLOAT_TOWERS", "experts_symmetric", "experts_transposed", "graph_linears", "graph_path",
           "in_float_tower", "is_per_layer_table", "lookup_bits", "round_experts", "round_linear", "round_lookup",
           "round_per_layer_table", "round_rows"]
