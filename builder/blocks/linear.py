"""Linear layers: y = x · Wᵀ (+ b), from a weight in Hugging Face's [out_features, in_features] layout.

In float, a MatMul against the transposed weight. Quantized, a com.microsoft::MatMulNBits whose
B, scales and zero points come out of one quantization of the checkpoint's own values, run when
the writer reaches them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.graph import Graph
from builder.lazy import Weight
from builder.materialize import SharedResult
from builder.quantize import packed_shapes, quantize
from builder.target import Quantization, Target, source_modules


@dataclass(frozen=True)
class QuantizedValues:
    """The initializers of one quantized matrix, for MatMulNBits or GatherBlockQuantized."""

    data: ir.Value  # uint8 [N, k_blocks, block_size·bits/8]
    scales: ir.Value  # io dtype [N, k_blocks]
    zero_points: ir.Value | None  # uint8 [N, ceil(k_blocks·bits/8)]
    n: int
    k: int
    bits: int
    block_size: int | None = None  # a pre-quantized weight's own block size; None: the build's
    offsets: ir.Value | None = None  # float [k_blocks, N]: each block's minimum (GGUF Q4_1, K-quants)
    input_order: ir.Value | None = None  # int64 [K]: B's input features in this order (GPTQ act-order)


def module_name(g: Graph) -> str:
    """The dotted Hugging Face module path of the current scope (`model.layers.0.mlp.down_proj`)."""
    return g.path.strip("/").replace("/", ".")


def quantized_weight(g: Graph, weight: Weight, q: Quantization, scale_dtype: np.dtype,
                     bits: int | None = None) -> QuantizedValues:
    """Registers B, scales (and zero points) as lazy initializers sharing one quantization, to
    `bits` (default: the build's). A weight the checkpoint stores already quantized
    (`weight.blocks`) is written as it is stored, with its own bits and block size: no float round trip."""
    if weight.blocks is not None:
        return _stored_blocks(g, weight, scale_dtype)
    bits = bits or q.bits
    n, k = weight.shape
    data_shape, scales_shape, zp_shape = packed_shapes(n, k, bits, q.block_size)

    def compute() -> dict[str, np.ndarray]:
        m = weight.apply(lambda rows: quantize(rows, bits, q.block_size, q.symmetric, scale_dtype, q.method))
        parts = {"data": m.data, "scales": m.scales}
        if m.zero_points is not None:
            parts["zero_points"] = m.zero_points
        return parts

    shared = SharedResult(compute)

    def register(part: str, shape, dtype) -> ir.Value:
        return _register(g, shared, weight, part, shape, dtype)

    return QuantizedValues(
        data=register("data", data_shape, np.uint8),
        scales=register("scales", scales_shape, scale_dtype),
        zero_points=None if q.symmetric else register("zero_points", zp_shape, np.uint8),
        n=n,
        k=k,
        bits=bits,
    )


def _register(g: Graph, shared: SharedResult, weight: Weight, part: str, shape, dtype) -> ir.Value:
    """One part of a shared quantization result as an initializer: the data part maps (and names)
    the source; scales, zero points and offsets come out of the same computation."""
    name = g.scoped_name(part)
    main = part == "data"
    return g.lazy_initializer(name, shared.tensor(part, shape, dtype, name), weight.sources if main else ())


def _stored_blocks(g: Graph, weight: Weight, scale_dtype: np.dtype) -> QuantizedValues:
    """B, scales, and what the format stores besides (zero points, per-block offsets) straight from
    a pre-quantized weight's blocks; its input order as a constant."""
    b = weight.blocks
    n, k = weight.shape
    data_shape, scales_shape, zp_shape = packed_shapes(n, k, b.bits, b.block_size)

    def compute() -> dict[str, np.ndarray]:
        with contextlib.ExitStack() as stack:
            data, scales, zero_points, offsets = b.compute(stack)
            # Copies that own their memory: the sources are views of mapped file pages.
            parts = {"data": np.array(data, np.uint8), "scales": np.array(scales, scale_dtype)}
            if zero_points is not None:
                parts["zero_points"] = np.array(zero_points, np.uint8)
            if offsets is not None:
                parts["offsets"] = np.ascontiguousarray(offsets.T, scale_dtype)  # [N, k_blocks] -> [k_blocks, N]
            return parts

    shared = SharedResult(compute)

    def register(part: str, shape, dtype) -> ir.Value:
        return _register(g, shared, weight, part, shape, dtype)

    order = None
    if b.input_order is not None:
        order = g.weight("input_order", Weight.constant(np.asarray(b.input_order, np.int64)))
    return QuantizedValues(register("data", data_shape, np.uint8), register("scales", scales_shape, scale_dtype),
                           register("zero_points", zp_shape, np.uint8) if b.zero_points else None,
                           n, k, b.bits, b.block_size,
                           register("offsets", scales_shape[::-1], scale_dtype) if b.offsets else None, order)


def matmul_nbits(g: Graph, x: ir.Value, m: QuantizedValues, target: Target) -> ir.Value:
    """x · Wᵀ for a quantized W: one MatMulNBits, after a Gather of x's features into B's order
    (act-order), plus the block minimums' term (GGUF Q4_1, K-quants): Σ_b offset[b, n] · Σ_{k∈b} x_k."""
    q = target.quantization
    block_size = m.block_size or q.block_size
    if m.input_order is not None:
        x = g.op.Gather(x, m.input_order, axis=-1)  # (B, S, K), features in the order B stores them
    y = g.ms.MatMulNBits(x, m.data, m.scales, m.zero_points, K=m.k, N=m.n, bits=m.bits, block_size=block_size,
                         accuracy_level=q.accuracy_level)
    if m.offsets is not None:
        k_blocks = m.k // block_size
        blocked = g.op.Reshape(x, g.constant([0, 0, k_blocks, block_size], "int64"))  # (B, S, K) -> (B, S, K/b, b)
        sums = g.op.ReduceSum(blocked, g.constant([-1], "int64"), keepdims=0)  # (B, S, K/b)
        y = g.op.Add(y, g.op.MatMul(sums, m.offsets))  # (B, S, K/b) · (K/b, N)
    return y


def linear(
    g: Graph,
    x: ir.Value,
    weight: Weight,
    target: Target,
    bias: Weight | None = None,
    quantized: QuantizedValues | None = None,
) -> ir.Value:
    """x · Wᵀ (+ b). `quantized` reuses initializers already registered for this weight (tied lm_head)."""
    module, sources = module_name(g), source_modules(weight.sources)
    g.linears[module] = sources if quantized is None else ()  # what --float-layers patterns may name
    if quantized is None and target.quantizes(module, sources):
        bits = target.quantization.bits_for(module, sources)
        quantized = quantized_weight(g, weight, target.quantization, target.io_dtype, bits)
    if quantized is not None:
        y = matmul_nbits(g, x, quantized, target)
    else:
        w = g.weight("weight", weight.transpose().astype(target.io_dtype))  # [out, in] -> [in, out]
        y = g.op.MatMul(x, w)
    if bias is not None:
        y = g.op.Add(y, g.weight("bias", bias.astype(target.io_dtype)))
    return y
