"""A GGUF file's header read with every count and length checked against the bytes left in the file
before anything is allocated for it, so a corrupt or hostile header is one line, in time and memory
proportional to the file, never a traceback.

The layout (llama.cpp's gguf.cpp, GGUF version 2 and 3, little-endian): the magic `GGUF`, a uint32
version, uint64 tensor and key/value counts; each key/value as a string key, a uint32 value type
and the value (a string is a uint64 length and UTF-8 bytes; an array a uint32 element type, a
uint64 count and the elements); each tensor as its name, a uint32 dimension count, uint64 sizes
(innermost first), a uint32 GGML type and a uint64 offset into the data, which starts at the next
multiple of `general.alignment` (default 32) after the header.

The `gguf` package's GGUFReader trusts the counts: an array of 2^40 numbers in a small file makes
it loop, appending empty arrays, until memory runs out; a string length past the end is an
IndexError. Here a count is compared with the bytes left first, and what llama.cpp refuses is
refused too: nested arrays, more than 4 dimensions, rows that are not whole blocks, tensors that
are not aligned, overlap or end past the file; and big-endian files, whose tensors builder would
map as little-endian. A metadata array becomes one Python list (a numeric one from one read),
never an object per element on top of it: 300 000 strings take 0.2 s.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from builder.errors import BuildError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32
STRING, ARRAY = 8, 9
# value type -> struct (and numpy) format of a fixed-size value (gguf.cpp's GGUF_TYPE_*)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
UINT32, UINT64 = 4, 10
# The fewest bytes one key/value (an empty key, its type, a one-byte value) and one tensor info
# (an empty name, a dimension count, one size, a type, an offset) can take: a count past the bytes
# left divided by this cannot be true.
MIN_KV_BYTES = 8 + 4 + 1
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: where its bytes are and what they hold."""

    name: str
    kind: str  # the GGML type's name (F32, Q4_0, ...)
    shape: tuple[int, ...]  # outermost first, as Hugging Face's (GGUF lists sizes innermost first)
    offset: int  # absolute, in the file
    nbytes: int


@dataclass(frozen=True)
class Header:
    """What the header says: the metadata by key and the tensors in the file's order."""

    metadata: dict[str, Any]  # key -> value: str, int, float, bool, or a list of one of those
    tensors: list[TensorEntry]


class _Cursor:
    """Reads the header front to back, refusing any read past the end of the file."""

    def __init__(self, data: mmap.mmap, path: Path):
        self.data, self.path, self.pos = data, path, 0

    def fail(self, problem: str) -> BuildError:
        """The error to raise for a header that breaks the format (`problem`, in words)."""
        return BuildError(f"{self.path}: corrupt GGUF header: {problem}")

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise self.fail(f"{what} needs {n} bytes at byte {self.pos}, but the file ends {self.left} bytes later")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def number(self, kind: int, what: str) -> Any:
        """The next value of scalar type `kind` as a Python int, float or bool."""
        (value,) = struct.unpack("<" + SCALARS[kind], self.take(struct.calcsize(SCALARS[kind]), what))
        return value

    def string(self, what: str) -> str:
        raw = self.take(self.number(UINT64, what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text") from None

    def value(self, kind: int, key: str) -> Any:
        """The next value of type `kind`: a scalar, a string, or a list of either (not of lists)."""
        what = f"the value of {_q(key)}"
        if kind in SCALARS:
            return self.number(kind, what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise self.fail(f"{_q(key)} has unknown value type {kind}")
        item, count = self.number(UINT32, what), self.number(UINT64, what)
        if item == STRING:
            if count > self.left // 8:  # each string takes at least its 8-byte length
                raise self.fail(f"{_q(key)} declares {count} strings; the {self.left} bytes left hold at most "
                                f"{self.left // 8}")
            return [self.string(what) for _ in range(count)]
        if item not in SCALARS:  # llama.cpp refuses arrays of arrays too
            raise self.fail(f"{_q(key)} is an array of {'arrays' if item == ARRAY else f'unknown type {item}'}")
        dtype = np.dtype("<" + SCALARS[item])
        if count > self.left // dtype.itemsize:
            raise self.fail(f"{_q(key)} declares {count} elements of {dtype.itemsize} bytes; only {self.left} "
                            "bytes are left")
        return np.frombuffer(self.take(count * dtype.itemsize, what), dtype).tolist()


def _q(name: str | None, limit: int = 80) -> str:
    """A key or tensor name for a message: quoted, escaped (a newline in it stays one line), cut short."""
    text = repr(name)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read(path: Path) -> Header:
    """The metadata and tensor entries of the GGUF file at `path`, every one checked (see the module)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size < 24:
                raise BuildError(f"{path}: not a GGUF file ({size} bytes, shorter than its 24-byte start)")
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise BuildError(f"{path}: cannot read ({e.strerror or e})") from None
    with data:
        return _parse(_Cursor(data, path), size)


def _parse(cur: _Cursor, size: int) -> Header:
    path = cur.path
    if cur.take(4, "the magic") != MAGIC:
        raise BuildError(f"{path}: not a GGUF file (it does not start with 'GGUF')")
    version = cur.number(UINT32, "the version")
    if version & 0xFFFF == 0 and version:
        raise BuildError(f"{path}: a big-endian GGUF file, which builder does not read")
    if version not in VERSIONS:
        raise BuildError(f"{path}: GGUF version {version} is not supported; supported: "
                         f"{', '.join(map(str, VERSIONS))}")
    tensor_count = cur.number(UINT64, "the tensor count")
    kv_count = cur.number(UINT64, "the key/value count")
    if kv_count * MIN_KV_BYTES + tensor_count * MIN_TENSOR_BYTES > cur.left:
        raise cur.fail(f"{tensor_count} tensors and {kv_count} key/value pairs cannot fit in a file of {size} bytes")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cur.string("a metadata key")
        kind = cur.number(UINT32, f"the type of {_q(key)}")
        if key in metadata:
            raise cur.fail(f"the key {_q(key)} appears twice")
        metadata[key] = cur.value(kind, key)
        if key == "general.alignment":
            alignment = metadata[key]
            if kind != UINT32 or alignment == 0 or alignment & (alignment - 1):
                raise cur.fail(f"general.alignment must be a uint32 power of two, got {alignment!r}")
    infos = [_tensor_info(cur) for _ in range(tensor_count)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    data_start = -(-cur.pos // alignment) * alignment
    tensors = [_tensor(cur, info, data_start, alignment, size) for info in infos]
    _check_disjoint(cur, tensors)
    return Header(metadata, tensors)


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    """(name, sizes innermost first, GGML type id, offset in the data) of the next tensor."""
    name = cur.string("a tensor name")
    n_dims = cur.number(UINT32, f"the dimension count of {_q(name)}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {_q(name)} has {n_dims} dimensions; GGUF allows 1 to {MAX_DIMS}")
    dims = tuple(cur.number(UINT64, f"a size of {_q(name)}") for _ in range(n_dims))
    kind = cur.number(UINT32, f"the type of {_q(name)}")
    offset = cur.number(UINT64, f"the offset of {_q(name)}")
    return name, dims, kind, offset


def _tensor(cur: _Cursor, info: tuple[str, tuple[int, ...], int, int], data_start: int, alignment: int,
            size: int) -> TensorEntry:
    """The entry of one tensor info: its type known, its rows whole blocks, its bytes inside the file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType  # imported once by open_file, cheap here

    name, dims, kind, offset = info
    try:
        qtype = GGMLQuantizationType(kind)
    except ValueError:
        raise cur.fail(f"tensor {_q(name)} has unknown GGML type {kind}") from None
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    if 0 in dims:
        raise cur.fail(f"tensor {_q(name)} has an empty dimension {list(dims)}")
    if dims[0] % block:
        raise cur.fail(f"tensor {_q(name)} ({qtype.name}) has rows of {dims[0]} values, not whole blocks of {block}")
    nbytes = math.prod(dims) // block * block_bytes  # Python ints: no wrap-around
    if offset % alignment:
        raise cur.fail(f"tensor {_q(name)} starts at data offset {offset}, not a multiple of the alignment {alignment}")
    if data_start + offset + nbytes > size:
        raise BuildError(f"{cur.path}: truncated file: tensor {_q(name)} ends at byte {data_start + offset + nbytes}, "
                         f"file has {size}")
    return TensorEntry(name, qtype.name, tuple(reversed(dims)), data_start + offset, nbytes)


def _check_disjoint(cur: _Cursor, tensors: list[TensorEntry]) -> None:
    """No two tensors share bytes (they would alias each other silently), and no name repeats."""
    names = set()
    end, before = 0, None
    for t in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        if t.name in names:
            raise cur.fail(f"the tensor name {_q(t.name)} appears twice")
        names.add(t.name)
        if t.offset < end:
            raise cur.fail(f"tensor {_q(t.name)} (bytes {t.offset}..{t.offset + t.nbytes}) overlaps {_q(before)}, "
                           f"which ends at byte {end}")
        end, before = t.offset + t.nbytes, t.name
