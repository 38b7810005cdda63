"""Block-wise round-to-nearest quantization into MatMulNBits' layout, in numpy, bit-exact with
ONNX Runtime's own quantizer (MLAS `BlockwiseQuantizer`, used by `MatMulNBitsQuantizer`).

For a weight W [N, K] (Hugging Face's [out, in]: no transpose), each row is cut into blocks of
`block_size` along K (the last one zero-padded). Per block, in float32:

- symmetric: m = the value of largest magnitude (the more negative one on a tie);
  scale = −m / 2^(bits−1); zero point 2^(bits−1) (implicit, not stored).
- asymmetric: lo = min(min, 0), hi = max(max, 0); scale = (hi − lo) / (2^bits − 1);
  zero point = clamp(round(−lo / scale), 0, 2^bits − 1).

The scale is stored in the scales' dtype, and the values are quantized against that stored scale:
q = clamp(round(w · (1 / scale) + zp), 0, 2^bits − 1), `round` halving away from zero (C's roundf).
4-bit values pack two per byte along K, element 2j in the low nibble; the padding past K holds
code 0. Zero points pack the same way along the blocks of a row, an odd count padded with the
nibble 8 as ONNX Runtime writes it. (For an odd K, ONNX Runtime's last high nibble is whatever its
loop left there; we write 0. Hidden sizes are even, so real models never meet this.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from builder.mapped_pages import release
from builder.stored_blocks import pack_codes

BLOCK_SIZES = (16, 32, 64, 128, 256)
BITS = (4, 8)
# rtn: ONNX Runtime's round-to-nearest; search: each block's scale chosen for least squared error.
METHODS = ("rtn", "search")
# Elements quantized at a time (whole rows): bounds the float32 temporaries to ~4 MB each.
ROW_CHUNK_ELEMENTS = 1 << 20
# The compiled kernels (builder/_kernel.py) when numba is installed; tests switch this off to run
# the numpy path, which gives the same bytes.
USE_KERNEL = True
# Smaller matrices stay on numpy (same bytes): a toy model's build (hidden sizes up to ~128) then
# never pays numba's ~0.5 s import and cache load. Anything larger pays it back at once: numpy's
# search costs ~70 ns a weight against the kernel's 2.5, so SmolLM2-135M's int4 build (matrices of
# 0.3-0.9 M elements, below the earlier 2^20) takes 1.0 s instead of 5-8 s (docs/BENCHMARKS.md).
KERNEL_MIN_ELEMENTS = 1 << 16
_KERNEL: list = []
TINY = np.float32(np.finfo(np.float32).tiny)  # the least normal float32


def _kernel():
    """builder._kernel, or None without numba. Imported on first use: numba takes ~0.3 s to import.
    Without it a build says once that it quantizes in numpy (the same bytes, 5-25× the CPU time)."""
    if not _KERNEL:
        try:
            from builder import _kernel as kernel
        except ImportError as e:
            kernel = None
            logging.getLogger("builder").warning(
                "the compiled quantizer is unavailable (%s): quantizing in numpy, the same bytes at 5-25x the "
                "CPU time; `pip install numba` restores it", e)
        _KERNEL.append(kernel)
    return _KERNEL[0]


@dataclass(frozen=True)
class QuantizedMatrix:
    """MatMulNBits' B [N, k_blocks, block_size·bits/8] uint8, scales [N, k_blocks], zero points."""

    data: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None


def packed_shapes(n: int, k: int, bits: int, block_size: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Shapes of (B, scales, zero_points) for a [N, K] weight."""
    k_blocks = -(-k // block_size)
    return (n, k_blocks, block_size * bits // 8), (n, k_blocks), (n, -(-k_blocks * bits // 8))


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: halves go away from zero (numpy's rint goes to even). Exact in float32."""
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _quantize_rows(w: np.ndarray, bits: int, block_size: int, symmetric: bool, scale_dtype: np.dtype,
                   method: str = "rtn"):
    """Quantizes float32 rows [n, K]; returns (codes uint8 [n, kb, bs], scales, zero points uint8 [n, kb])."""
    n, k = w.shape
    k_blocks = -(-k // block_size)
    if k_blocks * block_size != k:
        w = np.pad(w, ((0, 0), (0, k_blocks * block_size - k)))
    blocks = w.reshape(n, k_blocks, block_size)
    lo, hi = _block_min_max(blocks)
    top = np.float32((1 << bits) - 1)
    if symmetric:
        m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        # An all-zero block: ONNX Runtime's min and max keep the first of equal values, so a block
        # of ±0 takes its first element's sign (its scale's sign bit is in the output's bytes).
        m = np.where(m == 0, blocks[:, :, 0], m)
        scales = (-m / np.float32(1 << (bits - 1))).astype(scale_dtype)
        zp = np.full((n, k_blocks), 1 << (bits - 1), np.float32)
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scale = (hi - lo) / top
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scale != 0, np.float32(0) - lo / scale, lo)
        zp = np.where(zp_f < 0, 0, np.where(zp_f > top, top, round_half_away(zp_f))).astype(np.float32)
        scales = scale.astype(scale_dtype)
    if method == "search":
        scales, zp = _search(blocks, scales.astype(np.float32), zp, top, symmetric)
        scales = scales.astype(scale_dtype)
    codes = _codes(blocks, scales.astype(np.float32), zp, top)
    if k_blocks * block_size != k:
        # ONNX Runtime leaves the padding's codes at 0. (Zero padding cannot change a block's
        # scale: min(·, 0) / max(·, 0) and the largest magnitude ignore added zeros.)
        codes.reshape(n, -1)[:, k:] = 0
    return codes, scales, zp.astype(np.uint8)


def _quantize_rows_compiled(kernel, chunk, data: np.ndarray, bits: int, block_size: int, symmetric: bool,
                            scale_dtype: np.dtype, method: str):
    """_quantize_rows by the compiled kernel in one pass over the chunk, writing the packed codes into
    `data`; returns (scales in scale_dtype, zero points uint8)."""
    n = chunk.shape[0]
    scales = np.empty((n, data.shape[1]), np.float32)
    zps = np.empty((n, data.shape[1]), np.uint8)
    source, kind = _kernel_source(kernel, chunk)
    factors = _SEARCH_FACTORS_F32 if method == "search" else _NO_FACTORS
    kernel.quantize_blocks(source, kind, block_size, bits, symmetric, kernel.SCALE_KINDS[scale_dtype.name], factors,
                           scales, zps, data.reshape(n, -1))
    return scales.astype(scale_dtype), zps


_NO_FACTORS = np.empty(0, np.float32)


def _kernel_source(kernel, chunk) -> tuple[np.ndarray, int]:
    """A chunk of rows as the kernel reads it, C-contiguous, and its source kind: bfloat16 and
    float16 as their uint16 bits (the kernel widens them, exactly), float32 as it is, anything
    else cast by numpy. A pending chunk (pending_values.PendingConcat: rows across fused parts) is
    joined in its own dtype first, not widened by numpy."""
    chunk = np.asarray(chunk)
    if chunk.dtype.itemsize == 2:
        if chunk.dtype.name == "bfloat16":
            return np.ascontiguousarray(chunk).view(np.uint16), kernel.SOURCE_BFLOAT16
        if chunk.dtype == np.float16:
            return np.ascontiguousarray(chunk).view(np.uint16), kernel.SOURCE_FLOAT16
    return np.ascontiguousarray(chunk, dtype=np.float32), kernel.SOURCE_FLOAT32


def _reciprocal(scales: np.ndarray) -> np.ndarray:
    """1 / scale, and 0 for a scale of 0 (ONNX Runtime's rule) or below float32's least normal: a
    subnormal scale's reciprocal overflows to inf, and a zero weight times inf is NaN, whose
    conversion to an integer code is undefined; such a block's codes are its zero point instead (it
    dequantizes to 0, against weights under 1e-37)."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(np.abs(scales) >= TINY, np.float32(1) / scales, np.float32(0)).astype(np.float32)


def _codes(blocks: np.ndarray, stored: np.ndarray, zp: np.ndarray, top: np.float32) -> np.ndarray:
    """clamp(roundf(w · (1 / scale) + zp), 0, top) as uint8, with ONNX Runtime's arithmetic."""
    reciprocal = _reciprocal(stored)
    x = blocks * reciprocal[:, :, None]  # in place from here on: one float32 chunk of scratch
    x += zp[:, :, None]
    codes = np.rint(x)
    # rint halves to even; roundf halves away from zero. Only ties differ, and only those at
    # +n.5 matter: negative values clip to 0 whichever way they round.
    np.subtract(x, codes, out=x)
    codes += x == 0.5
    np.clip(codes, 0, top, out=codes)
    return codes.astype(np.uint8)


# Scale search: the round-to-nearest scale divided by each of these (llama.cpp's make_qx_quants
# tries max / (nmax + 0.1·i), i in −9..9). Each candidate's codes then get their least-squares scale.
# Seven, 0.84 to 1.08: on SmolLM2-135M's and on random Gaussian weights, factors above 1.1 were
# almost never chosen and 0.9, the lower end of the earlier 21 (0.9 to 1.15 by 0.0125), often was;
# these seven give the same or a lower weighted error at a third of the cost; SmolLM2's perplexity
# with them: asymmetric +16.7% (21 factors: +17.8%), symmetric +28.5% (+27.3%) (docs/BENCHMARKS.md).
# 1 (RTN's own scale) stays among them.
SEARCH_FACTORS = tuple(1 + 0.04 * i for i in range(-4, 3))
_SEARCH_FACTORS_F32 = np.array(SEARCH_FACTORS, np.float32)


def _search(blocks: np.ndarray, scale0: np.ndarray, zp0: np.ndarray, top: np.float32, symmetric: bool):
    """Per block, the (scale, integer zero point) of least weighted squared error among candidates.

    For each candidate scale s (the RTN scale over SEARCH_FACTORS), the zero point is the
    RTN one for that range (symmetric: fixed), the codes are round-to-nearest, and the scale is
    then refitted by weighted least squares for those codes (a = importance, l = q − z):
    s* = Σ a·w·l / Σ a·l², whose error is Σ a·w² − (Σ a·w·l)² / Σ a·l². The candidate with the
    least error wins; RTN's own scale is among the candidates (factor 1), so no block gets worse
    than RTN's codes at the refitted scale. Vectorized over the chunk, one candidate at a time.
    """
    best_err = np.full(scale0.shape, np.inf, np.float32)
    best_s, best_z = scale0.copy(), zp0.copy()
    lo = hi = None
    if not symmetric:
        lo, hi = _block_min_max(blocks)
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
    x, scratch = np.empty_like(blocks), np.empty_like(blocks)
    # llama.cpp's weighting without an importance matrix (quantize_row_q4_K_ref): the block's RMS
    # plus the value's own magnitude, so large weights are kept closer.
    importance = np.sqrt(_block_sum(blocks * blocks) / np.float32(blocks.shape[2]))[:, :, None]
    importance = importance + np.abs(blocks)
    weighted = importance * blocks
    for f in SEARCH_FACTORS:
        s = scale0 / np.float32(f)
        if symmetric:
            z = zp0
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                z = np.clip(np.rint(np.where(s != 0, -lo / s, 0)), 0, top).astype(np.float32)
        r = _reciprocal(s)
        np.multiply(blocks, r[:, :, None], out=x)
        x += z[:, :, None]
        np.rint(x, out=x)
        np.clip(x, 0, top, out=x)
        x -= z[:, :, None]  # q − z
        sum_xl = _block_sum(weighted * x)
        np.multiply(importance, x, out=scratch)
        scratch *= x
        sum_ll = _block_sum(scratch)
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = np.where(sum_ll > 0, sum_xl * sum_xl / sum_ll, 0)
        err = -gain  # Σ w² is the same for every candidate
        better = err < best_err
        best_err = np.where(better, err, best_err)
        with np.errstate(divide="ignore", invalid="ignore"):
            fitted = np.where(sum_ll > 0, sum_xl / sum_ll, s)
        best_s = np.where(better, fitted, best_s)
        best_z = np.where(better, z, best_z)
    return best_s.astype(np.float32), best_z


def _block_sum(x: np.ndarray) -> np.ndarray:
    """Per-block sum by halving: a fixed order of float32 additions that the compiled kernel repeats."""
    half = x.shape[2] // 2
    s = x[:, :, :half] + x[:, :, half:]
    while half > 1:
        half //= 2
        s[:, :, :half] += s[:, :, half : 2 * half]
    return s[:, :, 0]


def _block_min_max(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-block min and max by halving (numpy's reductions over a short last axis are slow)."""
    half = blocks.shape[2] // 2
    lo = np.minimum(blocks[:, :, :half], blocks[:, :, half:])
    hi = np.maximum(blocks[:, :, :half], blocks[:, :, half:])
    while half > 1:
        half //= 2
        np.minimum(lo[:, :, :half], lo[:, :, half : 2 * half], out=lo[:, :, :half])
        np.maximum(hi[:, :, :half], hi[:, :, half : 2 * half], out=hi[:, :, :half])
    return lo[:, :, 0], hi[:, :, 0]


def quantize(rows, bits: int = 4, block_size: int = 32, symmetric: bool = True,
             scale_dtype: np.dtype | type = np.float32, method: str = "rtn") -> QuantizedMatrix:
    """Quantizes a [N, K] weight (any float dtype; arithmetic in float32), a chunk of rows at a time.

    Example:
        >>> q = quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32))
        >>> q.data.shape, q.scales.shape, q.zero_points
        ((2, 1, 16), (2, 1), None)
    """
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    n, k = rows.shape
    data_shape, scales_shape, zp_shape = packed_shapes(n, k, bits, block_size)
    data = np.empty(data_shape, np.uint8)
    scales = np.empty(scales_shape, scale_dtype)
    zero_points = None if symmetric else np.empty(zp_shape, np.uint8)
    step = max(1, ROW_CHUNK_ELEMENTS // max(k, 1))
    kernel = _kernel() if USE_KERNEL and n * k >= KERNEL_MIN_ELEMENTS else None
    if kernel is not None and np.dtype(scale_dtype).name not in kernel.SCALE_KINDS:
        kernel = None  # a scale dtype the kernel does not round to: the numpy path
    for start in range(0, n, step):
        stop = min(n, start + step)
        if kernel is not None:
            s, zp = _quantize_rows_compiled(kernel, rows[start:stop], data[start:stop], bits, block_size,
                                            symmetric, np.dtype(scale_dtype), method)
        else:
            chunk = np.asarray(rows[start:stop], dtype=np.float32)
            codes, s, zp = _quantize_rows(chunk, bits, block_size, symmetric, np.dtype(scale_dtype), method)
            data[start:stop] = pack_codes(codes, bits, 0)
            del chunk
        scales[start:stop] = s
        if zero_points is not None:
            zero_points[start:stop] = pack_codes(zp, bits, 1 << (bits - 1))
        release(rows[start:stop])  # a mapped source's pages for these rows are no longer needed
    return QuantizedMatrix(data, scales, zero_points)


def dequantize(q: QuantizedMatrix, k: int, bits: int = 4) -> np.ndarray:
    """float32 [N, K] from a QuantizedMatrix: (code − zero point) · scale (for tests and checks)."""
    n, k_blocks, _ = q.data.shape
    if bits == 4:
        codes = np.stack([q.data & 0x0F, q.data >> 4], axis=-1).reshape(n, k_blocks, -1)
    else:
        codes = q.data
    if q.zero_points is None:
        zp = np.full((n, k_blocks), 1 << (bits - 1), np.float32)
    elif bits == 4:
        zp = np.stack([q.zero_points & 0x0F, q.zero_points >> 4], axis=-1).reshape(n, -1)[:, :k_blocks]
    else:
        zp = q.zero_points
    w = (codes.astype(np.float32) - zp[:, :, None].astype(np.float32)) * q.scales.astype(np.float32)[:, :, None]
    return w.reshape(n, -1)[:, :k]
