"""The pending values a `Weight`'s recipe steps leave before write time: a cast not yet done
(`PendingCast`), parts not yet joined (`PendingConcat`), an array already filled (`FilledArray`).
Each is turned into one array by `materialize.materialized`; until then it keeps views pending
(`.T`, `[None]` through `expanded`) and a row slice of a concatenation (a quantizer's chunk)
touches only the parts it covers (`whole_rows` tells such a slice apart).
"""

from __future__ import annotations

import numpy as np


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


def whole_rows(index, count: int) -> tuple[int, int] | None:
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
        rows = whole_rows(index, self.shape[0])
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


def expanded(value):
    """value[None] for an array, a pending cast or a pending concatenation."""
    if isinstance(value, FilledArray):
        return value.array[None]
    if isinstance(value, PendingConcat):
        return PendingConcat([expanded(p) for p in value.parts], value.axis + 1)
    return value[None]
