"""The quantizer's compiled kernel (numba), imported only when numba is installed.

One pass over a chunk of rows does all of a block's work while the block is in registers and L1:
read it (bfloat16 or float16 widened exactly on the way), its round-to-nearest scale and zero point, the
scale search, the scale's rounding to the stored dtype, the codes and their packing. Per block it
does exactly the float32 arithmetic that builder/quantize.py's numpy path does, in the same order,
so both give the same bytes (tests/test_quantize_kernel.py). It releases the GIL, so the writer's
threads quantize different tensors on different cores. Compiled on first use and cached next to
this file (`cache=True`).

Blocks are worked TILE at a time, transposed into [block_size, TILE] tiles, so that every step is a
few vector operations across blocks (16 float32 to an AVX-512 register). Written so that LLVM
vectorizes those loops: every hot loop indexes an array from 0 with a counter that starts at 0.
numba wraps negative indices, and an index it cannot prove non-negative costs a compare and select
per element, which kept such loops scalar: 5-8× slower.
"""

from __future__ import annotations

import sys

import numpy as np
from llvmlite import ir as llvm_ir
from numba import njit, types
from numba.extending import intrinsic

if sys.byteorder != "little":  # the codes are packed into words as little-endian bytes
    raise ImportError("builder._kernel packs codes little-endian; the numpy path serves this machine")

F0, F1, HALF = np.float32(0), np.float32(1), np.float32(0.5)
TINY = np.float32(np.finfo(np.float32).tiny)  # the least normal float32: 1/s is finite from here up

# The source's dtype, as quantize_blocks takes it (`source_kind`): float16 and bfloat16 arrive as
# their uint16 bits (numba has no 16-bit floats).
SOURCE_FLOAT32, SOURCE_BFLOAT16, SOURCE_FLOAT16 = 0, 1, 2

# The stored scale's dtype, as quantize_blocks takes it (`scale_kind`), and by the dtype's name.
SCALE_FLOAT32, SCALE_FLOAT16, SCALE_BFLOAT16 = 0, 1, 2
SCALE_KINDS = {"float32": SCALE_FLOAT32, "float16": SCALE_FLOAT16, "bfloat16": SCALE_BFLOAT16}

# Blocks worked side by side. Measured: 16 or 32 blocks are 2-3× slower than 64 (loop overhead per
# row of the tile).
TILE = 64


@njit(nogil=True, cache=True, error_model="numpy")
def quantize_blocks(src, source_kind, block_size, bits, symmetric, scale_kind, factors, scales, zps, data):
    """Quantizes rows src [n, k] into MatMulNBits' layout: float32, or (`source_kind`) uint16 holding
    bfloat16 or float16 bits, widened exactly as the tile is loaded.

    scales [n, k_blocks] float32 receives each block's scale already rounded to the stored dtype
    (`scale_kind`), zps [n, k_blocks] uint8 its zero point (unpacked), data [n, k_blocks·block_size·
    bits/8] uint8 the packed codes. `factors` empty: round-to-nearest; otherwise the search
    (quantize._search) over the RTN scale divided by each factor."""
    n, k = src.shape
    k_blocks = scales.shape[1]
    total = n * k_blocks
    dense = k == k_blocks * block_size  # then a tile's blocks are one contiguous run of src
    flat = src.reshape(-1)
    flat_scales = scales.reshape(-1)
    flat_zps = zps.reshape(-1)
    words = block_size * bits // 32  # a block's packed codes in 32-bit words (block_size ≥ 16)
    flat_words = data.reshape(-1).view(np.uint32)
    top = np.float32((1 << bits) - 1)
    mid = np.float32(1 << (bits - 1))
    x = np.empty((block_size, TILE), np.float32)
    x16 = np.empty((block_size, TILE), np.uint16)
    codes = np.empty((block_size, TILE), np.uint8)
    packed = np.empty((words, TILE), np.uint32)
    scratch = _search_scratch(block_size)
    sizes = np.empty(TILE, np.int64)  # the padded path's block lengths (the last block of a row is short)
    lo = np.empty(TILE, np.float32)
    hi = np.empty(TILE, np.float32)
    s = np.empty(TILE, np.float32)
    z = np.empty(TILE, np.float32)
    r = np.empty(TILE, np.float32)
    for first in range(0, total, TILE):
        count = min(TILE, total - first)
        # Load; past the last block, all-zero blocks whose results are dropped.
        if dense:
            run = flat[first * block_size:(first + count) * block_size]
            _load_run(run, count, block_size, source_kind, x, x16)
        else:
            for t in range(count):
                i, c = (first + t) // k_blocks, (first + t) % k_blocks
                start = c * block_size
                v = src[i, start:min(start + block_size, k)]
                sizes[t] = v.size
                for j in range(v.size):
                    x[j, t] = _widen(v[j], source_kind)
                for j in range(v.size, block_size):
                    x[j, t] = F0
        for t in range(count, TILE):
            for j in range(block_size):
                x[j, t] = F0
        # Round-to-nearest: min and max (the padding's zeros last, as they sit), then the scale and
        # zero point with selects. A NaN anywhere in the block makes both NaN, as numpy's
        # minimum/maximum do (numba's min/max, Python's rule, dropped a NaN after the first element).
        for t in range(TILE):
            lo[t] = x[0, t]
            hi[t] = x[0, t]
        for j in range(1, block_size):
            xj = x[j]
            for t in range(TILE):
                v = xj[t]
                lo[t] = v if v < lo[t] or v != v else lo[t]
                hi[t] = v if v > hi[t] or v != v else hi[t]
        if symmetric:
            for t in range(TILE):
                m = hi[t] if abs(hi[t]) > abs(lo[t]) else lo[t]
                # A block of ±0: its first element's sign, as ONNX Runtime's min/max keep it.
                m = x[0, t] if m == F0 else m
                s[t] = -m / mid
                z[t] = mid
        else:
            for t in range(TILE):
                # Which of equal zeros min/max return cannot matter here: hi − lo and −lo / s are
                # the same for ±0 (an all-zero block's hi and lo are the same element: s = +0).
                lo[t] = min(lo[t], F0)
                hi[t] = max(hi[t], F0)
                scale = (hi[t] - lo[t]) / top
                zp = F0 - lo[t] / scale if scale != F0 else lo[t]
                whole = np.trunc(zp)
                rounded = whole + F1 if zp - whole >= HALF else whole  # roundf: halves away from zero
                s[t] = scale
                z[t] = F0 if zp < F0 else (top if zp > top else rounded)
        _round_scales(s, scale_kind)
        if factors.size:
            _search(x, block_size, symmetric, top, factors, lo, s, z, scratch)
            _round_scales(s, scale_kind)
        # Codes against the stored scale: clamp(roundf(w · (1 / scale) + zp), 0, top).
        for t in range(TILE):
            r[t] = F1 / s[t] if abs(s[t]) >= TINY else F0
        for j in range(block_size):
            xj, cj = x[j], codes[j]
            for t in range(TILE):
                v = xj[t] * r[t] + z[t]
                q = np.rint(v)
                q += np.float32(v - q == HALF)  # rint halves to even; roundf away from zero
                q = min(max(q, F0), top)
                cj[t] = np.uint8(np.int32(q))
        if not dense:  # the padding past K keeps code 0
            for t in range(count):
                for j in range(sizes[t], block_size):
                    codes[j, t] = 0
        # Packed little-endian into 32-bit words across the tile (element 2j in byte j's low nibble),
        # then stored a word at a time: storing the tile's bytes one by one cost as much as the codes.
        per_word = 32 // bits
        for m in range(words):
            row = packed[m]
            for t in range(TILE):
                row[t] = np.uint32(codes[m * per_word, t])
            for e in range(1, per_word):
                shift = np.uint32(e * bits)
                c = codes[m * per_word + e]
                for t in range(TILE):
                    row[t] |= np.uint32(c[t]) << shift
        out = flat_words[first * words:(first + count) * words]
        for t in range(count):
            for m in range(words):
                out[t * words + m] = packed[m, t]
        for t in range(count):
            flat_scales[first + t] = s[t]
            flat_zps[first + t] = np.uint8(np.int32(z[t]))


@njit(nogil=True, cache=True)
def _search_scratch(block_size):
    """The search's arrays, allocated once per call: importance and weighted [block_size, TILE], the
    two halving sums [block_size / 2, TILE], and per block the RMS, the best error, scale and zero
    point so far, a candidate's scale, zero point and reciprocal."""
    half = block_size // 2
    return (np.empty((block_size, TILE), np.float32), np.empty((block_size, TILE), np.float32),
            np.empty((half, TILE), np.float32), np.empty((half, TILE), np.float32),
            np.empty(TILE, np.float32), np.empty(TILE, np.float32), np.empty(TILE, np.float32),
            np.empty(TILE, np.float32), np.empty(TILE, np.float32), np.empty(TILE, np.float32),
            np.empty(TILE, np.float32))


@njit(nogil=True, cache=True, error_model="numpy")
def _search(x, block_size, symmetric, top, factors, lo, s, z, scratch):
    """quantize._search on a tile: in place, the RTN (s, z) become the least-error candidate's.
    lo: each block's min(min, 0) (read by the asymmetric search only)."""
    importance, weighted, p_xl, p_ll, rms, best_err, best_s, best_z, cand_s, cand_z, r = scratch
    half = block_size // 2
    bs = np.float32(block_size)
    # The block's RMS by quantize._block_sum's halving order (the first level fused in).
    for j in range(half):
        for t in range(TILE):
            p_xl[j, t] = x[j, t] * x[j, t] + x[j + half, t] * x[j + half, t]
    _tile_halving_sum(p_xl, half)
    for t in range(TILE):
        rms[t] = np.sqrt(p_xl[0, t] / bs)
        best_err[t] = np.inf
        best_s[t] = s[t]
        best_z[t] = z[t]
    for j in range(block_size):
        for t in range(TILE):
            importance[j, t] = rms[t] + abs(x[j, t])
            weighted[j, t] = importance[j, t] * x[j, t]
    for f in factors:
        for t in range(TILE):
            cand_s[t] = s[t] / f
            r[t] = F1 / cand_s[t] if abs(cand_s[t]) >= TINY else F0
        if symmetric:
            for t in range(TILE):
                cand_z[t] = z[t]
        else:
            for t in range(TILE):
                cand_z[t] = min(max(np.rint(-lo[t] / cand_s[t]) if cand_s[t] != F0 else F0, F0), top)
        # Σ weighted·l and Σ importance·l² (l = q − z), by halving: the first level, the pairs
        # (j, j + half), computed as they are made.
        for j in range(half):
            # Rows as 1-D views: indexing [j, t] in the loop recomputed each address from strides.
            x0, x1, w0, w1 = x[j], x[j + half], weighted[j], weighted[j + half]
            i0, i1, xl, ll = importance[j], importance[j + half], p_xl[j], p_ll[j]
            for t in range(TILE):
                a = min(max(np.rint(x0[t] * r[t] + cand_z[t]), F0), top) - cand_z[t]
                c = min(max(np.rint(x1[t] * r[t] + cand_z[t]), F0), top) - cand_z[t]
                xl[t] = w0[t] * a + w1[t] * c
                ll[t] = i0[t] * a * a + i1[t] * c * c
        _tile_halving_sum(p_xl, half)
        _tile_halving_sum(p_ll, half)
        for t in range(TILE):
            sum_xl, sum_ll = p_xl[0, t], p_ll[0, t]
            err = -(sum_xl * sum_xl / sum_ll) if sum_ll > F0 else -F0
            if err < best_err[t]:
                best_err[t] = err
                best_s[t] = sum_xl / sum_ll if sum_ll > F0 else cand_s[t]
                best_z[t] = cand_z[t]
    for t in range(TILE):
        s[t] = best_s[t]
        z[t] = best_z[t]


@njit(nogil=True, cache=True)
def _tile_halving_sum(p, size):
    """Σ over the first `size` rows of p [·, TILE] by halving, in place: the sums end in p[0]."""
    half = size
    while half > 1:
        half //= 2
        for j in range(half):
            for t in range(TILE):
                p[j, t] = p[j, t] + p[j + half, t]


@njit(nogil=True, cache=True, error_model="numpy")
def _round_scales(s, scale_kind):
    """In place, each float32 scale to the nearest value of the stored dtype (ties to even), what
    numpy's and ml_dtypes' casts give (NaNs quieted, keeping their sign and top payload bits)."""
    if scale_kind == SCALE_FLOAT32:
        return
    u = s.view(np.uint32)
    for t in range(s.size):
        bits = u[t]
        sign = bits & np.uint32(0x80000000)
        mag = bits & np.uint32(0x7FFFFFFF)
        if scale_kind == SCALE_BFLOAT16:
            if mag > np.uint32(0x7F800000):
                u[t] = sign | np.uint32(0x7FC00000)
            else:  # overflow to ±inf falls out of the carry
                u[t] = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
        elif mag > np.uint32(0x7F800000):  # float16 from here on: NaN
            u[t] = sign | np.uint32(0x7FC00000) | (mag & np.uint32(0x007FE000))
        elif mag >= np.uint32(0x477FF000):  # 65520 and up (and inf) round to inf
            u[t] = sign | np.uint32(0x7F800000)
        elif mag < np.uint32(0x38800000):  # below float16's least normal, 2^-14: steps of 2^-24, exact
            q = np.rint(abs(s[t]) * np.float32(2.0 ** 24)) * np.float32(2.0 ** -24)
            s[t] = q
            u[t] = u[t] | sign
        else:  # drop 13 mantissa bits, ties to even; a carry moves into the exponent as it should
            u[t] = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)


@njit(nogil=True, cache=True)
def _load_run(run, count, block_size, source_kind, x, bits):
    """x[j, t] = element j of the t-th block of `run` (count whole blocks, one after another) as
    float32; one loop per source kind, so that each vectorizes (a kind's test inside the loop kept
    them all scalar). `bits` [block_size, TILE] uint16 is scratch for float16."""
    if source_kind == SOURCE_BFLOAT16:
        for j in range(block_size):
            row = x[j]
            for t in range(count):
                row[t] = _from_bfloat16(run[t * block_size + j])
    elif source_kind == SOURCE_FLOAT16:
        # Gathered as bits first, then widened in one contiguous loop: widening inside the gather
        # took 0.74 ns a weight, this 0.5.
        for j in range(block_size):
            row16 = bits[j]
            for t in range(count):
                row16[t] = run[t * block_size + j]
        flat_bits, flat_x = bits.reshape(-1), x.reshape(-1)
        for i in range(flat_x.size):
            flat_x[i] = _from_float16(flat_bits[i])
    else:
        for j in range(block_size):
            row = x[j]
            for t in range(count):
                row[t] = run[t * block_size + j]


@njit(nogil=True, cache=True)
def _widen(v, source_kind):
    """One source element as float32 (the padded rows' slower path)."""
    if source_kind == SOURCE_BFLOAT16:
        return _from_bfloat16(v)
    if source_kind == SOURCE_FLOAT16:
        return _from_float16(v)
    return np.float32(v)


@njit(nogil=True, cache=True, inline="always")
def _from_bfloat16(v):
    """A bfloat16's bits as float32: shifted into the top half, exactly ml_dtypes' cast."""
    return _f32_from_bits(np.uint32(np.uint32(v) << np.uint32(16)))


@njit(nogil=True, cache=True, inline="always")
def _from_float16(v):
    """A float16's bits as float32, exactly numpy's cast (NaN payloads and signs kept): the
    exponent rebiased (+112), subnormals and zeros as mantissa · 2^-24, infinities and NaNs to
    exponent 255."""
    h = np.uint32(v)
    magnitude = h & np.uint32(0x7FFF)
    exponent = magnitude & np.uint32(0x7C00)
    bits = np.uint32((magnitude << np.uint32(13)) + np.uint32(0x38000000))
    special = np.uint32(bits + np.uint32(0x38000000))
    small = _bits_from_f32(np.float32(magnitude) * np.float32(2.0 ** -24))
    bits = small if exponent == np.uint32(0) else (special if exponent == np.uint32(0x7C00) else bits)
    return _f32_from_bits(np.uint32(bits | ((h & np.uint32(0x8000)) << np.uint32(16))))


@intrinsic
def _f32_from_bits(typingctx, bits):
    """The float32 whose bits these uint32 are (LLVM's bitcast: no instruction)."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def _bits_from_f32(typingctx, value):
    """The bits of a float32, as uint32 (LLVM's bitcast: no instruction)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_ir.IntType(32))
    return types.uint32(types.float32), codegen
