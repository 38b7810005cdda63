"""Memory-mapped tensor bytes: mapped for as long as a tensor is being written, and given back
page range by page range as its consumer finishes with them."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes live."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute byte offset in `path`
    nbytes: int


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
    while hasattr(view, "array") and not isinstance(view, np.ndarray):  # a pending cast (materialize.PendingCast)
        view = view.array
    for part in getattr(view, "parts", ()):  # a pending concatenation (materialize.PendingConcat)
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


@contextlib.contextmanager
def mapped(info: TensorInfo) -> Iterator[np.ndarray]:
    """A read-only array over the tensor's bytes in the page cache, unmapped on exit.

    The caller must not keep a view of the array past the `with` block (`lazy.Weight` copies
    its result out before leaving).
    """
    if info.nbytes == 0:
        yield np.empty(info.shape, info.dtype)
        return
    start = info.offset - info.offset % mmap.ALLOCATIONGRANULARITY
    with open(info.path, "rb") as f:
        mm = mmap.mmap(f.fileno(), info.offset - start + info.nbytes, offset=start, access=mmap.ACCESS_READ)
    # No MADV_SEQUENTIAL: with the kernel's default read-around the two writer threads page in a
    # 24 GB checkpoint faster (the full gemma-3-12b-it int4 package 53.1 -> 43.7 s, round-to-nearest
    # 38.3 -> 30.4 s, cold; docs/BENCHMARKS.md), and each finished range is dropped (MADV_DONTNEED).
    try:
        raw = np.frombuffer(mm, info.dtype, int(np.prod(info.shape)), info.offset - start)
        base = raw.__array_interface__["data"][0] - (info.offset - start)
        array = raw.reshape(info.shape).view(MappedArray)
        array._mapping = (mm, base)
        del raw
        yield array
        del array
    finally:
        try:
            mm.close()
        except BufferError:
            # A caller still holds a view; the mapping is released when that view is collected.
            pass
