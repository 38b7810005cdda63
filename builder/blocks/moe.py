"""A sparse mixture of SwiGLU experts with a softmax-top-k router, as ONNX Runtime's
com.microsoft::MoE (float experts) or QMoE (int4/int8 experts, block-wise).

The router these operators implement, checked against numpy on ONNX Runtime 1.31's CPU kernels
and against transformers (tests/test_family_moe.py): p = softmax(logits) over all experts; the k
largest p are kept; with `normalize_routing_weights` they are divided by their sum; the token's
output is Σ p_e · expert_e(x). The graph always normalizes (the CPU kernel without it is wrong when
fed by another node) and multiplies by Σ top-k p for routers that do not.
That is transformers' router for Qwen2-MoE, Qwen3-MoE and OLMoE (`norm_topk_prob`), and Mixtral's
(always normalized; its softmax over the top-k logits equals the renormalized top-k of the full
softmax). Each expert is down(silu(gate(x)) · up(x)).

What the CPU kernels of 1.31 accept, and so the layout used: SwiGLU only with `swiglu_fusion=1`,
gate and up rows interleaved in one [E, 2I, H] matrix (row 2i the gate's row i, 2i+1 the up's);
FC3 and the concatenated fusion are not implemented on CPU. Expert matrices are in Hugging Face's
[out, in] = [N, K] layout, so no transpose. QMoE's 4-bit experts compute in float32 at
accuracy_level 0 (exact against dequantized weights) and with int8 activations at 4; its 8-bit
experts always use int8 activations.

Expert weights are read, converted and written one expert at a time: a float stack goes to the
file expert by expert (`Weight.stack`), a quantized one is quantized expert by expert and its codes
streamed the same way, its scales and zero points (an eighth of the codes or less) kept until
written (`StackedResult`). A layer's stacked tensor is never whole in memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import onnx_ir as ir

from builder.blocks.float_ops import in_op_dtype, op_dtype, to_dtype
from builder.blocks.linear import linear, module_name, quantized
from builder.errors import BuildError
from builder.graph import Graph
from builder.lazy import Weight
from builder.lazy_results import StackedResult
from builder.quantize import packed_shapes
from builder.target import Quantization, Target, source_modules


def _sources(*groups: Sequence[Weight]) -> tuple[str, ...]:
    return tuple(n for group in groups for w in group for n in w.sources)


def stacked_gate_up(gate: Sequence[Weight], up: Sequence[Weight], dtype: np.dtype) -> Weight:
    """[E, 2I, H]: each expert's gate and up rows interleaved (swiglu_fusion=1), one expert at a time."""
    (i, h) = gate[0].shape

    def interleaved(g: Weight, u: Weight) -> Weight:
        def fill(out: np.ndarray) -> None:
            out[0::2] = g.astype(dtype).numpy()
            out[1::2] = u.astype(dtype).numpy()

        return Weight.filled((2 * i, h), dtype, fill, g.sources + u.sources)

    return Weight.stack([interleaved(g, u) for g, u in zip(gate, up)])


def stacked(weights: Sequence[Weight], dtype: np.dtype) -> Weight:
    """[E, N, K]: the experts' matrices, one expert at a time."""
    return Weight.stack([w.astype(dtype) for w in weights])


def unstacked(stacked: Weight, start: int = 0, stop: int | None = None, transposed: bool = False) -> list[Weight]:
    """A checkpoint's stacked [E, N, K] expert tensor as E lazy [stop − start, K] matrices (rows
    [start, stop) of each expert: Granite MoE's input_linear holds the gate rows, then the up rows);
    each copies only its own expert's rows when written. `transposed`: the stack is [E, K, N]
    (x · W, Qwen3-VL-MoE's hub layout): columns [start, stop) of each expert, transposed."""
    e, n, k = stacked.shape
    if transposed:
        n, k = k, n
    stop = n if stop is None else stop

    def one(x: int) -> Weight:
        if transposed:  # (1, K, stop − start), a view; transposed when written
            cols = stacked.slice(0, x, x + 1).slice(2, start, stop)
            return Weight((stop - start, k), stacked.dtype, lambda _: cols.apply(lambda a: np.ascontiguousarray(a[0].T)),
                          stacked.sources)
        rows = stacked.slice(0, x, x + 1).slice(1, start, stop)  # (1, stop − start, K), a view
        return Weight((stop - start, k), stacked.dtype, lambda _: rows.apply(lambda a: np.ascontiguousarray(a[0])),
                      stacked.sources)

    return [one(x) for x in range(e)]


def expert_block_size(h: int, i: int, q: Quantization) -> int:
    """The block size of a layer's QMoE node (one per node, for hidden and intermediate alike): the
    largest power of two from the requested one down to 16 that divides both sizes, else the
    requested one with a shorter last block.

    ONNX Runtime 1.31's CPU QMoE takes any power of two from 16 as block_size and sizes its scales
    by rounding K / block up, so a short last block runs, and exactly at accuracy_level 0; but its
    fast MLAS kernels need K a multiple of the block (else it warns and dequantizes every expert
    to float for each matrix product), hence a smaller block that divides first. Zero-padding K
    would also be exact (the padded gate and up rows give silu(0) · 0 = 0) but costs compute
    and memory on every padded row; per-expert MatMulNBits would give up the fused node."""
    if q.bits == 4 and (h % 2 or i % 2):
        raise BuildError(f"4-bit QMoE needs even hidden ({h}) and expert intermediate ({i}) sizes: "
                         "its rows hold two codes a byte")
    block = q.block_size
    while block >= 16:
        if h % block == 0 and i % block == 0:
            return block
        block //= 2
    return q.block_size


def quantized_experts(g: Graph, parts: Sequence[Sequence[Weight]], q: Quantization, scale_dtype: np.dtype,
                      sources: tuple[str, ...]) -> tuple[ir.Value, ir.Value, ir.Value | None]:
    """QMoE's (weights [E, N, K·bits/8], scales [E, N, K/block], zero points) for experts whose rows
    are the rows of `parts` interleaved (gate and up) or of one part (down); each expert quantized
    alone, with the dense build's quantizer, so its codes are MatMulNBits' codes."""
    g.quantizes = True
    e, (n, k), ways = len(parts[0]), parts[0][0].shape, len(parts)
    data_shape, scales_shape, zp_shape = packed_shapes(n * ways, k, q.bits, q.block_size)
    data_shape = (e, data_shape[0], k * q.bits // 8)  # QMoE's rows hold K codes: a short last block's padding is cut
    scales_shape, zp_shape = (e, *scales_shape), (e, *zp_shape)

    def expert(x: int) -> dict[str, np.ndarray]:
        data, scales = np.empty(data_shape[1:], np.uint8), np.empty(scales_shape[1:], scale_dtype)
        zps = None if q.symmetric else np.empty(zp_shape[1:], np.uint8)
        for j, part in enumerate(parts):
            m = quantized(part[x], q.bits, q, scale_dtype)
            data[j::ways] = m.data.reshape(n, -1)[:, :data_shape[2]]
            scales[j::ways] = m.scales
            if zps is not None:
                zps[j::ways] = m.zero_points
        return {"data": data, "scales": scales} if zps is None else {"data": data, "scales": scales, "zero_points": zps}

    shapes = {"data": (data_shape, np.uint8), "scales": (scales_shape, scale_dtype)}
    if not q.symmetric:
        shapes["zero_points"] = (zp_shape, np.uint8)
    shared = StackedResult(e, expert, shapes)

    def register(part: str) -> ir.Value:
        name = g.scoped_name(part)
        main = part == "data"
        return g.lazy_initializer(name, shared.tensor(part, name), sources if main else (), e if main else 1)

    return register("data"), register("scales"), None if q.symmetric else register("zero_points")


def sparse_moe(
    g: Graph, x: ir.Value, router: Weight, gate: Sequence[Weight], up: Sequence[Weight], down: Sequence[Weight],
    top_k: int, normalize: bool, act: str, target: Target, router_name: str = "gate",
) -> ir.Value:
    """Σ over the top-k experts of p_e · down_e(silu(gate_e(x)) · up_e(x)), p = softmax(x · routerᵀ)
    (renormalized over the top k when `normalize`). Call it inside the block's scope (`.../mlp`);
    the router is a float linear layer named `router_name`, the experts live under `experts`.

    Example:
        y = sparse_moe(g, h, m("gate.weight", E, H), gates, ups, downs, top_k=2, normalize=True,
                       act="silu", target=target)
    """
    if act != "silu":
        raise BuildError(f"mixture of experts with activation {act!r}: only SwiGLU (silu) experts are supported")
    with g.scope(router_name):
        # The router stays in float: a logit moved by rounding can pick another expert.
        scores = linear(g, x, router, replace(target, quantization=None))  # (B, S, E)
        logits = g.op.Reshape(scores, g.constant([-1, len(gate)], "int64"))  # (B·S, E)
    # Always normalized: ONNX Runtime 1.31's CPU MoE with normalize_routing_weights=0 returns wrong
    # values when its output feeds another node (fixed in 1.32; tests/test_family_moe.py shows both),
    # and users still run 1.31; an un-normalized router's output is the normalized one times the sum
    # of its top-k probabilities.
    attributes = dict(k=top_k, activation_type="swiglu", swiglu_fusion=1, activation_alpha=1.0, activation_beta=0.0,
                      normalize_routing_weights=1)
    y = _experts(g, x, logits, gate, up, down, attributes, target)
    if normalize:
        return y
    with g.scope("router_mass"):
        dtype = op_dtype(target.io_dtype)
        p = to_dtype(g, g.op.Softmax(scores, axis=-1), target.io_dtype, dtype)
        top = g.op.TopK(p, g.constant([top_k], "int64"), axis=-1, _outputs=2)[0]
        mass = g.op.ReduceSum(top, g.constant([-1], "int64"), keepdims=1)  # (B, S, k) -> (B, S, 1)
        return g.op.Mul(y, to_dtype(g, mass, dtype, target.io_dtype))  # (B, S, H) · (B, S, 1)


def routed_experts(g: Graph, x: ir.Value, scores: ir.Value, index: ir.Value, weight: ir.Value, top_k: int,
                   gate: Sequence[Weight], up: Sequence[Weight], down: Sequence[Weight], target: Target,
                   alpha: float = 1.0) -> ir.Value:
    """Σ_j weight_j · expert_{index_j}(x) for a router the fused operator cannot compute itself,
    built by the caller from standard operators: `index` (B, S, k) int64 and `weight` (B, S, k) >
    0, `scores` (B, S, E) only for its shape. The operator is fed logits that are log(weight) at the
    chosen experts and −10⁴ elsewhere: its softmax, top-k and renormalization then give back
    weight_j / Σ weight (to rounding), and the sum Σ weight is multiplied in after.

    Each expert is down(a · σ(alpha · a) · b) with a = gate(x), b = up(x): SwiGLU at alpha 1.
    Experts that are down(relu(up(x))²) (Nemotron-H's; the CPU kernels have no relu² and no FC3)
    pass `up` as both and RELU_SQUARED_ALPHA: u · σ(10⁴ · u) · u is relu(u)² to 0.5 · 10⁻⁸
    absolute (at |u| ≈ 2·10⁻⁴), for twice the up matrix's bytes."""
    E = len(gate)
    with g.scope("routing"):
        floor = g.op.Expand(g.constant(-1e4, target.io_dtype), g.op.Shape(scores))  # (B, S, E)
        log = in_op_dtype(g, weight, target.io_dtype, g.op.Log)
        chosen = g.op.ScatterElements(floor, index, log, axis=-1)  # (B, S, E)
        logits = g.op.Reshape(chosen, g.constant([-1, E], "int64"))  # (B·S, E)
        mass = g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1)  # (B, S, k) -> (B, S, 1)
    attributes = dict(k=top_k, activation_type="swiglu", swiglu_fusion=1, activation_alpha=alpha,
                      activation_beta=0.0, normalize_routing_weights=1)
    return g.op.Mul(_experts(g, x, logits, gate, up, down, attributes, target), mass)  # (B, S, H) · (B, S, 1)


# SwiGLU's sigmoid slope that makes u · σ(αu) · u relu(u)² (routed_experts); finite in fp16.
RELU_SQUARED_ALPHA = 1e4


def grouped_sigmoid_router(g: Graph, x: ir.Value, router: Weight, bias: Weight, top_k: int, n_group: int,
                           topk_group: int, normalize: bool, scaling: float, target: Target
                           ) -> tuple[ir.Value, ir.Value, ir.Value]:
    """The sigmoid router with a correction bias and grouped top-k of GLM-4.5 (Glm4MoeTopkRouter),
    DeepSeek-V3 and dots.llm1, in float32 as transformers computes it: s = sigmoid(x · routerᵀ);
    the experts fall in `n_group` equal groups, each scored by the sum of its two largest s + bias;
    the experts are the top k of s + bias inside the `topk_group` best groups; their weights are s
    (without the bias), divided by their sum (+1e-20) when `normalize`, times `scaling`. Returns
    (router logits (B, S, E), index (B, S, k) int64, weight (B, S, k) in x's dtype), what
    `routed_experts` takes. Call it inside the router's scope (`.../mlp/gate`)."""
    E = router.shape[0]
    float_target = replace(target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(x, to=ir.DataType.FLOAT), router, float_target)  # (B, S, E)
    scores = g.op.Sigmoid(logits)
    choice = g.op.Add(scores, g.weight("e_score_correction_bias", bias.astype(np.float32)))  # (B, S, E)
    if topk_group < n_group:  # groups left out: their experts cannot be chosen
        with g.scope("groups"):
            kept = _best_groups(g, choice, E, n_group, topk_group, "top2_sum")
            choice = g.op.Where(kept, choice, g.constant(-np.inf, np.float32))
    index = g.op.TopK(choice, g.constant([top_k], "int64"), axis=-1, _outputs=2)[1]  # (B, S, k)
    weight = g.op.GatherElements(scores, index, axis=-1)  # (B, S, k): without the bias
    if normalize:
        total = g.op.ReduceSum(weight, g.constant([-1], "int64"), keepdims=1)  # (B, S, 1)
        weight = g.op.Div(weight, g.op.Add(total, g.constant(1e-20, np.float32)))
    if scaling != 1.0:
        weight = g.op.Mul(weight, g.constant(scaling, np.float32))
    return logits, index, g.op.CastLike(weight, x)


def grouped_softmax_router(g: Graph, x: ir.Value, router: Weight, top_k: int, n_group: int, topk_group: int,
                           scaling: float, target: Target) -> tuple[ir.Value, ir.Value, ir.Value]:
    """DeepSeek-V2's router (DeepseekV2TopkRouter) in float32 as transformers computes it: p =
    softmax(x · routerᵀ) over every expert; with topk_group < n_group ("group_limited_greedy") only
    the experts of the topk_group groups of largest max p stay (the others' p is 0); the top k of p,
    weighted by p itself (not renormalized) times `scaling`. Returns what `routed_experts` takes."""
    E = router.shape[0]
    float_target = replace(target, quantization=None, io_dtype=np.dtype(np.float32))
    logits = linear(g, g.op.Cast(x, to=ir.DataType.FLOAT), router, float_target)  # (B, S, E)
    scores = g.op.Softmax(logits, axis=-1)
    if topk_group < n_group:
        with g.scope("groups"):
            kept = _best_groups(g, scores, E, n_group, topk_group, "max")
            scores = g.op.Where(kept, scores, g.constant(0.0, np.float32))
    weight, index = g.op.TopK(scores, g.constant([top_k], "int64"), axis=-1, _outputs=2)  # (B, S, k)
    if scaling != 1.0:
        weight = g.op.Mul(weight, g.constant(scaling, np.float32))
    return logits, index, g.op.CastLike(weight, x)


def _best_groups(g: Graph, scores: ir.Value, E: int, n_group: int, topk_group: int, by: str) -> ir.Value:
    """(B, S, E) bool: the experts of the `topk_group` of `n_group` equal groups whose score is
    largest, a group scored by the sum of its two best experts ("top2_sum": DeepSeek-V3, GLM-4.5)
    or its best one ("max": DeepSeek-V2)."""
    grouped = g.op.Reshape(scores, g.constant([0, 0, n_group, E // n_group], "int64"))  # (B, S, G, E/G)
    if by == "max":
        group_scores = g.op.ReduceMax(grouped, g.constant([-1], "int64"), keepdims=0)  # (B, S, G)
    else:
        best_two = g.op.TopK(grouped, g.constant([2], "int64"), axis=-1, _outputs=2)[0]
        group_scores = g.op.ReduceSum(best_two, g.constant([-1], "int64"), keepdims=0)  # (B, S, G)
    groups = g.op.TopK(group_scores, g.constant([topk_group], "int64"), axis=-1, _outputs=2)[1]
    none = g.op.Expand(g.constant(False, np.bool_), g.op.Shape(group_scores))
    kept = g.op.ScatterElements(none, groups, g.op.Expand(g.constant(True, np.bool_), g.op.Shape(groups)),
                                axis=-1)  # (B, S, G): the chosen groups
    kept = g.op.Expand(g.op.Unsqueeze(kept, g.constant([-1], "int64")), g.op.Shape(grouped))
    return g.op.Reshape(kept, g.op.Shape(scores))  # (B, S, E)


def sparsemixer(g: Graph, scores: ir.Value, jitter_eps: float, dtype: np.dtype) -> tuple[ir.Value, ir.Value]:
    """Phi-3.5-MoE's top-2 router at inference (transformers/models/phimoe/modeling_phimoe.py,
    `sparsemixer` with training=False) on router logits (B, S, E) of `dtype`: expert j is the argmax
    of the logits with the earlier choices at −∞; its weight is its probability under a softmax over
    only the logits within a relative 2·jitter_eps of that maximum, (max − s) / max(|s|, max) ≤ 2·eps.
    Returns (index (B, S, 2) int64, weight (B, S, 2) of `dtype`). In float32 for bfloat16, which
    ONNX Runtime's CUDA ArgMax and Greater do not take (blocks.float_ops)."""
    minus_inf, last = g.constant(-np.inf, np.float32), g.constant([-1], "int64")
    scores = to_dtype(g, scores, dtype, op_dtype(dtype))
    masked, indices, weights = scores, [], []
    for j in range(2):
        with g.scope(f"top{j + 1}"):
            top = g.op.ReduceMax(masked, last, keepdims=1)  # (B, S, 1)
            index = g.op.ArgMax(masked, axis=-1, keepdims=1)  # (B, S, 1)
            factor = g.op.Max(g.op.Abs(scores), top)  # |s| clamped below at the maximum
            eps, inf = g.op.CastLike(g.constant(2 * jitter_eps, np.float32), scores), g.op.CastLike(minus_inf, scores)
            far = g.op.Greater(g.op.Div(g.op.Sub(top, scores), factor), eps)
            p = g.op.Softmax(g.op.Where(far, inf, masked), axis=-1)  # (B, S, E)
            indices.append(index)
            weights.append(g.op.GatherElements(p, index, axis=-1))  # (B, S, 1)
            masked = g.op.ScatterElements(masked, index, g.op.Expand(inf, g.op.Shape(index)), axis=-1)
    return g.op.Concat(*indices, axis=-1), to_dtype(g, g.op.Concat(*weights, axis=-1), op_dtype(dtype), dtype)


def qmoe_node(g: Graph, inputs: list[ir.Value | None], attributes: dict, q: Quantization, target: Target,
              hidden: int, inter: int) -> ir.Value:
    """The QMoE node over `inputs` (trailing absent ones left out), its weights in the raw
    [E, N, K·bits/8] layout; CUDA's kernel is told so and its size rule checked (Provider.qmoe_k_tile)."""
    inputs = list(inputs)
    while inputs[-1] is None:
        inputs.pop()
    tile = target.provider.qmoe_k_tile
    if tile:
        if hidden % tile or inter % tile:
            ep = target.execution_provider
            raise BuildError(f"-e {ep}: ONNX Runtime's {ep} QMoE needs hidden ({hidden}) and expert intermediate "
                             f"({inter}) sizes that are multiples of {tile}; keep the experts in float "
                             "(--float-layers '*.experts') or build for another provider")
        attributes = {**attributes, "weights_prepacked": 0}
    return g.ms.QMoE(*inputs, **attributes, expert_weight_bits=q.bits, block_size=q.block_size,
                     accuracy_level=q.accuracy_level)


def _experts(g: Graph, x: ir.Value, logits: ir.Value, gate: Sequence[Weight], up: Sequence[Weight],
             down: Sequence[Weight], attributes: dict, target: Target) -> ir.Value:
    """The MoE (float) or QMoE (quantized) node over stacked experts."""
    i, h = gate[0].shape
    with g.scope("experts"):
        module, sources = module_name(g), source_modules(_sources(gate, up, down))
        g.linears[module] = sources
        q = target.quantization
        if target.quantizes(module, sources):
            q = replace(q, block_size=expert_block_size(h, i, q))
            with g.scope("gate_up_proj"):
                w1, s1, z1 = quantized_experts(g, (gate, up), q, target.io_dtype, _sources(gate, up))
            with g.scope("down_proj"):
                w2, s2, z2 = quantized_experts(g, (down,), q, target.io_dtype, _sources(down))
            return qmoe_node(g, [x, logits, w1, s1, None, w2, s2, None, None, None, None, z1, z2], attributes, q,
                             target, h, i)
        w1 = g.weight("gate_up_proj", stacked_gate_up(gate, up, target.io_dtype))  # (E, 2I, H)
        w2 = g.weight("down_proj", stacked(down, target.io_dtype))  # (E, H, I)
        return g.ms.MoE(x, logits, w1, None, w2, **attributes)


__all__ = ["RELU_SQUARED_ALPHA", "expert_block_size", "qmoe_node", "grouped_sigmoid_router", "grouped_softmax_router", "quantized_experts", "routed_experts", "sparse_moe",
           "sparsemixer", "stacked", "stacked_gate_up", "unstacked"]
