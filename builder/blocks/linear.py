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
from builder.lazy import SharedResult, Weight
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


def stored_bits(weight: Weight, q: Quantization) -> int:
    """The bits a quantized `weight` will have: its own when stored pre-quantized, else the build's."""
    return weight.blocks.bits if weight.blocks is not None else q.bits


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
        name = g.scoped_name(part)
        # The data part maps the source; scales and zero points come out of the same computation.
        main = part == "data"
        return g.lazy_initializer(name, shared.tensor(part, shape, dtype, name), weight.sources if main else (),
                                  by_product=not main)

    return QuantizedValues(
        data=register("data", data_shape, np.uint8),
        scales=register("scales", scales_shape, scale_dtype),
        zero_points=None if q.symmetric else register("zero_points", zp_shape, np.uint8),
        n=n,
        k=k,
        bits=bits,
    )


def _stored_blocks(g: Graph, weight: Weight, scale_dtype: np.dtype) -> QuantizedValues:
    """B, scales and (when the format stores them) zero points straight from a pre-quantized
    weight's blocks."""
    b = weight.blocks
    n, k = weight.shape
    data_shape, scales_shape, zp_shape = packed_shapes(n, k, b.bits, b.block_size)

    def compute() -> dict[str, np.ndarray]:
        with contextlib.ExitStack() as stack:
            data, scales, zero_points = b.compute(stack)
            # Copies that own their memory: the sources are views of mapped file pages.
            parts = {"data": np.array(data, np.uint8), "scales": np.array(scales, scale_dtype)}
            if zero_points is not None:
                parts["zero_points"] = np.array(zero_points, np.uint8)
            return parts

    shared = SharedResult(compute)

    def register(part: str, shape, dtype) -> ir.Value:
        name = g.scoped_name(part)
        main = part == "data"
        return g.lazy_initializer(name, shared.tensor(part, shape, dtype, name), weight.sources if main else (),
                                  by_product=not main)

    return QuantizedValues(register("data", data_shape, np.uint8), register("scales", scales_shape, scale_dtype),
                           register("zero_points", zp_shape, np.uint8) if b.zero_points else None,
                           n, k, b.bits, b.block_size)


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
        q = target.quantization
        y = g.ms.MatMulNBits(
            x, quantized.data, quantized.scales, quantized.zero_points,
            K=quantized.k, N=quantized.n, bits=quantized.bits,
            block_size=quantized.block_size or q.block_size, accuracy_level=q.accuracy_level,
        )
    else:
        w = g.weight("weight", weight.transpose().astype(target.io_dtype))  # [out, in] -> [in, out]
        y = g.op.MatMul(x, w)
    if bias is not None:
        y = g.op.Add(y, g.weight("bias", bias.astype(target.io_dtype)))
    return y
