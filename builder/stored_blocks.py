"""Pre-quantized blocks: a weight the checkpoint already stores quantized, in MatMulNBits' layout.

GGUF's Q4_0, Q8_0, Q4_1 and K-quants, AWQ and GPTQ store a weight as blocks of codes with a scale
(and a zero point, or a per-block float offset). Such a weight's `Weight` carries its `Blocks`, so an
int4 or int8 build writes the stored codes as they are instead of re-quantizing float values.
`Blocks` are lazy like the weight: `compute` maps the stored arrays when the tensor is written, and
the steps here (`rows`, `concat`, `reblocked`, `widened`) are exact rewrites of the codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

log = logging.getLogger("builder")


class BlockArrays(NamedTuple):
    """A pre-quantized weight's arrays in MatMulNBits' layout (see Blocks)."""

    data: np.ndarray  # uint8 [N, k_blocks, block_size·bits/8]
    scales: np.ndarray  # [N, k_blocks]
    zero_points: np.ndarray | None  # uint8 [N, ceil(k_blocks·bits/8)], packed like data; None: 2^(bits−1)
    offsets: np.ndarray | None = None  # float32 [N, k_blocks], added to every value of the block


@dataclass(frozen=True)
class Blocks:
    """A weight the checkpoint already stores quantized in a layout MatMulNBits reads as is (GGUF's
    Q4_0, Q8_0, Q4_1, K-quants, AWQ, GPTQ): `compute` yields BlockArrays — B uint8
    [N, k_blocks, block_size·bits/8], the scales [N, k_blocks], the zero points (uint8
    [N, ceil(k_blocks·bits/8)], packed like B, or None when implicit, 2^(bits−1)) and, for formats
    with a per-block minimum (GGUF Q4_1, Q4_K, ...), each block's float offset — so the weight is

        w[n, input_order[j]] = (code[n, j] − zero point)·scale + offset   (j's block's)

    An offset is written as a second, small product: the sum of each block's inputs times the
    [k_blocks, N] offsets (blocks.linear). `input_order` (GPTQ act-order) permutes K so that each
    group's rows are one block: MatMulNBits reads the activation gathered in that order.
    The Weight that carries it computes the same values in float, for float builds."""

    bits: int
    block_size: int
    compute: Callable[[contextlib.ExitStack], BlockArrays]
    kind: str  # the source format, for messages ("Q4_0", "awq")
    zero_points: bool = False  # whether compute yields explicit zero points
    offsets: bool = False  # whether compute yields offsets
    input_order: np.ndarray | None = field(default=None, compare=False)  # int64 [K], or None: K in order

    def _with(self, compute, **changes) -> Blocks:
        return dataclasses.replace(self, compute=compute, **changes)

    def widened(self) -> Blocks:
        """The same values as 8-bit codes (4-bit code c is 8-bit code c + 120, a zero point z is
        z + 120): exact."""
        if self.bits == 8:
            return self
        inner = self.compute

        def compute(stack):
            data, scales, zp, offsets = inner(stack)
            codes = unpack_codes(data, 4)
            if zp is not None:
                zp = unpack_codes(zp, 4)[:, : scales.shape[1]] + np.uint8(120)
            return BlockArrays(codes + np.uint8(120), scales, zp, offsets)

        return self._with(compute, bits=8)

    def explicit(self) -> Blocks:
        """The same blocks with their implicit zero points written out."""
        if self.zero_points:
            return self
        inner, bits = self.compute, self.bits

        def compute(stack):
            data, scales, _, offsets = inner(stack)
            n, k_blocks = scales.shape
            middle = 1 << (bits - 1)
            fill = middle | (middle << 4) if bits == 4 else middle
            return BlockArrays(data, scales, np.full((n, -(-k_blocks * bits // 8)), fill, np.uint8), offsets)

        return self._with(compute, zero_points=True)

    def with_offsets(self) -> Blocks:
        """The same blocks with offsets of zero written out."""
        if self.offsets:
            return self
        inner = self.compute

        def compute(stack):
            data, scales, zp, _ = inner(stack)
            return BlockArrays(data, scales, zp, np.zeros(scales.shape, np.float32))

        return self._with(compute, offsets=True)

    def reblocked(self, block_size: int) -> Blocks:
        """The same values in blocks of `block_size` (a divisor of this block size): each block's
        codes split in place, its scale, zero point and offset repeated. Exact."""
        if block_size == self.block_size:
            return self
        inner, bits, repeat = self.compute, self.bits, self.block_size // block_size

        def compute(stack):
            data, scales, zp, offsets = inner(stack)
            n, k_blocks = scales.shape
            data = data.reshape(n, k_blocks * repeat, -1)  # codes are contiguous along K
            scales = np.repeat(scales, repeat, axis=1)
            offsets = None if offsets is None else np.repeat(offsets, repeat, axis=1)
            if zp is not None:
                zp = np.repeat(unpack_codes(zp, 4)[:, :k_blocks] if bits == 4 else zp, repeat, axis=1)
                zp = zp[:, 0::2] | (zp[:, 1::2] << 4) if bits == 4 else zp  # k_blocks·repeat is even
            return BlockArrays(data, scales, zp, offsets)

        return self._with(compute, block_size=block_size)

    def rows(self, start: int, stop: int) -> Blocks:
        """Rows [start, stop) of the weight (gate or up of a fused gate_up): each row's blocks,
        scales, zero points and offsets are its own, so this is exact."""
        inner = self.compute

        def compute(stack):
            return BlockArrays(*(None if a is None else a[start:stop] for a in inner(stack)))

        return self._with(compute)

    @staticmethod
    def concat(parts: Sequence[Blocks]) -> Blocks | None:
        """Rows of several pre-quantized weights joined (a fused QKV), or None when their block
        sizes do not divide each other or their input orders differ (then the fused weight is
        quantized from its float values, and a warning says so); blocks of different sizes are
        joined at the smallest, mixed 4- and 8-bit parts as 8-bit, mixed implicit and explicit
        zero points as explicit, parts without offsets given offsets of zero."""
        orders = [b.input_order for b in parts]
        if any(o is not None for o in orders) and not all(
                o is not None and np.array_equal(o, orders[0]) for o in orders):
            log.warning("%s: fused parts with different act-order permutations (g_idx) are re-quantized from "
                        "their exact float values", "+".join(b.kind for b in parts))
            return None
        block = min(b.block_size for b in parts)
        if any(b.block_size % block for b in parts):
            return None
        parts = [b.reblocked(block) for b in parts]
        if len({b.bits for b in parts}) != 1:
            parts = [b.widened() for b in parts]
        if len({b.zero_points for b in parts}) != 1:
            parts = [b.explicit() for b in parts]
        if len({b.offsets for b in parts}) != 1:
            parts = [b.with_offsets() for b in parts]
        computes = [b.compute for b in parts]

        def compute(stack):
            arrays = [c(stack) for c in computes]
            return BlockArrays(*(None if column[0] is None else np.concatenate(column) for column in zip(*arrays)))

        first = parts[0]
        return first._with(compute, kind="+".join(dict.fromkeys(b.kind for b in parts)))


def pack_codes(values: np.ndarray, bits: int, pad_value: int = 0) -> np.ndarray:
    """Packs uint8 values along the last axis, 8/bits per byte, low bits first (MatMulNBits' and
    ONNX's int4 order); an odd count's last high nibble is `pad_value`."""
    if bits == 8:
        return values
    if values.shape[-1] % 2:
        values = np.concatenate([values, np.full((*values.shape[:-1], 1), pad_value, np.uint8)], axis=-1)
    return values[..., 0::2] | (values[..., 1::2] << 4)


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """pack_codes undone: uint8 [..., m] -> [..., m·8/bits] (a padded last code kept)."""
    if bits == 8:
        return packed
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)
