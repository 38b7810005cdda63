"""The quantizer's compiled single-pass kernels (numba), imported only when numba is installed.

Each function does, per block, exactly the float32 arithmetic that builder/quantize.py's numpy
path does, in the same order, so both give the same bytes (tests/test_quantize_kernel.py). They
release the GIL, so the writer's threads quantize different tensors on different cores. Compiled
on first use and cached next to this file (`cache=True`).

Written so that LLVM vectorizes the per-element loops: every hot loop indexes an array from 0
with a counter that starts at 0 (a slice per block, not `w[i, start + j]`). numba wraps negative
indices, and an index it cannot prove non-negative costs a compare and select per element, which
kept these loops scalar: 5-8× slower.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F0, F1, HALF = np.float32(0), np.float32(1), np.float32(0.5)


@njit(nogil=True, cache=True)
def widen_bf16(bits, out):
    """bfloat16 values (their uint16 bits) [n, k] into float32 `out` [n, k]: the float32 whose top
    half they are, exactly what ml_dtypes' cast gives (NaNs included), in one vectorized pass."""
    flat_in = bits.reshape(-1)
    flat_out = out.reshape(-1).view(np.uint32)
    for j in range(flat_in.size):
        flat_out[j] = np.uint32(flat_in[j]) << np.uint32(16)


@njit(nogil=True, cache=True, error_model="numpy")
def block_params(w, block_size, bits, symmetric, scales, zps):
    """Round-to-nearest scale (float32, before the cast to the stored dtype) and zero point per block.
    A row's blocks first get their min, max and first element, then their parameters in one loop
    across blocks, with selects where the numpy path has np.where (so it vectorizes; numpy's error
    model lets a 0/0 that a select then drops pass without a check)."""
    n, k = w.shape
    k_blocks = scales.shape[1]
    top = np.float32((1 << bits) - 1)
    mid = np.float32(1 << (bits - 1))
    los = np.empty(k_blocks, np.float32)
    his = np.empty(k_blocks, np.float32)
    firsts = np.empty(k_blocks, np.float32)
    for i in range(n):
        row = w[i]
        for b in range(k_blocks):
            start = b * block_size
            x = row[start:min(start + block_size, k)]
            lo = x[0]
            hi = x[0]
            for j in range(x.size):
                lo = min(lo, x[j])
                hi = max(hi, x[j])
            if x.size < block_size:  # the zero padding past K
                lo = min(lo, F0)
                hi = max(hi, F0)
            los[b] = lo
            his[b] = hi
            firsts[b] = x[0]
        row_scales = scales[i]
        row_zps = zps[i]
        if symmetric:
            for b in range(k_blocks):
                lo, hi = los[b], his[b]
                m = hi if abs(hi) > abs(lo) else lo
                # A block of ±0: its first element's sign, as ONNX Runtime's min/max keep it.
                m = firsts[b] if m == F0 else m
                row_scales[b] = -m / mid
                row_zps[b] = mid
        else:
            for b in range(k_blocks):
                # Which of equal zeros min/max return cannot matter here: hi − lo and −lo / s are
                # the same for ±0 (an all-zero block's hi and lo are the same element: s = +0).
                lo = min(los[b], F0)
                hi = max(his[b], F0)
                s = (hi - lo) / top
                zp = F0 - lo / s if s != F0 else lo
                t = np.trunc(zp)
                rounded = t + F1 if zp - t >= HALF else t  # roundf: halves away from zero
                row_scales[b] = s
                row_zps[b] = F0 if zp < F0 else (top if zp > top else rounded)


@njit(nogil=True, cache=True)
def encode(w, block_size, bits, stored, zps, data):
    """clamp(roundf(w · (1 / scale) + zp), 0, top) packed into data [n, k_blocks·block_size·bits/8]."""
    n, k = w.shape
    k_blocks = stored.shape[1]
    top = np.float32((1 << bits) - 1)
    codes = np.zeros(k_blocks * block_size, np.uint8)  # the padding past K keeps code 0
    for i in range(n):
        row = w[i]
        for b in range(k_blocks):
            start = b * block_size
            x = row[start:min(start + block_size, k)]
            c = codes[start:start + x.size]
            s = stored[i, b]
            r = F1 / s if s != F0 else F0
            z = zps[i, b]
            for j in range(x.size):
                v = x[j] * r + z
                q = np.rint(v)
                q += np.float32(v - q == HALF)  # rint halves to even; roundf away from zero
                q = min(max(q, F0), top)
                c[j] = np.uint8(np.int32(q))
        out = data[i]
        if bits == 8:
            for j in range(out.size):
                out[j] = codes[j]
        else:
            for j in range(out.size):
                out[j] = codes[2 * j] | (codes[2 * j + 1] << np.uint8(4))


# Blocks searched side by side: the search's arrays are [block_size, TILE], element j of TILE
# blocks, so every step is a few vector operations across blocks (16 float32 to an AVX-512
# register). Measured: 16 or 32 blocks are 2-3× slower than 64 (loop overhead per row of the tile).
TILE = 64


@njit(nogil=True, cache=True)
def search(w, block_size, bits, symmetric, factors, scales, zps):
    """quantize._search per block: in place, the RTN (scales, zps) become the least-error candidate's."""
    n, k = w.shape
    k_blocks = scales.shape[1]
    total = n * k_blocks
    top = np.float32((1 << bits) - 1)
    bs = np.float32(block_size)
    half = block_size // 2
    x = np.empty((block_size, TILE), np.float32)
    importance = np.empty((block_size, TILE), np.float32)
    weighted = np.empty((block_size, TILE), np.float32)
    p_xl = np.empty((half, TILE), np.float32)
    p_ll = np.empty((half, TILE), np.float32)
    lo = np.empty(TILE, np.float32)
    scale0 = np.empty(TILE, np.float32)
    zp0 = np.empty(TILE, np.float32)
    s = np.empty(TILE, np.float32)
    r = np.empty(TILE, np.float32)
    z = np.empty(TILE, np.float32)
    rms = np.empty(TILE, np.float32)
    best_err = np.empty(TILE, np.float32)
    best_s = np.empty(TILE, np.float32)
    best_z = np.empty(TILE, np.float32)
    rows = np.empty(TILE, np.int64)
    cols = np.empty(TILE, np.int64)
    for first in range(0, total, TILE):
        # Load TILE blocks transposed; past the last block, all-zero blocks whose results are
        # dropped. (Row and block advance by counting: an integer division per block cost more
        # than a candidate's whole evaluation.)
        i, c = first // k_blocks, first % k_blocks
        for t in range(TILE):
            rows[t] = i
            cols[t] = c
            size = 0
            scale0[t] = F0
            zp0[t] = F0
            if i < n:
                start = c * block_size
                v = w[i, start:min(start + block_size, k)]
                size = v.size
                for j in range(size):
                    x[j, t] = v[j]
                scale0[t] = scales[i, c]
                zp0[t] = zps[i, c]
                c += 1
                if c == k_blocks:
                    i, c = i + 1, 0
            for j in range(size, block_size):
                x[j, t] = F0
        # The block's RMS by quantize._block_sum's halving order (the first level fused in).
        for j in range(half):
            for t in range(TILE):
                p_xl[j, t] = x[j, t] * x[j, t] + x[j + half, t] * x[j + half, t]
        _tile_halving_sum(p_xl, half)
        for t in range(TILE):
            rms[t] = np.sqrt(p_xl[0, t] / bs)
            lo[t] = x[0, t]
        for j in range(1, block_size):
            for t in range(TILE):
                lo[t] = min(lo[t], x[j, t])
        for t in range(TILE):
            lo[t] = min(lo[t], F0)
            best_err[t] = np.inf
            best_s[t] = scale0[t]
            best_z[t] = zp0[t]
        for j in range(block_size):
            for t in range(TILE):
                importance[j, t] = rms[t] + abs(x[j, t])
                weighted[j, t] = importance[j, t] * x[j, t]
        for f in factors:
            for t in range(TILE):
                s[t] = scale0[t] / f
                r[t] = F1 / s[t] if s[t] != F0 else F0
            if symmetric:
                for t in range(TILE):
                    z[t] = zp0[t]
            else:
                for t in range(TILE):
                    z[t] = min(max(np.rint(-lo[t] / s[t]) if s[t] != F0 else F0, F0), top)
            # Σ weighted·l and Σ importance·l² (l = q − z), by halving: the first level, the pairs
            # (j, j + half), computed as they are made.
            for j in range(half):
                for t in range(TILE):
                    a = min(max(np.rint(x[j, t] * r[t] + z[t]), F0), top) - z[t]
                    c = min(max(np.rint(x[j + half, t] * r[t] + z[t]), F0), top) - z[t]
                    p_xl[j, t] = weighted[j, t] * a + weighted[j + half, t] * c
                    p_ll[j, t] = importance[j, t] * a * a + importance[j + half, t] * c * c
            _tile_halving_sum(p_xl, half)
            _tile_halving_sum(p_ll, half)
            for t in range(TILE):
                sum_xl, sum_ll = p_xl[0, t], p_ll[0, t]
                err = -(sum_xl * sum_xl / sum_ll) if sum_ll > F0 else -F0
                if err < best_err[t]:
                    best_err[t] = err
                    best_s[t] = sum_xl / sum_ll if sum_ll > F0 else s[t]
                    best_z[t] = z[t]
        for t in range(TILE):
            if rows[t] < n:
                scales[rows[t], cols[t]] = best_s[t]
                zps[rows[t], cols[t]] = best_z[t]


@njit(nogil=True, cache=True)
def _tile_halving_sum(p, size):
    """Σ over the first `size` rows of p [·, TILE] by halving, in place: the sums end in p[0]."""
    half = size
    while half > 1:
        half //= 2
        for j in range(half):
            for t in range(TILE):
                p[j, t] = p[j, t] + p[j + half, t]
