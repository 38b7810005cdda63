"""The quantizer's compiled single-pass kernels (numba), imported only when numba is installed.

Each function does, per block, exactly the float32 arithmetic that builder/quantize.py's numpy
path does, in the same order, so both give the same bytes (tests/test_quantize_kernel.py). They
release the GIL, so the writer's threads quantize different tensors on different cores. Compiled
on first use and cached next to this file (`cache=True`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

F0, F1, HALF = np.float32(0), np.float32(1), np.float32(0.5)


@njit(nogil=True, cache=True)
def _load(w, i, start, k, block_size, out):
    """Row i's block from column `start` into `out` as float32, zeros past K."""
    for j in range(block_size):
        out[j] = w[i, start + j] if start + j < k else F0


@njit(nogil=True, cache=True)
def _halving_sum(p, buf, block_size):
    """Σ p by halving, the order of quantize._block_sum (pairs j, j + half, then the halves' pairs)."""
    half = block_size // 2
    for j in range(half):
        buf[j] = p[j] + p[j + half]
    while half > 1:
        half //= 2
        for j in range(half):
            buf[j] = buf[j] + buf[j + half]
    return buf[0]


@njit(nogil=True, cache=True)
def _min_max(x, block_size):
    lo = x[0]
    hi = x[0]
    for j in range(1, block_size):
        lo = min(lo, x[j])
        hi = max(hi, x[j])
    return lo, hi


@njit(nogil=True, cache=True)
def block_params(w, block_size, bits, symmetric, scales, zps):
    """Round-to-nearest scale (float32, before the cast to the stored dtype) and zero point per block."""
    n, k = w.shape
    k_blocks = scales.shape[1]
    top = np.float32((1 << bits) - 1)
    mid = np.float32(1 << (bits - 1))
    x = np.empty(block_size, np.float32)
    for i in range(n):
        for b in range(k_blocks):
            _load(w, i, b * block_size, k, block_size, x)
            lo, hi = _min_max(x, block_size)
            if symmetric:
                m = hi if abs(hi) > abs(lo) else lo
                scales[i, b] = -m / mid
                zps[i, b] = mid
            else:
                lo = min(lo, F0)
                hi = max(hi, F0)
                s = (hi - lo) / top
                zp = F0 - lo / s if s != F0 else lo
                if zp < F0:
                    zp = F0
                elif zp > top:
                    zp = top
                else:  # roundf: halves away from zero
                    t = np.trunc(zp)
                    zp = t + F1 if zp - t >= HALF else t
                scales[i, b] = s
                zps[i, b] = zp


@njit(nogil=True, cache=True)
def encode(w, block_size, bits, stored, zps, data):
    """clamp(roundf(w · (1 / scale) + zp), 0, top) packed into data [n, k_blocks, block_size·bits/8]."""
    n, k = w.shape
    k_blocks = stored.shape[1]
    top = np.float32((1 << bits) - 1)
    x = np.empty(block_size, np.float32)
    c = np.empty(block_size, np.uint8)
    for i in range(n):
        for b in range(k_blocks):
            start = b * block_size
            _load(w, i, start, k, block_size, x)
            s = stored[i, b]
            r = F1 / s if s != F0 else F0
            z = zps[i, b]
            for j in range(block_size):
                v = x[j] * r + z
                q = np.rint(v)
                if v - q == HALF:
                    q += F1
                q = min(max(q, F0), top)
                c[j] = np.uint8(q) if start + j < k else np.uint8(0)
            if bits == 8:
                for j in range(block_size):
                    data[i, b, j] = c[j]
            else:
                for j in range(block_size // 2):
                    data[i, b, j] = c[2 * j] | (c[2 * j + 1] << np.uint8(4))


# Blocks searched side by side: the search's arrays are [block_size, TILE], element j of TILE
# blocks, so every step is one vector operation across blocks (16 float32: one AVX-512 register).
TILE = 64


@njit(nogil=True, cache=True)
def search(w, block_size, bits, symmetric, factors, scales, zps):
    """quantize._search per block: in place, the RTN (scales, zps) become the least-error candidate's."""
    n, k = w.shape
    k_blocks = scales.shape[1]
    total = n * k_blocks
    top = np.float32((1 << bits) - 1)
    bs = np.float32(block_size)
    x = np.empty((block_size, TILE), np.float32)
    importance = np.empty((block_size, TILE), np.float32)
    weighted = np.empty((block_size, TILE), np.float32)
    p_xl = np.empty((block_size, TILE), np.float32)
    p_ll = np.empty((block_size, TILE), np.float32)
    lo = np.empty(TILE, np.float32)
    scale0 = np.empty(TILE, np.float32)
    zp0 = np.empty(TILE, np.float32)
    s = np.empty(TILE, np.float32)
    r = np.empty(TILE, np.float32)
    z = np.empty(TILE, np.float32)
    best_err = np.empty(TILE, np.float32)
    best_s = np.empty(TILE, np.float32)
    best_z = np.empty(TILE, np.float32)
    for first in range(0, total, TILE):
        # Load TILE blocks transposed; past the last block, all-zero blocks whose results are dropped.
        for t in range(TILE):
            g = first + t
            if g < total:
                i, b = g // k_blocks, g % k_blocks
                start = b * block_size
                for j in range(block_size):
                    x[j, t] = w[i, start + j] if start + j < k else F0
                scale0[t] = scales[i, b]
                zp0[t] = zps[i, b]
            else:
                for j in range(block_size):
                    x[j, t] = F0
                scale0[t] = F0
                zp0[t] = F0
        for j in range(block_size):
            for t in range(TILE):
                p_xl[j, t] = x[j, t] * x[j, t]
        _tile_halving_sum(p_xl, block_size)
        for t in range(TILE):
            lo[t] = x[0, t]
        for j in range(1, block_size):
            for t in range(TILE):
                lo[t] = min(lo[t], x[j, t])
        for t in range(TILE):
            lo[t] = min(lo[t], F0)
            best_err[t] = np.inf
            best_s[t] = scale0[t]
            best_z[t] = zp0[t]
            p_xl[1, t] = np.sqrt(p_xl[0, t] / bs)  # the block's RMS
        for j in range(block_size):
            for t in range(TILE):
                importance[j, t] = p_xl[1, t] + abs(x[j, t])
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
            for j in range(block_size):
                for t in range(TILE):
                    q = min(max(np.rint(x[j, t] * r[t] + z[t]), F0), top) - z[t]
                    p_xl[j, t] = weighted[j, t] * q
                    p_ll[j, t] = importance[j, t] * q * q
            _tile_halving_sum(p_xl, block_size)
            _tile_halving_sum(p_ll, block_size)
            for t in range(TILE):
                sum_xl, sum_ll = p_xl[0, t], p_ll[0, t]
                err = -(sum_xl * sum_xl / sum_ll) if sum_ll > F0 else -F0
                if err < best_err[t]:
                    best_err[t] = err
                    best_s[t] = sum_xl / sum_ll if sum_ll > F0 else s[t]
                    best_z[t] = z[t]
        for t in range(TILE):
            g = first + t
            if g < total:
                scales[g // k_blocks, g % k_blocks] = best_s[t]
                zps[g // k_blocks, g % k_blocks] = best_z[t]


@njit(nogil=True, cache=True)
def _tile_halving_sum(p, block_size):
    """_halving_sum of each column of p [block_size, TILE], in place: the sums end in p[0]."""
    half = block_size
    while half > 1:
        half //= 2
        for j in range(half):
            for t in range(TILE):
                p[j, t] = p[j, t] + p[j + half, t]
