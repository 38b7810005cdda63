"""GGUF's quantized blocks (ggml-quants.c's block_q4_0 ... block_q6_k) as MatMulNBits blocks,
value for value: a quantized build writes what the file stores, nothing re-quantized.

Every type below stores, per block of 32 or 16 values along a row, integer codes, a scale and
(some) a minimum: w = scale·code + minimum, or scale·(code − middle). The scale of a K-quant's
sub-block is a product of an fp16 super-block scale and a 4-, 6- or 8-bit integer, exact in
float32, as is its minimum. MatMulNBits holds (code − zero point)·scale; a minimum, which an
integer zero point cannot express, is a per-block float offset (`stored_blocks.Blocks.offsets`: the block's
inputs summed, times the offset, added — exact in real arithmetic). The zero point is the code
range's middle where middle·scale + minimum is a float32 exactly (the weights then centred, as
accuracy_level 4's int8 activations want), else 0 with the minimum itself as the offset.

| type | bits, block | value | MatMulNBits |
|---|---|---|---|
| Q4_0 | 4, 32 | d·(q − 8) | 4-bit, implicit zero point |
| Q8_0 | 8, 32 | d·q (int8) | 8-bit, q + 128, implicit zero point |
| Q4_1 | 4, 32 | d·q + m | 4-bit, zero point, offset |
| Q5_0 | 5, 32 | d·(q − 16) | 8-bit, q + 112, implicit zero point |
| Q5_1 | 5, 32 | d·q + m | 8-bit, q + 112, zero point, offset |
| Q2_K | 2, 16 | d·sc·q − dmin·m | 4-bit, zero point, offset |
| Q3_K | 3, 16 | d·(sc − 32)·q, q in −4..3 | 4-bit, q + 8, implicit zero point |
| Q4_K | 4, 32 | d·sc·q − dmin·m | 4-bit, zero point, offset |
| Q5_K | 5, 32 | d·sc·q − dmin·m | 8-bit, q + 112, zero point, offset |
| Q6_K | 6, 16 | d·sc·(q − 32) | 8-bit, q + 96, implicit zero point |

Scales and offsets take the build's IO dtype: exact in float32; in fp16 a K-quant's d·sc may round.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from builder.mapped_pages import row_ranges
from builder.stored_blocks import BlockArrays, Blocks, pack_codes

QK_K = 256  # a K-quant's super-block
CHUNK_BYTES = 8 << 20  # of the file decoded at once
# type -> (MatMulNBits bits, block size)
LAYOUT = {"Q4_0": (4, 32), "Q8_0": (8, 32), "Q4_1": (4, 32), "Q5_0": (8, 32), "Q5_1": (8, 32), "Q2_K": (4, 16),
          "Q3_K": (4, 16), "Q4_K": (4, 32), "Q5_K": (8, 32), "Q6_K": (8, 16)}
WITH_MINIMUM = ("Q4_1", "Q5_1", "Q2_K", "Q4_K", "Q5_K")


def _f16(raw: np.ndarray) -> np.ndarray:
    """[..., 2] bytes -> float32 [...] of their fp16 value."""
    return np.ascontiguousarray(raw).view(np.float16)[..., 0].astype(np.float32)


def _low_high(qs: np.ndarray) -> np.ndarray:
    """[..., m] bytes -> [..., 2m]: the m low nibbles, then the m high ones."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _bit_planes(qh: np.ndarray, planes: int, width: int) -> np.ndarray:
    """[..., width] bytes -> [..., planes, width]: bit i of every byte, for i < planes."""
    return (qh[..., None, :] >> np.arange(planes, dtype=np.uint8)[:, None]) & 1


def _k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K's 12 bytes -> 6-bit scales and minimums [..., 8] (ggml-quants.c get_scale_min_k4)."""
    d, m, md = scales[..., 0:4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc.astype(np.float32), mn.astype(np.float32)


def decode(kind: str, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A row-major [n, bytes per row] of `kind` -> (codes uint8 [n, K], scales float32 [n, K/block],
    minimums float32 [n, K/block] or None), all exact: w = scale·code + minimum, or without a
    minimum w = scale·(code − 2^(bits−1)) (the codes shifted to MatMulNBits' implicit zero point)."""
    n = raw.shape[0]
    if kind in ("Q4_0", "Q8_0", "Q4_1", "Q5_0", "Q5_1"):
        b = raw.reshape(n, -1, {"Q4_0": 18, "Q8_0": 34, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24}[kind])
        d = _f16(b[..., 0:2])
        if kind == "Q8_0":
            return (b[..., 2:] ^ np.uint8(0x80)).reshape(n, -1), d, None  # int8 q -> q + 128
        if kind == "Q4_0":
            return _low_high(b[..., 2:]).reshape(n, -1), d, None  # element j low, j + 16 high
        if kind == "Q4_1":
            return _low_high(b[..., 4:]).reshape(n, -1), d, _f16(b[..., 2:4])
        rest = b[..., 4:] if kind == "Q5_1" else b[..., 2:]  # qh (32 bits, element j's fifth bit), qs
        high = _bit_planes(rest[..., 0:4], 8, 4).transpose(0, 1, 3, 2).reshape(n, -1, 32)  # bit j of the 32
        q = _low_high(rest[..., 4:]) | (high << 4)
        if kind == "Q5_0":
            return (q + np.uint8(112)).reshape(n, -1), d, None  # d·(q − 16) = d·(q + 112 − 128)
        return q.reshape(n, -1), d, _f16(b[..., 2:4])  # d·q + m
    b = raw.reshape(n, -1, {"Q2_K": 84, "Q3_K": 110, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind])
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
        sc, mn = _k_scale_min(b[..., 4:16])
        qs = b[..., -128:].reshape(n, -1, 4, 32)  # sub-block 2i: low nibbles of qs[32i:32i+32], 2i+1: high
        q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(n, -1, 8, 32)
        if kind == "Q5_K":  # sub-block i's fifth bits: bit i of qh's 32 bytes
            q = q | (_bit_planes(b[..., 16:48], 8, 32) << 4)
        return q.reshape(n, -1), (d * sc).reshape(n, -1), (-(dmin * mn)).reshape(n, -1)
    if kind == "Q2_K":
        scales, qs = b[..., 0:16], b[..., 16:80].reshape(n, -1, 2, 32)
        d, dmin = _f16(b[..., 80:82])[..., None], _f16(b[..., 82:84])[..., None]
        q = (qs[:, :, :, None, :] >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (n, sb, 2, 4, 32)
        return (q.reshape(n, -1), (d * (scales & 0x0F)).reshape(n, -1),
                (-(dmin * (scales >> 4))).reshape(n, -1))
    if kind == "Q3_K":
        hmask, qs, packed, d = b[..., 0:32], b[..., 32:96], b[..., 96:108], _f16(b[..., 108:110])[..., None]
        low = (packed[..., 0:8, None] >> np.array([0, 4], np.uint8)) & 0x0F  # (n, sb, 8, 2)
        high = (packed[..., 8:12, None] >> np.array([0, 2, 4, 6], np.uint8)) & 0x03  # (n, sb, 4, 4)
        sc = low.transpose(0, 1, 3, 2).reshape(n, -1, 16) | (high.transpose(0, 1, 3, 2).reshape(n, -1, 16) << 4)
        ql = (qs.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (n, sb, 2, 4, 32)
        hbit = _bit_planes(hmask, 8, 32)  # (n, sb, 8, 32)
        q = ql.reshape(n, -1, 8, 32) + 4 * hbit + np.uint8(4)  # (ql − 4·(1 − hbit)) + 8
        return q.reshape(n, -1), (d * (sc.astype(np.float32) - 32)).reshape(n, -1), None
    ql, qh, sc, d = b[..., 0:128], b[..., 128:192], b[..., 192:208], _f16(b[..., 208:210])[..., None]  # Q6_K
    low = np.stack([ql.reshape(n, -1, 2, 64) & 0x0F, ql.reshape(n, -1, 2, 64) >> 4], axis=3)  # (n, sb, 2, 2, 64)
    high = (qh.reshape(n, -1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (n, sb, 2, 4, 32)
    q = low.reshape(n, -1, 8, 32) | (high.reshape(n, -1, 8, 32) << 4)
    return (q + np.uint8(96)).reshape(n, -1), (d * sc.view(np.int8)).reshape(n, -1), None




def centred(code_bits: int, shift: int, scales: np.ndarray, minimums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zero points and offsets for w = scale·code + minimum, the codes stored plus `shift`: the zero
    point is the codes' middle (plus shift) where middle·scale + minimum is a float32 exactly (the
    offset), else `shift` (offset: the minimum itself). Both in float64 are exact sums."""
    middle = 1 << (code_bits - 1)
    want = minimums.astype(np.float64) + middle * scales.astype(np.float64)
    offsets = want.astype(np.float32)
    exact = offsets.astype(np.float64) == want
    return np.where(exact, middle + shift, shift).astype(np.uint8), np.where(exact, offsets, minimums)


CODE_BITS = {"Q4_1": 4, "Q5_1": 5, "Q2_K": 2, "Q4_K": 4, "Q5_K": 5}


def gguf_blocks(kind: str, shape: tuple[int, int], read: Callable) -> Blocks:
    """The Blocks of one 2-D tensor of `kind` (LAYOUT's types); `read(stack)` gives its raw bytes
    [rows, bytes per row], rows in Hugging Face's order. Decoded CHUNK_BYTES of the file at a time,
    each range's mapped pages given back once decoded: a tensor's working set is its decoded arrays,
    not those and all of its file bytes too (gemma-3-270m's Q8_0 vocabulary: 178 MB of file)."""
    bits, block = LAYOUT[kind]
    n, k = shape
    with_minimum = kind in WITH_MINIMUM

    def decoded(raw: np.ndarray) -> BlockArrays:
        rows = raw.shape[0]
        codes, scales, minimums = decode(kind, np.asarray(raw))
        if not with_minimum:
            return BlockArrays(pack_codes(codes.reshape(rows, k // block, block), bits, 8), scales, None)
        shift = 112 if bits == 8 else 0  # 5-bit codes as 8-bit: centred on 128 like Q5_0's
        data = pack_codes(codes.reshape(rows, k // block, block) + np.uint8(shift), bits, 8)
        zero_points, offsets = centred(CODE_BITS[kind], shift, scales, minimums)
        return BlockArrays(data, scales, pack_codes(zero_points, bits, 8), offsets)

    def compute(stack) -> BlockArrays:
        raw = read(stack)
        if raw.nbytes <= CHUNK_BYTES:
            return decoded(raw)
        whole = None
        for start, rows in row_ranges(raw, CHUNK_BYTES):
            piece = decoded(rows)
            if whole is None:
                whole = BlockArrays(*(None if a is None else np.empty((n, *a.shape[1:]), a.dtype) for a in piece))
            for target, part in zip(whole, piece):
                if target is not None:
                    target[start:start + len(rows)] = part
        return whole

    return Blocks(bits, block, compute, kind, zero_points=with_minimum, offsets=with_minimum)
