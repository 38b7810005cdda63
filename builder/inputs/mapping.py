"""Memory-mapped tensor bytes: mapped for as long as a tensor is being written, and given back
page range by page range as its consumer finishes with them (builder/mapped_pages.py)."""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from builder.mapped_pages import MappedArray


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes live."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    path: Path
    offset: int  # absolute byte offset in `path`
    nbytes: int


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
