"""Lazy weights: a recipe (shape, dtype, a function) that yields its array only when written.

A `Weight` starts as a source (a checkpoint tensor, a computed table) and grows by cheap, lazy
steps: `transpose`, `astype`, `map` (an arbitrary numpy function such as Gemma's `1 + w`),
`map_rows` (one computed a block of rows at a time, such as a LoRA merge), `slice`, `concat` and
`stack`. Nothing runs until `numpy()` is called — which `to_ir` defers to the moment `ir.save`
writes the tensor. Views (transpose, slices) cost nothing; the final copy into a
contiguous array of the target dtype does the transpose and the cast in one pass. A stack (a
mixture of experts' [E, N, K]) is written one member at a time, so its memory is one expert's, not
the layer's. How the steps' pending values become arrays and reach the file is
builder/materialize.py; a weight the checkpoint stores already quantized carries its
`stored_blocks.Blocks`, which `slice` and `concat` keep in step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import onnx_ir as ir

from builder.lazy_results import CONTENT_KEY, StreamedTensor
from builder.materialize import (
    ROW_BLOCK_HELD,
    STREAM_BYTES,
    ComputedRows,
    materialized,
    release,
    resolved,
    row_blocks,
)
from builder.pending_values import FilledArray, PendingCast, PendingConcat, expanded
from builder.stored_blocks import Blocks

# A step receives the ExitStack that owns any memory mappings and returns an array (maybe a view).
Compute = Callable[[contextlib.ExitStack], np.ndarray]


class Weight:
    """An array described by its shape and dtype, computed on demand.

    Example:
        >>> w = Weight.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
        >>> w.transpose().astype(np.float16).shape
        (3, 2)
        >>> w.transpose().numpy().tolist()
        [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]]
    """

    __slots__ = ("shape", "dtype", "_compute", "sources", "blocks", "pieces", "origin", "derived", "by_rows")

    def __init__(self, shape: Sequence[int], dtype: np.dtype | type, compute: Compute, sources: tuple[str, ...],
                 blocks: Blocks | None = None, pieces: tuple[Weight, ...] | None = None, by_rows: bool = False):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self._compute = compute
        self.sources = sources  # checkpoint names it reads, for messages and build records
        self.blocks = blocks  # the same values already quantized (a GGUF Q4_0 tensor), or None
        self.pieces = pieces  # a stack's members (value[i] is pieces[i]): written one at a time
        # Where a checkpoint tensor's bytes lie, (file, offset, length), for a weight that is that
        # tensor as stored (no step applied): equal origins are equal values (`origin_key`).
        self.origin: tuple[str, int, int] | None = None
        # What identifies a value made from such a tensor by steps that depend on nothing else
        # (a cast, a transpose): (step, the input's `content()`, its setting), else None.
        self.derived: tuple | None = None
        # Its value comes a block of rows at a time without being computed whole (a checkpoint
        # tensor as stored, a cast or row range of one, rows computed on demand, such values joined
        # along rows): written so when large (`to_ir`), what report.estimate counts as held.
        self.by_rows = by_rows

    def __repr__(self) -> str:
        return f"Weight({list(self.shape)}, {self.dtype.name}, from {', '.join(self.sources) or 'code'})"

    @classmethod
    def source(cls, shape: Sequence[int], dtype: np.dtype, open_view: Compute, name: str,
               origin: tuple[str, int, int] | None = None, by_rows: bool = True) -> Weight:
        """A checkpoint tensor; `open_view` maps it (`by_rows`: as a C-contiguous array)."""
        weight = cls(shape, dtype, open_view, (name,), by_rows=by_rows)
        weight.origin = origin
        return weight

    def origin_key(self) -> tuple | None:
        """What identifies this value across graphs (the same checkpoint bytes read as the same
        dtype and shape), or None for a weight with steps applied or made by code."""
        return None if self.origin is None else (*self.origin, self.dtype.str, self.shape)

    def content(self) -> tuple | None:
        """What identifies this value across the models of a build: its origin (`origin_key`), or
        the cast or transpose of a value so identified; None otherwise. Equal keys are equal bytes,
        which the writer stores once (a decoder's vocabulary that its draft head reads too)."""
        return self.origin_key() or self.derived

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
        out = Weight(self.shape[::-1], self.dtype, lambda s: inner(s).T, self.sources)
        out.derived = _step("transpose", self.content())
        return out

    def reshaped(self, *shape: int) -> Weight:
        """The same values in another shape (numpy's reshape at write time): DeepSeek's kv_b_proj
        [heads·(nope + v), rank] as [heads, nope + v, rank]."""
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(self.shape, dtype=np.int64)):
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        inner = self._compute
        return Weight(shape, self.dtype, lambda s: resolved(inner(s)).reshape(shape), self.sources)

    def permuted(self, *axes: int) -> Weight:
        """The axes reordered (numpy's transpose(axes) at write time)."""
        inner = self._compute
        return Weight(tuple(self.shape[a] for a in axes), self.dtype,
                      lambda s: np.ascontiguousarray(resolved(inner(s)).transpose(axes)), self.sources)

    def astype(self, dtype: np.dtype | type) -> Weight:
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        if self.pieces is not None:  # still a stack, so still written one member at a time
            return Weight.stack([p.astype(dtype) for p in self.pieces])
        inner = self._compute
        # The cast itself happens in numpy() when the result is copied out, fused with the layout copy.
        out = Weight(self.shape, dtype, lambda s: PendingCast(inner(s), dtype), self.sources, by_rows=self.by_rows)
        out.derived = _step("astype", self.content(), dtype.str)
        return out

    def map(self, fn: Callable[[np.ndarray], np.ndarray], dtype: np.dtype | type | None = None) -> Weight:
        """Applies a numpy function (same shape) at write time, e.g. `lambda w: w + 1`."""
        inner = self._compute
        out_dtype = np.dtype(dtype) if dtype is not None else self.dtype
        return Weight(self.shape, out_dtype, lambda s: fn(resolved(inner(s))), self.sources)

    def map_rows(self, make: Callable[[], Callable[[np.ndarray, int, int], np.ndarray]],
                 dtype: np.dtype | type | None = None) -> Weight:
        """Like `map` for a function of a block of rows (a LoRA merge's W[a:b] + (B A)[a:b]):
        `make()` runs once when the weight is written and returns `fn(rows, start, stop)`, which
        gets rows [start, stop) of this weight and returns them mapped. The value is computed a
        block of rows at a time as the writer or a quantizer asks (`materialize.ComputedRows`).
        This weight's own rows should be cheap to slice (a checkpoint tensor, computed rows): a
        transposed input would be computed whole for every block."""
        if len(self.shape) != 2:
            raise ValueError(f"map_rows expects a 2-D weight, got {self.shape}")
        inner = self._compute
        out_dtype = np.dtype(dtype) if dtype is not None else self.dtype

        def compute(s) -> ComputedRows:
            value = inner(s)
            value = value.array if isinstance(value, FilledArray) else value
            fn = make()

            def rows(start: int, stop: int) -> np.ndarray:
                piece = value[start:stop]
                out = fn(resolved(piece), start, stop)
                release(piece)
                return out

            return ComputedRows(rows, self.shape, dtype=out_dtype)

        return Weight(self.shape, out_dtype, compute, self.sources, by_rows=self.by_rows)

    def slice(self, axis: int, start: int, stop: int) -> Weight:
        """Rows or columns [start, stop) along `axis` (a view until written)."""
        shape = list(self.shape)
        if not 0 <= start < stop <= shape[axis]:
            raise ValueError(f"slice [{start}, {stop}) out of range for axis {axis} of {self.shape}")
        shape[axis] = stop - start
        index = tuple(slice(start, stop) if a == axis else slice(None) for a in range(len(shape)))
        inner = self._compute
        blocks = self.blocks.rows(start, stop) if self.blocks is not None and axis == 0 and len(shape) == 2 else None
        return Weight(shape, self.dtype, lambda s: inner(s)[index], self.sources, blocks,
                      by_rows=self.by_rows and axis == 0)

    @staticmethod
    def concat(weights: Sequence[Weight], axis: int = 0) -> Weight:
        """Joins weights along `axis` (QKV fusion); they must share the other dims. Float parts of
        different dtypes (a checkpoint may store k_proj in F16 beside a BF16 q_proj) are joined in
        the dtype that holds them all exactly (float32 for float16 with bfloat16). When written,
        each part is copied straight into its slice of the output: the fused tensor is never held
        twice."""
        if len(weights) == 1:
            return weights[0]
        dtypes = {w.dtype for w in weights}
        if len(dtypes) > 1 and all(_is_float(d) for d in dtypes):
            common = _common_float(dtypes)
            weights = [w.astype(common) for w in weights]
        first = weights[0]
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
        return Weight(shape, first.dtype, lambda s: PendingConcat([p(s) for p in parts], axis),
                      tuple(n for w in weights for n in w.sources), blocks,
                      by_rows=axis == 0 and all(w.by_rows for w in weights))

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
                      lambda s: PendingConcat([expanded(p(s)) for p in parts], 0),
                      tuple(n for w in weights for n in w.sources), pieces=tuple(weights))

    @classmethod
    def filled(cls, shape: Sequence[int], dtype: np.dtype | type, fill: Callable[[np.ndarray], None],
               sources: tuple[str, ...]) -> Weight:
        """An array that `fill(out)` writes piece by piece into a fresh `out` at write time (an
        expert's interleaved gate and up rows); `numpy()` hands `out` over as is, so the result is
        held once. `sources`: the checkpoint tensors it reads."""
        dtype = np.dtype(dtype)

        def compute(_stack) -> FilledArray:
            out = np.empty(tuple(shape), dtype)
            fill(out)
            return FilledArray(out)

        return cls(shape, dtype, compute, sources)

    def numpy(self) -> np.ndarray:
        """Runs the recipe: a C-contiguous array of `dtype` that owns its memory."""
        if self.pieces is not None:
            out = np.empty(self.shape, self.dtype)
            for i, piece in enumerate(self.pieces):
                out[i] = piece.numpy()
            return out
        with contextlib.ExitStack() as stack:
            return materialized(self._compute(stack), self.shape, self.dtype)

    def apply(self, fn: Callable[[np.ndarray], np.ndarray]):
        """Runs `fn` on the recipe's value while its mappings are open (for consumers, such as the
        quantizer, that read a large source chunk by chunk instead of copying it whole).
        `fn` must return arrays that own their memory."""
        with contextlib.ExitStack() as stack:
            return fn(self._compute(stack))

    def to_ir(self, name: str, check: Check | None = None) -> ir.LazyTensor:
        """An `ir.LazyTensor` whose bytes are this recipe, computed when `ir.save` writes it; a
        stack's bytes are computed and written one member at a time. `check(block, first)` sees
        every array written before it is written (a block of the tensor along its first axis,
        starting at index `first`) and may raise to stop the build."""
        check = check or _unchecked

        def whole() -> ir.Tensor:
            array = self.numpy()
            check(array, 0)
            return ir.Tensor(array, name=name)

        if self.pieces is not None:
            pieces = self.pieces

            def members() -> Iterator[np.ndarray]:
                for i, p in enumerate(pieces):
                    array = p.numpy()
                    check(array[None], i)
                    yield array

            return StreamedTensor(whole, members, self.dtype, self.shape, name)
        if self.nbytes > STREAM_BYTES and len(self.shape) >= 1:
            def blocks() -> Iterator[np.ndarray]:
                first = 0
                for block in self._row_blocks():
                    check(block, first)
                    first += len(block)
                    yield block

            tensor = StreamedTensor(whole, blocks, self.dtype, self.shape, name,
                                    held=ROW_BLOCK_HELD if self.by_rows else None)
        else:
            tensor = ir.LazyTensor(whole, dtype=ir.DataType.from_numpy(self.dtype), shape=ir.Shape(self.shape),
                                   name=name)
        if (key := self.content()) is not None:  # another model of the build may hold it: stored once
            tensor.meta[CONTENT_KEY] = ("weight", key)
        return tensor

    def _row_blocks(self) -> Iterator[np.ndarray]:
        """The value a block of rows at a time, its source pages handed back as it goes (see
        materialize.row_blocks)."""
        with contextlib.ExitStack() as stack:
            yield from row_blocks(self._compute(stack), self.shape, self.dtype)


def _step(step: str, parent: tuple | None, setting: object = None) -> tuple | None:
    """The content key of `step` applied to a value keyed `parent` (None: not identified)."""
    return None if parent is None else (step, parent, setting)


# A check of the arrays a lazy tensor writes: (a block along the first axis, its first index).
Check = Callable[[np.ndarray, int], None]


def _unchecked(_block: np.ndarray, _first: int) -> None:
    return None


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _common_float(dtypes: set[np.dtype]) -> np.dtype:
    """The smallest float dtype that holds every value of each of `dtypes`."""
    try:
        common = np.result_type(*dtypes)
    except TypeError:  # bfloat16 with float16: no numpy promotion
        return np.dtype(np.float32)
    return common if common.kind == "f" else np.dtype(np.float32)
