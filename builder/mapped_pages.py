"""The pages of a memory-mapped array, given back range by range as its consumer finishes with
them: the one piece of memory mapping that the write-time machinery (materialize.py, quantize.py)
and the input formats share. Mapping a tensor's bytes is the input formats' (inputs/mapping.py)."""

from __future__ import annotations

import mmap
from collections.abc import Iterator

import numpy as np

try:  # numpy 2 moved it
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # numpy 1.x
    _byte_bounds = np.byte_bounds


class MappedArray(np.ndarray):
    """An ndarray over a memory mapping; its views remember the mapping, so a consumer that has
    finished with some rows can hand their pages back (`release`) before the whole tensor is done."""

    _mapping: tuple[mmap.mmap, int] | None = None  # (the mapping, its start address)

    def __array_finalize__(self, obj) -> None:
        self._mapping = getattr(obj, "_mapping", None)


def release(view: np.ndarray) -> None:
    """Drops the resident pages under `view` if it lies in a mapping (they are re-read if needed).

    A mapped file page counts in the process's resident memory until unmapped or released; a
    2 GB embedding converted row-block by row-block thus never holds all of its source at once.
    """
    while hasattr(view, "array") and not isinstance(view, np.ndarray):  # a pending cast (pending_values.PendingCast)
        view = view.array
    for part in getattr(view, "parts", ()):  # a pending concatenation (pending_values.PendingConcat)
        release(part)
    mapping = getattr(view, "_mapping", None)
    if mapping is None or view.size == 0:
        return
    mm, base = mapping
    low, high = _byte_bounds(view)
    page = mmap.PAGESIZE
    start = -(-(low - base) // page) * page  # only whole pages inside the view
    stop = (high - base) // page * page
    if 0 <= start < stop <= len(mm):
        mm.madvise(mmap.MADV_DONTNEED, start, stop - start)


def row_ranges(view: np.ndarray, max_bytes: int) -> Iterator[tuple[int, np.ndarray]]:
    """`view`'s rows in ranges of at most `max_bytes` (at least a row each), as (first row, range);
    each range's mapped pages are released (`release`) once the consumer moves on to the next."""
    step = max(1, max_bytes // max(1, view[:1].nbytes))
    for start in range(0, len(view), step):
        piece = view[start:start + step]
        yield start, piece
        release(piece)
