"""Write time: how a `Weight`'s recipe becomes an array, and how arrays reach the file.

The recipe's steps leave pending values — a cast not yet done (`PendingCast`), parts not yet joined
(`PendingConcat`), rows not yet computed (`ComputedRows`), an array already filled (`FilledArray`) —
that `materialized` turns into one array in a single pass, copying each part straight into its
slice of the output, a block of source rows at a time and handing mapped pages back as it goes
(`copy_into`); `row_blocks` hands a large table over one block of rows at a time instead.

`ir.save` writes the lazy tensors from several threads. A `StreamedTensor` gives its bytes piece by
piece (through onnx_ir's private `_write_tensor_at`, which calls the tensor's `tofile`); a
`SharedResult` or `StackedResult` runs one computation that several tensors come out of (a quantized
weight's codes, scales and zero points), whichever of them is asked for first; `write_order` puts
each such by-product later, so that the threads start the next computations meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np
import onnx_ir as ir

from builder.mapped_pages import release, row_ranges

TILE = 128  # 128×128 tiles of a transposed copy stay in the L2 cache of both source and target
ROW_BLOCK_BYTES = 16 * 2**20  # source bytes converted between two releases of mapped pages
# What a value written a block of rows at a time holds: the block's source pages, its float32 work
# and the temporaries of computing it (a GGUF Q6_K block dequantized) and its output.
ROW_BLOCK_HELD = 4 * ROW_BLOCK_BYTES
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
        for r, rows in row_ranges(value, ROW_BLOCK_BYTES):
            np.copyto(out[r : r + len(rows)], rows, casting="unsafe")
    else:
        np.copyto(out, value, casting="unsafe")


class PendingCast:
    """A pending cast: the array is still in its source dtype until `materialized` copies it out."""

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
    def T(self) -> PendingCast:  # noqa: N802 - mirrors ndarray.T so views stay pending
        return PendingCast(self.array.T, self.dtype)

    def __getitem__(self, index) -> PendingCast:
        return PendingCast(self.array[index], self.dtype)


class FilledArray:
    """An array `Weight.filled` wrote: already the result, not to be copied again."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


def _row_range(index, count: int) -> tuple[int, int] | None:
    """(start, stop) where `index` takes whole rows [start, stop) of `count` (a step-1 slice, alone
    or followed by `:` for the other axes), else None."""
    rows, rest = (index[0], index[1:]) if isinstance(index, tuple) and index else (index, ())
    if not isinstance(rows, slice) or rows.step not in (None, 1):
        return None
    if not all(isinstance(i, slice) and i == slice(None) for i in rest):
        return None
    start, stop, _ = rows.indices(count)
    return start, max(start, stop)


class PendingConcat:
    """Parts joined along `axis`, not yet copied: `materialized` writes each part into its slice of
    the output; row slices (the quantizer's chunks) touch only the parts they cover."""

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
    def T(self) -> PendingConcat:  # noqa: N802 - mirrors ndarray.T so views stay pending
        return PendingConcat([p.T for p in self.parts], len(self.parts[0].shape) - 1 - self.axis)

    def __getitem__(self, index):
        rows = _row_range(index, self.shape[0])
        if self.axis != 0 or rows is None:
            return np.asarray(self)[index]
        start, stop = rows
        pieces, offset = [], 0
        for p in self.parts:
            low, high = max(start - offset, 0), min(stop - offset, p.shape[0])
            if low < high:
                pieces.append(p[low:high])
            offset += p.shape[0]
        return pieces[0] if len(pieces) == 1 else PendingConcat(pieces, 0)


class ComputedRows:
    """A 2-D value whose rows are computed on demand, `rows(start, stop)` returning rows [start,
    stop) as a fresh array (a GGUF tensor dequantized for a float build): `materialized` and
    `row_blocks` compute `block` rows at a time, so the value is never held whole beside its result
    (a transposed one is copied a block of source rows at a time into the result's columns); a
    quantizer's row chunk (`value[a:b]`) computes only its rows. `block` defaults to the rows of
    ROW_BLOCK_BYTES of float32 work."""

    __slots__ = ("rows", "shape", "block", "transposed", "dtype")

    def __init__(self, rows: Callable[[int, int], np.ndarray], shape: Sequence[int], block: int | None = None,
                 transposed: bool = False, dtype: np.dtype | type = np.float32):
        self.rows = rows
        self.shape = tuple(shape)  # as the value is read (transposed: the source's columns first)
        self.block = max(1, block if block is not None else ROW_BLOCK_BYTES // (4 * max(1, self.shape[1])))
        self.transposed = transposed
        self.dtype = np.dtype(dtype)  # of the computed rows

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first source row, the computed rows) in blocks, in the source's row order."""
        count = self.shape[1] if self.transposed else self.shape[0]
        for start in range(0, count, self.block):
            yield start, self.rows(start, min(start + self.block, count))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self.shape, dtype or self.dtype)
        _copy_parts(out, self)
        return out

    @property
    def T(self) -> ComputedRows:  # noqa: N802 - mirrors ndarray.T so views stay pending
        return ComputedRows(self.rows, self.shape[::-1], self.block, not self.transposed, self.dtype)

    def __getitem__(self, index):
        rows = _row_range(index, self.shape[0])
        if self.transposed or rows is None:
            return np.asarray(self)[index]
        start, stop = rows
        return ComputedRows(lambda a, b: self.rows(start + a, start + b), (stop - start, self.shape[1]), self.block,
                            dtype=self.dtype)


def expanded(value):
    """value[None] for an array, a pending cast or a pending concatenation."""
    if isinstance(value, FilledArray):
        return value.array[None]
    if isinstance(value, PendingConcat):
        return PendingConcat([expanded(p) for p in value.parts], value.axis + 1)
    return value[None]


def _copy_parts(out: np.ndarray, value) -> None:
    """copy_into, writing a pending concatenation's parts into their slices of `out`."""
    if isinstance(value, ComputedRows):
        for start, rows in value.blocks():
            if value.transposed:
                copy_into(out[:, start : start + len(rows)], rows.T)
            else:
                np.copyto(out[start : start + len(rows)], rows, casting="unsafe")
        return
    if isinstance(value, PendingCast) and value.dtype == out.dtype:  # cast in the copy into `out`
        _copy_parts(out, value.array)
        return
    if isinstance(value, PendingCast):  # rounded to its own dtype first (a bf16 merge read as float32)
        copy_into(out, np.asarray(value))
        return
    if not isinstance(value, PendingConcat):
        copy_into(out, value)
        return
    offset = 0
    for part in value.parts:
        n = part.shape[value.axis]
        index = tuple(slice(offset, offset + n) if a == value.axis else slice(None) for a in range(out.ndim))
        _copy_parts(out[index], part)
        offset += n


def resolved(value) -> np.ndarray:
    """Materializes a pending cast or concatenation when a step needs real values."""
    if isinstance(value, PendingCast):
        return np.asarray(value.array).astype(value.dtype)
    if isinstance(value, (PendingConcat, ComputedRows)):
        return np.asarray(value)
    return value


def materialized(value, shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """A recipe's value (an array or a pending one) as a C-contiguous array of `dtype` that owns its
    memory; a filled array is handed over as is."""
    if isinstance(value, FilledArray):
        return value.array
    if isinstance(value, PendingCast):
        value = value.array
    out = np.empty(tuple(shape), dtype)
    with np.errstate(over="ignore"):  # a value past float16's range: refused where written (builder/finite.py)
        _copy_parts(out, value)  # one pass: layout change and cast together
    return out


def row_blocks(value, shape: Sequence[int], dtype: np.dtype) -> Iterator[np.ndarray]:
    """A recipe's value in blocks of rows, each converted and its source pages handed back before the
    next: a large table read row by row (an embedding, a float linear's [out, in] matrix; a fused
    q/k/v one part after another) is written holding one block of it. A value whose rows are not
    contiguous in its source (a transposed weight, whose rows gather from every source page) or
    that is computed whole comes as one piece."""
    if isinstance(value, FilledArray):
        yield value.array
        return
    source, casts = value, []  # casts innermost first: a block goes through each, in turn
    while isinstance(source, PendingCast):
        casts.insert(0, source.dtype)
        source = source.array
    if isinstance(source, PendingConcat) and source.axis == 0:  # each part's rows in turn (a fused q/k/v)
        for part in source.parts:
            for cast in casts:
                part = PendingCast(part, cast)
            yield from row_blocks(part, part.shape, dtype)
        return
    if isinstance(source, ComputedRows) and not source.transposed:
        for _, rows in source.blocks():
            with np.errstate(over="ignore"):
                for cast in [*casts, dtype]:
                    rows = rows.astype(cast, copy=False)
            yield rows
        return
    if not (isinstance(source, np.ndarray) and source.flags.c_contiguous):
        yield materialized(value, shape, dtype)
        return
    rows = shape[0]
    row_bytes = max(1, int(np.prod(shape, dtype=np.int64)) * dtype.itemsize // rows)
    step = max(1, ROW_BLOCK_BYTES // row_bytes)
    for r in range(0, rows, step):
        block = value[r : r + step]
        out = np.empty((min(step, rows - r), *shape[1:]), dtype)
        with np.errstate(over="ignore"):
            np.copyto(out, block.array if isinstance(block, PendingCast) else block, casting="unsafe")
        release(block)
        yield out


class ByProductTensor(ir.LazyTensor):
    """A lazy tensor that comes out of the computation of another one registered before it (a
    quantized weight's scales or zero points, beside its codes): `write_order` writes it later."""

    __slots__ = ()


def write_order(initializers: Iterable[ir.Value]) -> list[ir.Value]:
    """Initializers in registration order, each by-product moved after as many bytes of the main
    tensors that follow as its own main tensor has (and at least one of them), so that while one
    writer thread computes a weight the other starts the next ones instead of waiting on this
    computation for its by-product. (A lm_head is 1.3 s of quantizing: placed a layer-norm weight
    later, its scales kept the second of two threads idle that long.) The order does not depend on
    the machine: outputs are the same bytes everywhere."""
    ordered: list[ir.Value] = []
    waiting: list[list] = []  # [bytes of main tensors still to pass, the by-products], oldest first
    group: list | None = None  # the by-products of the latest main tensor, as they come
    latest = 0  # the latest main tensor's bytes
    for value in initializers:
        if isinstance(value.const_value, ByProductTensor):
            if group is None:
                group = [latest, []]
                waiting.append(group)
            group[1].append(value)
            continue
        group = None
        latest = value.const_value.nbytes if value.const_value is not None else 0
        ordered.append(value)
        for g in waiting:
            g[0] -= latest
        ordered.extend(v for g in waiting if g[0] <= 0 for v in g[1])
        waiting = [g for g in waiting if g[0] > 0]
    return ordered + [v for g in waiting for v in g[1]]


# The tensor metadata (onnx_ir's `meta`, never serialized) that names a lazy tensor's value across
# the models of one build: tensors with equal keys hold equal bytes (`content_key`).
CONTENT_KEY = "builder.content"


def content_key(tensor: ir.TensorProtocol | None) -> object | None:
    """The key of a lazy tensor whose value another model of the build may hold too (a tied
    vocabulary's 4-bit codes, in the decoder's lm_head and a package's embedding model), else None:
    the writer stores such a value once and points the later model at it (writer.save_models)."""
    meta = getattr(tensor, "meta", None)
    return None if meta is None else meta.get(CONTENT_KEY)


class SharedResult:
    """One computation feeding several lazy tensors (a quantized weight's data, scales and zero
    points): whichever tensor the writer asks for first runs it; each part is dropped once taken.
    The parts other than `main` are by-products (see `write_order`). `key`: what determines the
    result entirely (its input's `Weight.origin_key` and every setting), when it is known; each part
    then carries (key, part) as its `content_key`."""

    def __init__(self, compute: Callable[[], dict[str, np.ndarray]], main: str = "data", key: tuple | None = None):
        self._compute = compute
        self._main = main
        self._key = key
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

    def tensor(self, part: str, shape: Sequence[int], dtype: np.dtype | type | ir.DataType, name: str) -> ir.LazyTensor:
        """The part as a lazy tensor of `shape` and `dtype`; a 4-bit part's array holds its packed
        bytes (two codes a byte, ONNX's order)."""
        kind = ir.LazyTensor if part == self._main else ByProductTensor
        dtype = dtype if isinstance(dtype, ir.DataType) else ir.DataType.from_numpy(np.dtype(dtype))
        if dtype in (ir.DataType.INT4, ir.DataType.UINT4):
            def value() -> ir.TensorProtocol:
                return ir.PackedTensor(self.take(part), dtype, shape=shape, name=name)
        else:
            def value() -> ir.TensorProtocol:
                return ir.Tensor(self.take(part), name=name)
        tensor = kind(value, dtype=dtype, shape=ir.Shape(shape), name=name)
        if self._key is not None:
            tensor.meta[CONTENT_KEY] = (self._key, part)
        return tensor


class StreamedTensor(ir.LazyTensor):
    """An `ir.LazyTensor` that `ir.save` writes piece by piece: onnx_ir's external-data writer seeks
    to the tensor's offset and calls its `tofile(file)` (onnx_ir/external_data.py, `_write_tensor_at`,
    onnx_ir 1.1), so only one piece (one expert of a stack) is in memory at a time. `pieces()`
    yields C-contiguous arrays whose bytes, one after another, are the tensor's: each is written by
    `ir.Tensor.tofile`, as the whole array would be. `whole()` is the tensor for any other reader.
    `held`: the bytes it holds while written, where known before (a block of rows: report.estimate)."""

    __slots__ = ("_pieces", "held")

    def __init__(self, whole: Callable[[], ir.TensorProtocol], pieces: Callable[[], Iterator[np.ndarray]],
                 dtype: np.dtype, shape: Sequence[int], name: str, held: int | None = None):
        super().__init__(whole, dtype=ir.DataType.from_numpy(np.dtype(dtype)), shape=ir.Shape(shape), name=name)
        self._pieces = pieces
        self.held = held

    def tofile(self, file) -> None:
        for piece in self._pieces():
            ir.Tensor(piece).tofile(file)
            del piece  # before the next one is computed


# Seconds a by-product of a StackedResult waits for its main part's stream to begin before
# computing everything at once itself (the writer's threads start both within milliseconds).
STREAM_START_WAIT = 2.0


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
        return ByProductTensor(lambda: ir.Tensor(self._take(part), name=name),
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
                self._state.notify_all()  # a by-product waiting for the stream to begin
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
            if part != self._main and self._ready is None and self._main not in self._taken:
                # The writer asks for the main part first (write_order), but another thread may
                # reach this by-product before the main part's stream has begun: give it a moment
                # to begin rather than computing every expert at once (the whole codes in memory).
                self._state.wait_for(lambda: self._streaming or self._ready is not None, STREAM_START_WAIT)
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
