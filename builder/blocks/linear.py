"""Linear layers: y = x · Wᵀ (+ b), from a weight in Hugging Face's [out_features, in_features] layout.

In float, com.microsoft's FusedMatMul with transB reads the weight as the checkpoint stores it,
[out, in], where the provider has that operator; elsewhere (WebGPU, TensorRT-RTX, --standard-ops)
a MatMul against the weight transposed at build time. Quantized, a com.microsoft::MatMulNBits whose
B, scales and zero points come out of one quantization of the checkpoint's own values, run when
the writer reaches them; or, with Quantization.qdq, the same codes and scales as a blocked
DequantizeLinear (opset 21) feeding a MatMul: the QDQ form other runtimes and tools read.

QDQ layout: the weight is stored as Wᵀ, [K, N] int4/int8 (symmetric: the codes minus 8 or 128)
or uint4/uint8 with zero points, blocks along axis 0, scales and zero points [k_blocks, N]. That
is the pattern ONNX Runtime's CPU provider fuses back into MatMulNBits (DQMatMulToMatMulNBits:
measured 76 µs against 78 µs for MatMulNBits on a 2048² int4 matmul, 2 threads); the reference
builder's [N, K] DequantizeLinear + Transpose + MatMul is not fused by ONNX Runtime 1.31 and runs
the float matmul (7.4 ms, 95× slower).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from builder.blocks import stored_float
from builder.errors import BuildError
from builder.finite import first_non_finite
from builder.graph import Graph
from builder.lazy import Weight
from builder.lazy_results import SharedResult
from builder.quantize import QuantizedMatrix, packed_shapes, quantize
from builder.stored_blocks import pack_codes, unpack_codes
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
    qdq: bool = False  # the QDQ layout: data [K, N] (u)int4/(u)int8, scales and zero points [k_blocks, N]
    lookup_zero_points: ir.Value | None = None  # zero_points packed over the whole table (Quantization.flat_lookup_zero_points)


def module_name(g: Graph) -> str:
    """The dotted Hugging Face module path of the current scope (`model.layers.0.mlp.down_proj`)."""
    return g.path.strip("/").replace("/", ".")


def quantized_weight(g: Graph, weight: Weight, q: Quantization, scale_dtype: np.dtype,
                     bits: int | None = None, lookup: bool = False) -> QuantizedValues:
    """Registers B, scales (and zero points) as lazy initializers sharing one quantization, to
    `bits` (default: the build's). A weight the checkpoint stores already quantized
    (`weight.blocks`) is written as it is stored, with its own bits and block size: no float round trip.
    `lookup`: a GatherBlockQuantized reads it too (a tied or quantized embedding table), which may
    need its zero points packed over the whole table (Quantization.flat_lookup_zero_points)."""
    if weight.blocks is not None:
        return _stored_blocks(g, weight, scale_dtype, q.qdq, lookup and q.flat_lookup_zero_points)
    g.quantizes = True
    bits = bits or q.bits
    n, k = weight.shape
    k_blocks = -(-k // q.block_size)
    flat = lookup and q.flat_lookup_zero_points and bits == 4 and not q.symmetric and not q.qdq and k_blocks % 2 == 1

    def compute() -> dict[str, np.ndarray]:
        m = quantized(weight, bits, q, scale_dtype)
        parts = {"data": m.data, "scales": m.scales}
        if m.zero_points is not None:
            parts["zero_points"] = m.zero_points
        if flat:
            parts["lookup_zero_points"] = _flat_zero_points(m.zero_points, k_blocks)
        return qdq_parts(parts, k, bits, q.block_size) if q.qdq else parts

    origin = weight.content()
    key = None if origin is None else ("quantized", origin, bits, q.block_size, q.symmetric, q.method,
                                       np.dtype(scale_dtype).str, q.qdq, flat)
    shared = SharedResult(compute, key=key)
    shapes = _part_shapes(n, k, bits, q.block_size, q.qdq, not q.symmetric)

    def register(part: str) -> ir.Value:
        return _register(g, shared, weight, part, *shapes[part], scale_dtype)

    return QuantizedValues(
        data=register("data"),
        scales=register("scales"),
        zero_points=None if q.symmetric else register("zero_points"),
        n=n,
        k=k,
        bits=bits,
        qdq=q.qdq,
        lookup_zero_points=register("lookup_zero_points") if flat else None,
    )


def _part_shapes(n: int, k: int, bits: int, block_size: int, qdq: bool, zero_points: bool
                 ) -> dict[str, tuple[tuple[int, ...], ir.DataType | None]]:
    """Each part's shape and ONNX type (None: the scale dtype) in MatMulNBits' or the QDQ layout."""
    data_shape, scales_shape, zp_shape = packed_shapes(n, k, bits, block_size)
    if not qdq:
        return {"data": (data_shape, ir.DataType.UINT8), "scales": (scales_shape, None),
                "zero_points": (zp_shape, ir.DataType.UINT8), "offsets": (scales_shape[::-1], None),
                "lookup_zero_points": (zp_shape, ir.DataType.UINT8)}  # the same zero points packed flat
    k_blocks = scales_shape[1]
    return {"data": ((k, n), qdq_code_type(bits, zero_points)), "scales": ((k_blocks, n), None),
            "zero_points": ((k_blocks, n), qdq_code_type(bits, True)), "offsets": ((k_blocks, n), None)}


def qdq_code_type(bits: int, zero_points: bool) -> ir.DataType:
    """The QDQ codes' type: unsigned beside zero points, else signed (the codes minus 2^(bits-1))."""
    return {(4, True): ir.DataType.UINT4, (4, False): ir.DataType.INT4,
            (8, True): ir.DataType.UINT8, (8, False): ir.DataType.INT8}[bits, zero_points]


def qdq_parts(parts: dict[str, np.ndarray], k: int, bits: int, block_size: int) -> dict[str, np.ndarray]:
    """MatMulNBits' parts in the QDQ layout (module docstring): the same codes transposed to [K, N]
    (the padding past K dropped), signed when there are no zero points; scales and zero points
    [k_blocks, N]. 4-bit arrays come back packed, two codes a byte, low nibble first (ONNX's int4
    order), as builder.lazy_results.SharedResult writes them."""
    data = parts["data"]
    n = data.shape[0]
    codes = unpack_codes(data.reshape(n, -1), bits)[:, :k]  # (N, padded K) -> (N, K)
    out = {"scales": np.ascontiguousarray(parts["scales"].T)}
    if "zero_points" in parts:
        k_blocks = parts["scales"].shape[1]
        out["zero_points"] = _flat_codes(unpack_codes(parts["zero_points"], bits)[:, :k_blocks].T, bits)
        out["data"] = _flat_codes(codes.T, bits)
    else:  # the implicit zero point 2^(bits-1) subtracted: q - 8 is q ^ 8 in 4-bit two's complement
        out["data"] = _flat_codes(codes.T ^ np.uint8(1 << (bits - 1)), bits)
    if "offsets" in parts:
        out["offsets"] = parts["offsets"]  # already [k_blocks, N]
    return out


def quantized(weight: Weight, bits: int, q: Quantization, scale_dtype: np.dtype) -> QuantizedMatrix:
    """`quantize` of a float weight's rows, refusing one whose blocks give a scale that is not finite:
    a NaN or an infinity in the checkpoint, or a block too wide for float16 scales, which would make
    the model compute NaN where nothing says why."""

    def run(rows) -> QuantizedMatrix:
        with np.errstate(invalid="ignore", over="ignore"):  # numpy's warnings on such a block: refused below
            m = quantize(rows, bits, q.block_size, q.symmetric, scale_dtype, q.method)
        found = first_non_finite(m.scales)
        if found:
            count, (row, block) = found
            start = block * q.block_size
            values = np.asarray(rows[row], np.float32)[start:start + q.block_size]
            what = ("NaN" if np.isnan(values).any() else "an infinity" if np.isinf(values).any() else
                    f"values up to {np.abs(values).max():.4g}, past {np.dtype(scale_dtype).name} scales' range")
            where = f"row {row}, columns {start}-{start + len(values) - 1}"
            raise BuildError(f"{', '.join(weight.sources) or 'a weight'} holds {what} ({where}; {count} "
                             f"block{'s' if count > 1 else ''} in all): a model built from it would compute NaN")
        return m

    return weight.apply(run)


def _refuse_non_finite(weight: Weight, scales: np.ndarray, offsets: np.ndarray | None, scale_dtype: np.dtype) -> None:
    """A pre-quantized weight's scales and block offsets, as the build stores them, must be finite:
    a damaged file's NaN, or a scale past float16's range in an fp16-activation build, would make
    the model compute NaN."""
    for what, values in (("scale", scales), ("minimum", offsets)):
        if values is None:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            found = first_non_finite(np.asarray(values).astype(scale_dtype))
        if found:
            count, (row, block) = found
            raise BuildError(f"{', '.join(weight.sources) or 'a weight'}: block {block} of row {row} has a {what} of "
                             f"{float(values[row, block]):g} as {np.dtype(scale_dtype).name} ({count} in all): "
                             "a model built from it would compute NaN")


def _flat_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Codes (any shape) as ONNX stores a tensor of them: row-major, 4-bit ones two a byte."""
    flat = np.ascontiguousarray(codes)
    return flat if bits == 8 else pack_codes(flat.reshape(-1), bits)


def _register(g: Graph, shared: SharedResult, weight: Weight, part: str, shape, dtype: ir.DataType | None,
              scale_dtype: np.dtype) -> ir.Value:
    """One part of a shared quantization result as an initializer: the data part maps (and names)
    the source; scales, zero points and offsets come out of the same computation."""
    name = g.scoped_name(part)
    main = part == "data"
    dtype = ir.DataType.from_numpy(np.dtype(scale_dtype)) if dtype is None else dtype
    return g.lazy_initializer(name, shared.tensor(part, shape, dtype, name), weight.sources if main else ())


def _flat_zero_points(zero_points: np.ndarray, k_blocks: int) -> np.ndarray:
    """4-bit zero points [N, ceil(k_blocks/2)] (each row begun on a byte) packed one row after
    another instead, in the same shape, the tail's unused halves zero: as CUDA's
    GatherBlockQuantized reads them (Quantization.flat_lookup_zero_points)."""
    codes = pack_codes(unpack_codes(zero_points, 4)[:, :k_blocks].reshape(1, -1), 4).reshape(-1)
    out = np.zeros(zero_points.shape, np.uint8)
    out.reshape(-1)[: codes.size] = codes
    return out


def _stored_blocks(g: Graph, weight: Weight, scale_dtype: np.dtype, qdq: bool, flat_lookup: bool = False
                   ) -> QuantizedValues:
    """B, scales, and what the format stores besides (zero points, per-block offsets) straight from
    a pre-quantized weight's blocks, in MatMulNBits' or the QDQ layout; its input order as a constant.
    `flat_lookup`: a lookup reads it on a provider that wants its 4-bit zero points flat (quantized_weight)."""
    b = weight.blocks
    n, k = weight.shape
    k_blocks = -(-k // b.block_size)
    flat = flat_lookup and b.bits == 4 and b.zero_points and not qdq and k_blocks % 2 == 1

    def compute() -> dict[str, np.ndarray]:
        with contextlib.ExitStack() as stack:
            data, scales, zero_points, offsets = b.compute(stack)
            _refuse_non_finite(weight, scales, offsets, scale_dtype)
            # Arrays that own their memory: a source may be a view of mapped file pages, closed here.
            parts = {"data": _owned(data, np.uint8), "scales": _owned(scales, scale_dtype)}
            if zero_points is not None:
                parts["zero_points"] = _owned(zero_points, np.uint8)
                if flat:
                    parts["lookup_zero_points"] = _flat_zero_points(parts["zero_points"], k_blocks)
            if offsets is not None:
                parts["offsets"] = np.ascontiguousarray(offsets.T, scale_dtype)  # [N, k_blocks] -> [k_blocks, N]
            return qdq_parts(parts, k, b.bits, b.block_size) if qdq else parts

    shared = SharedResult(compute)
    shapes = _part_shapes(n, k, b.bits, b.block_size, qdq, b.zero_points)

    def register(part: str) -> ir.Value:
        return _register(g, shared, weight, part, *shapes[part], scale_dtype)

    order = None
    if b.input_order is not None:
        order = g.weight("input_order", Weight.constant(np.asarray(b.input_order, np.int64)))
    return QuantizedValues(register("data"), register("scales"), register("zero_points") if b.zero_points else None,
                           n, k, b.bits, b.block_size, register("offsets") if b.offsets else None, order, qdq,
                           register("lookup_zero_points") if flat else None)


def _owned(array, dtype) -> np.ndarray:
    """`array` as a C-contiguous array of `dtype` whose memory no mapped file backs: as it is when
    it was computed (a GGUF tensor's decoded codes: no second copy of the largest tensor), else a copy."""
    a = np.asarray(array)
    base = a
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    computed = isinstance(base, np.ndarray) and not isinstance(base, np.memmap)
    if computed and a.dtype == dtype and a.flags.c_contiguous:
        return a
    return np.array(a, dtype)


def matmul_nbits(g: Graph, x: ir.Value, m: QuantizedValues, target: Target) -> ir.Value:
    """x · Wᵀ for a quantized W: one MatMulNBits, after a Gather of x's features into B's order
    (act-order), plus the block minimums' term (GGUF Q4_1, K-quants): Σ_b offset[b, n] · Σ_{k∈b} x_k."""
    q = target.quantization
    block_size = m.block_size or q.block_size
    if m.input_order is not None:
        x = g.op.Gather(x, m.input_order, axis=-1)  # (B, S, K), features in the order B stores them
    if m.qdq:
        w = g.op.DequantizeLinear(m.data, m.scales, m.zero_points, axis=0, block_size=block_size)  # (K, N)
        y = g.op.MatMul(x, w)
    else:
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
    """x · Wᵀ (+ b). `quantized` reuses initializers already registered for this weight (tied lm_head).
    A float W is stored [out, in] as the checkpoint has it and read by FusedMatMul with transB
    where the provider has it: a transposed copy cost a build about half its CPU time (the
    Llama-3.2-1B shape in fp16) and held each matrix whole in memory, where [out, in] streams
    a block of rows at a time; ONNX Runtime runs both at the same speed (docs/BENCHMARKS.md)."""
    module, sources = module_name(g), source_modules(weight.sources)
    g.linears[module] = sources if quantized is None else ()  # what --float-layers patterns may name
    if quantized is None and target.quantizes(module, sources):
        bits = target.quantization.bits_for(module, sources)
        quantized = quantized_weight(g, weight, target.quantization, target.io_dtype, bits)
    if quantized is not None:
        y = matmul_nbits(g, x, quantized, target)
    elif target.provider.fused_matmul and not target.standard_ops:
        y = g.ms.FusedMatMul(x, stored_float.matrix(g, "weight", weight, target), transB=1)  # (B, S, in) · (out, in)ᵀ
    else:
        y = g.op.MatMul(x, stored_float.matrix(g, "weight", weight.transpose(), target))  # [out, in] -> [in, out]
    if bias is not None:
        y = g.op.Add(y, g.weight("bias", bias.astype(target.io_dtype)))
    return y
