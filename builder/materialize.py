"""Write time: how a `Weight`'s recipe value becomes an array, a block of source rows at a time.

The recipe's steps leave pending values (builder/pending_values.py: a cast not yet done, parts not
yet joined, an array already filled) or rows not yet computed (`ComputedRows`, a GGUF tensor
dequantized on demand), that `materialized` turns into one array in a single pass, copying each part
straight into its slice of the output, a block of source rows at a time and handing mapped pages
back as it goes (`copy_into`); `row_blocks` hands a large table over one block of rows at a time
instead. `resolved` gives a step that needs real values the array at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from builder.mapped_pages import release, row_ranges
from builder.pending_values import FilledArray, PendingCast, PendingConcat, whole_rows

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
        rows = whole_rows(index, self.shape[0])
        if self.transposed or rows is None:
            return np.asarray(self)[index]
        start, stop = rows
        return ComputedRows(lambda a, b: self.rows(start + a, start + b), (stop - start, self.shape[1]), self.block,
                            dtype=self.dtype)


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
