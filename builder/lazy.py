"""Lazy weights: a recipe (shape, dtype, a function) that yields its array only when written.

A `Weight` starts as a source (a checkpoint tensor, a computed table) and grows by cheap, lazy
steps: `transpose`, `astype`, `map` (an arbitrary numpy function such as Gemma's `1 + w`),
`slice` and `concat`. Nothing runs until `numpy()` is called — which `to_ir` defers to the moment
`ir.save` writes the tensor. Views (transpose, slices) cost nothing; the final copy into a
contiguous array of the target dtype does the transpose and the cast in one pass. A stack (a
mixture of experts' [E, N, K]) is written one member at a time (`StreamedTensor`), so its memory is
one expert's, not the layer's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from builder.mapping import release

log = logging.getLogger("builder")

# A step receives the ExitStack that owns any memory mappings and returns an array (maybe a view).
Compute = Callable[[contextlib.ExitStack], np.ndarray]


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
            codes = _nibbles(data)
            if zp is not None:
                zp = _nibbles(zp)[:, : scales.shape[1]] + np.uint8(120)
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
                zp = np.repeat(_nibbles(zp)[:, :k_blocks] if bits == 4 else zp, repeat, axis=1)
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


def _nibbles(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., m] of two 4-bit values a byte (element 2j low) -> [..., 2m]."""
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


class Weight:
    """An array described by its shape and dtype, computed on demand.

    Example:
        >>> w = Weight.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        >>> w.transpose().astype(np.float16).shape
        (3, 2)
        >>> w.transpose().numpy().tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """

    __slots__ = ("shape", "dtype", "_compute", "sources", "blocks", "pieces")

    def __init__(self, shape: Sequence[int], dtype: np.dtype | type, compute: Compute, sources: tuple[str, ...],
                 blocks: Blocks | None = None, pieces: tuple[Weight, ...] | None = None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._compute = compute
        self.sources = sources  # checkpoint names it reads, for messages and build records
        self.blocks = blocks  # the same values already quantized (a GGUF Q4_0 tensor), or None
        self.pieces = pieces  # a stack's members (value[i] is pieces[i]): written one at a time

    def __repr__(self) -> str:
        return f"Weight({list(self.shape)}, {self.dtype.name}, from {', '.join(self.sources) or 'code'})"

    @classmethod
    def source(cls, shape: Sequence[int], dtype: np.dtype, open_view: Compute, name: str) -> Weight:
        return cls(shape, dtype, open_view, (name,))

    @classmethod
    def constant(cls, array: np.ndarray) -> Weight:
        return cls(array.shape, array.dtype, lambda _: array, ())

    @classmethod
    def computed(cls, shape: Sequence[int], dtype: np.dtype | type, fn: Callable[[], np.ndarray]) -> Weight:
        """A table made by code (rotary caches): `fn` runs at write time, then its result is dropped."""
        return cls(shape, dtype, lambda _: fn(), ())

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def transpose(self) -> Weight:
        """Reverses a 2-D weight's axes: Hugging Face's [out, in] becomes MatMul's [in, out]."""
        if len(self.shape) != 2:
            raise ValueError(f"transpose expects a 2-D weight, got {self.shape}")
        inner = self._compute
        return Weight(self.shape[::-1], self.dtype, lambda s: inner(s).T, self.sources)

    def astype(self, dtype: np.dtype | type) -> Weight:
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        if self.pieces is not None:  # still a stack, so still written one member at a time
            return Weight.stack([p.astype(dtype) for p in self.pieces])
        inner = self._compute
        # The cast itself happens in numpy() when the result is copied out, fused with the layout copy.
        return Weight(self.shape, dtype, lambda s: _Cast(inner(s), dtype), self.sources)

    def map(self, fn: Callable[[np.ndarray], np.ndarray], dtype: np.dtype | type | None = None) -> Weight:
        """Applies a numpy function (same shape) at write time, e.g. `lambda w: w + 1`."""
        inner = self._compute
        out_dtype = np.dtype(dtype) if dtype is not None else self.dtype
        return Weight(self.shape, out_dtype, lambda s: fn(_resolve(inner(s))), self.sources)

    def slice(self, axis: int, start: int, stop: int) -> Weight:
        """Rows or columns [start, stop) along `axis` (a view until written)."""
        shape = list(self.shape)
        if not 0 <= start < stop <= shape[axis]:
            raise ValueError(f"slice [{start}, {stop}) out of range for axis {axis} of {self.shape}")
        shape[axis] = stop - start
        index = tuple(slice(start, stop) if a == axis else slice(None) for a in range(len(shape)))
        inner = self._compute
        blocks = self.blocks.rows(start, stop) if self.blocks is not None and axis == 0 and len(shape) == 2 else None
        return Weight(shape, self.dtype, lambda s: inner(s)[index], self.sources, blocks)

    @staticmethod
    def concat(weights: Sequence[Weight], axis: int = 0) -> Weight:
        """Joins weights along `axis` (QKV fusion); they must share dtype and the other dims.
        When written, each part is copied straight into its slice of the output: the fused
        tensor is never held twice."""
        first = weights[0]
        if len(weights) == 1:
            return first
        shape = list(first.shape)
        axis %= len(shape)
        for w in weights[1:]:
            if w.dtype != first.dtype or len(w.shape) != len(shape) or any(
                a != b for i, (a, b) in enumerate(zip(w.shape, shape)) if i != axis
            ):
                raise ValueError(f"cannot concatenate {w} with {first} along axis {axis}")
        shape[axis] = sum(w.shape[axis] for w in weights)
        parts = [w._compute for w in weights]
        blocks = None
        if axis == 0 and all(w.blocks is not None for w in weights):
            blocks = Blocks.concat([w.blocks for w in weights])
        return Weight(shape, first.dtype, lambda s: _Concat([p(s) for p in parts], axis),
                      tuple(n for w in weights for n in w.sources), blocks)

    @staticmethod
    def stack(weights: Sequence[Weight]) -> Weight:
        """Stacks equal weights along a new first axis (a mixture of experts' [E, N, K]). Written
        by `ir.save`, one member at a time goes to the file (`to_ir`); `numpy()` copies each
        member into its own slice of the output."""
        first = weights[0]
        for w in weights[1:]:
            if w.dtype != first.dtype or w.shape != first.shape:
                raise ValueError(f"cannot stack {w} with {first}")
        parts = [w._compute for w in weights]
        return Weight((len(weights), *first.shape), first.dtype,
                      lambda s: _Concat([_expand(p(s)) for p in parts], 0),
                      tuple(n for w in weights for n in w.sources), pieces=tuple(weights))

    @classmethod
    def filled(cls, shape: Sequence[int], dtype: np.dtype | type, fill: Callable[[np.ndarray], None],
               sources: tuple[str, ...]) -> Weight:
        """An array that `fill(out)` writes piece by piece into a fresh `out` at write time (an
        expert's interleaved gate and up rows); `numpy()` hands `out` over as is, so the result is
        held once. `sources`: the checkpoint tensors it reads."""
        dtype = np.dtype(dtype)

        def compute(_stack) -> _Filled:
            out = np.empty(tuple(shape), dtype)
            fill(out)
            return _Filled(out)

        return cls(shape, dtype, compute, sources)

    def numpy(self) -> np.ndarray:
        """Runs the recipe: a C-contiguous array of `dtype` that owns its memory."""
        if self.pieces is not None:
            out = np.empty(self.shape, self.dtype)
            for i, piece in enumerate(self.pieces):
                out[i] = piece.numpy()
            return out
        with contextlib.ExitStack() as stack:
            value = self._compute(stack)
            if isinstance(value, _Filled):
                return value.array
            if isinstance(value, _Cast):
                value = value.array
            out = np.empty(self.shape, self.dtype)
            _copy_parts(out, value)  # one pass: layout change and cast together
            del value
        return out

    def apply(self, fn: Callable[[np.ndarray], np.ndarray]):
        """Runs `fn` on the recipe's value while its mappings are open (for consumers, such as the
        quantizer, that read a large source chunk by chunk instead of copying it whole).
        `fn` must return arrays that own their memory."""
        with contextlib.ExitStack() as stack:
            return fn(self._compute(stack))

    def to_ir(self, name: str) -> ir.LazyTensor:
        """An `ir.LazyTensor` whose bytes are this recipe, computed when `ir.save` writes it; a
        stack's bytes are computed and written one member at a time."""
        if self.pieces is not None:
            pieces = self.pieces
            return StreamedTensor(lambda: ir.Tensor(self.numpy(), name=name), lambda: (p.numpy() for p in pieces),
                                  self.dtype, self.shape, name)
        if self.nbytes > STREAM_BYTES and len(self.shape) >= 1:
            return StreamedTensor(lambda: ir.Tensor(self.numpy(), name=name), self._row_blocks, self.dtype,
                                  self.shape, name)
        return ir.LazyTensor(
            lambda: ir.Tensor(self.numpy(), name=name),
            dtype=ir.DataType.from_numpy(self.dtype),
            shape=ir.Shape(self.shape),
            name=name,
        )


    def _row_blocks(self) -> Iterator[np.ndarray]:
        """The value in blocks of rows, each converted and its source pages handed back before the
        next: a large table read row by row (an embedding, an untied lm_head in float) is written
        holding one block of it. A recipe whose rows are not contiguous in its source (a transposed
        weight, whose rows gather from every source page) or that is computed whole (`map`,
        `filled`) comes as one piece, as numpy() makes it."""
        with contextlib.ExitStack() as stack:
            value = self._compute(stack)
            if isinstance(value, _Filled):
                yield value.array
                return
            source = value.array if isinstance(value, _Cast) else value
            if not (isinstance(source, np.ndarray) and source.flags.c_contiguous):
                out = np.empty(self.shape, self.dtype)
                _copy_parts(out, source)  # as numpy() does
                yield out
                return
            row = max(1, self.nbytes // self.shape[0])
            step = max(1, ROW_BLOCK_BYTES // row)
            for r in range(0, self.shape[0], step):
                block = value[r : r + step]
                out = np.empty((min(step, self.shape[0] - r), *self.shape[1:]), self.dtype)
                np.copyto(out, block.array if isinstance(block, _Cast) else block, casting="unsafe")
                release(block)
                yield out


TILE = 128  # 128×128 tiles of a transposed copy stay in the L2 cache of both source and target


ROW_BLOCK_BYTES = 16 * 2**20  # source bytes converted between two releases of mapped pages
# Tensors larger than this are written a block of rows at a time where their recipe allows it.
STREAM_BYTES = 64 * 2**20


def copy_into(out: np.ndarray, value: np.ndarray) -> None:
    """out[...] = value with casting, a block of source rows at a time, handing each block's mapped
    pages back once copied. A transposed 2-D source (a weight going from [out, in] to [in, out]) is
    copied tile by tile, 2-4× faster than numpy's element-strided copy for weight-sized matrices."""
    if value.ndim == 2 and not value.flags.c_contiguous and value.T.flags.c_contiguous and value.size > TILE * TILE:
        rows, cols = value.shape  # the source's rows are value's columns
        step = max(TILE, ROW_BLOCK_BYTES // max(rows * value.itemsize, 1) // TILE * TILE)
        for c0 in range(0, cols, step):
            for r in range(0, rows, TILE):
                for c in range(c0, min(c0 + step, cols), TILE):
                    np.copyto(out[r : r + TILE, c : c + TILE], value[r : r + TILE, c : c + TILE], casting="unsafe")
            release(value[:, c0 : c0 + step])
    elif value.ndim >= 1 and value.flags.c_contiguous and value.nbytes > ROW_BLOCK_BYTES:
        step = max(1, ROW_BLOCK_BYTES // max(value[0].nbytes, 1))
        for r in range(0, len(value), step):
            np.copyto(out[r : r + step], value[r : r + step], casting="unsafe")
            release(value[r : r + step])
    else:
        np.copyto(out, value, casting="unsafe")


class _Cast:
    """A pending cast: the array is still in its source dtype until `numpy()` copies it out."""

    __slots__ = ("array", "dtype")

    def __init__(self, array: np.ndarray, dtype: np.dtype):
        self.array = array
        self.dtype = dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.asarray(self.array).astype(self.dtype)
        return out if dtype is None else out.astype(dtype, copy=False)

    @property
    def T(self) -> _Cast:  # noqa: N802 - mirrors ndarray.T so views stay pending
        return _Cast(self.array.T, self.dtype)

    def __getitem__(self, index) -> _Cast:
        return _Cast(self.array[index], self.dtype)


class _Filled:
    """An array `Weight.filled` wrote: already the result, not to be copied again."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


class _Concat:
    """Parts joined along `axis`, not yet copied: `numpy()` writes each part into its slice of the
    output; row slices (the quantizer's chunks) touch only the parts they cover."""

    __slots__ = ("parts", "axis")

    def __init__(self, parts: list, axis: int):
        self.parts = parts
        self.axis = axis

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.parts[0].shape)
        shape[self.axis] = sum(p.shape[self.axis] for p in self.parts)
        return tuple(shape)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.concatenate([np.asarray(p) for p in self.parts], axis=self.axis)
        return out if dtype is None else out.astype(dtype, copy=False)

    @property
    def T(self) -> _Concat:  # noqa: N802 - mirrors ndarray.T so views stay pending
        return _Concat([p.T for p in self.parts], len(self.parts[0].shape) - 1 - self.axis)

    def __getitem__(self, index):
        if self.axis != 0 or not isinstance(index, slice) or index.step not in (None, 1):
            return np.asarray(self)[index]
        start, stop, _ = index.indices(self.shape[0])
        pieces, offset = [], 0
        for p in self.parts:
            low, high = max(start - offset, 0), min(stop - offset, p.shape[0])
            if low < high:
                pieces.append(p[low:high])
            offset += p.shape[0]
        return pieces[0] if len(pieces) == 1 else _Concat(pieces, 0)


def _expand(value):
    """value[None] for an array, a pending cast or a pending concatenation."""
    if isinstance(value, _Filled):
        return value.array[None]
    if isinstance(value, _Concat):
        return _Concat([_expand(p) for p in value.parts], value.axis + 1)
    return value[None]


def _copy_parts(out: np.ndarray, value) -> None:
    """copy_into, writing a pending concatenation's parts into their slices of `out`."""
    if not isinstance(value, _Concat):
        copy_into(out, np.asarray(value) if isinstance(value, _Cast) else value)
        return
    offset = 0
    for part in value.parts:
        n = part.shape[value.axis]
        index = tuple(slice(offset, offset + n) if a == value.axis else slice(None) for a in range(out.ndim))
        _copy_parts(out[index], part)
        offset += n


def _resolve(value) -> np.ndarray:
    """Materializes a pending cast or concatenation when a step needs real values."""
    if isinstance(value, _Cast):
        return np.asarray(value.array).astype(value.dtype)
    if isinstance(value, _Concat):
        return np.asarray(value)
    return value


class SharedResult:
    """One computation feeding several lazy tensors (a quantized weight's data, scales and zero
    points): whichever tensor the writer asks for first runs it; each part is dropped once taken."""

    def __init__(self, compute: Callable[[], dict[str, np.ndarray]]):
        self._compute = compute
        self._lock = threading.Lock()
        self._parts: dict[str, np.ndarray] | None = None
        self._taken: set[str] = set()

    def take(self, part: str) -> np.ndarray:
        with self._lock:
            if part in self._taken:
                raise RuntimeError(f"part {part!r} of a shared lazy result was already written")
            if self._parts is None:
                self._parts = self._compute()
            self._taken.add(part)
            value = self._parts.pop(part)
            if not self._parts:
                self._parts = None  # a later writer of the same model recomputes from scratch
                self._taken.clear()
            return value

    def tensor(self, part: str, shape: Sequence[int], dtype: np.dtype | type, name: str) -> ir.LazyTensor:
        return ir.LazyTensor(
            lambda: ir.Tensor(self.take(part), name=name),
            dtype=ir.DataType.from_numpy(np.dtype(dtype)),
            shape=ir.Shape(shape),
            name=name,
        )


class StreamedTensor(ir.LazyTensor):
    """An `ir.LazyTensor` that `ir.save` writes piece by piece: onnx_ir's external-data writer seeks
    to the tensor's offset and calls its `tofile(file)` (onnx_ir/external_data.py, `_write_tensor_at`,
    onnx_ir 1.1), so only one piece (one expert of a stack) is in memory at a time. `pieces()`
    yields C-contiguous arrays whose bytes, one after another, are the tensor's: each is written by
    `ir.Tensor.tofile`, as the whole array would be. `whole()` is the tensor for any other reader."""

    __slots__ = ("_pieces",)

    def __init__(self, whole: Callable[[], ir.TensorProtocol], pieces: Callable[[], Iterator[np.ndarray]],
                 dtype: np.dtype, shape: Sequence[int], name: str):
        super().__init__(whole, dtype=ir.DataType.from_numpy(np.dtype(dtype)), shape=ir.Shape(shape), name=name)
        self._pieces = pieces

    def tofile(self, file) -> None:
        for piece in self._pieces():
            ir.Tensor(piece).tofile(file)
            del piece  # before the next one is computed


class StackedResult:
    """One computation per expert feeding several stacked tensors (a QMoE's codes, scales and zero
    points, each [E, ...]): `compute(e)` returns expert e's piece of every part. The `main` part
    (the codes, by far the largest) streams into the file one expert at a time; the pieces of the
    other parts are kept as they go by and handed over when the writer asks for them (waiting for a
    stream under way). Asked for a by-product first, or for the whole main tensor, it computes all
    experts at once instead and keeps the main part whole until taken."""

    def __init__(self, count: int, compute: Callable[[int], dict[str, np.ndarray]],
                 parts: dict[str, tuple[Sequence[int], np.dtype]], main: str = "data"):
        self._count, self._compute, self._parts, self._main = count, compute, parts, main
        self._state = threading.Condition()
        self._streaming = False
        self._failed: BaseException | None = None
        self._ready: dict[str, np.ndarray] | None = None  # parts computed, not yet taken
        self._taken: set[str] = set()

    def tensor(self, part: str, name: str) -> ir.LazyTensor:
        shape, dtype = self._parts[part]
        if part == self._main:
            return StreamedTensor(lambda: ir.Tensor(self._take(part), name=name), self._stream, dtype, shape, name)
        return ir.LazyTensor(lambda: ir.Tensor(self._take(part), name=name),
                             dtype=ir.DataType.from_numpy(np.dtype(dtype)), shape=ir.Shape(shape), name=name)

    def _empty(self, part: str) -> np.ndarray:
        shape, dtype = self._parts[part]
        return np.empty(tuple(shape), dtype)

    def _stream(self) -> Iterator[np.ndarray]:
        with self._state:
            self._state.wait_for(lambda: not self._streaming)
            whole = self._take_locked(self._main) if self._ready is not None else None
            if whole is None:
                self._streaming, self._failed = True, None
        if whole is not None:  # already computed whole (a by-product was asked for first)
            yield from whole
            return
        kept = {p: self._empty(p) for p in self._parts if p != self._main}
        try:
            for e in range(self._count):
                result = self._compute(e)
                for p, array in kept.items():
                    array[e] = result[p]
                yield result.pop(self._main)
                del result
        except BaseException as error:
            with self._state:
                self._streaming, self._failed = False, error
                self._state.notify_all()
            raise
        with self._state:
            self._streaming, self._ready = False, kept
            self._taken.add(self._main)
            self._reset_if_done()
            self._state.notify_all()

    def _take(self, part: str) -> np.ndarray:
        with self._state:
            self._state.wait_for(lambda: not self._streaming)
            if self._failed is not None:
                raise RuntimeError(f"the computation of part {part!r} failed") from self._failed
            if self._ready is None:
                self._ready = self._compute_all()
            return self._take_locked(part)

    def _take_locked(self, part: str) -> np.ndarray:
        if part in self._taken:
            raise RuntimeError(f"part {part!r} of a stacked lazy result was already written")
        value = self._ready.pop(part)
        self._taken.add(part)
        self._reset_if_done()
        return value

    def _reset_if_done(self) -> None:
        if self._taken == set(self._parts):  # a later writer of the same model recomputes from scratch
            self._ready, self._taken = None, set()

    def _compute_all(self) -> dict[str, np.ndarray]:
        out = {p: self._empty(p) for p in self._parts}
        for e in range(self._count):
            for p, array in self._compute(e).items():
                out[p][e] = array
        return out
