"""Safetensors checkpoints read lazily: headers up front, tensor bytes only when a weight is written.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to its dtype, shape and [begin, end) byte range after the header, then the raw bytes. We parse
the headers ourselves (no torch, no copy) and hand out `lazy.Weight` recipes; each one maps just
its own byte range when it is evaluated and unmaps it right after, so pages read for one tensor
never accumulate in the process's memory.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder.errors import BuildError
from builder.hf_config import generation_config, load_json, parse_json
from builder.inputs.mapping import TensorInfo, mapped
from builder.inputs.source import NamedTensors
from builder.lazy import Weight
from builder.inputs.checks import check_not_prequantized, check_tokenizer_files

DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),  # FP8 checkpoints' weights (builder/inputs/fp8.py)
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}

INDEX_FILE = "model.safetensors.index.json"
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parses one safetensors header and checks it as the safetensors library does on load: each
    entry's dtype, shape and [begin, end) byte range, and ranges that tile the data exactly (in
    offset order, each starting where the one before ends, the last at the end of the file), so
    no two tensors share bytes, none reads past the file and no byte is left unaccounted for."""
    header, data_start, size = _header_object(path)
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise BuildError(f"{path}: corrupt safetensors header (__metadata__ must map names to strings)")
            continue
        dtype, shape, begin, end = _entry(path, name, entry)
        nbytes = math.prod(shape) * dtype.itemsize  # Python ints: a huge shape cannot wrap around
        if end - begin != nbytes:
            raise BuildError(f"{path}: tensor {_short(name)} spans {end - begin} bytes but "
                             f"{entry['dtype']}{_short(list(shape))} needs {nbytes}")
        if data_start + end > size:
            raise BuildError(f"{path}: truncated file: tensor {_short(name)} ends at byte {data_start + end}, "
                             f"file has {size}")
        tensors[name] = TensorInfo(name, dtype, shape, path, data_start + begin, nbytes)
    _check_tiling(path, tensors, data_start, size)
    return tensors


def _header_object(path: Path) -> tuple[dict, int, int]:
    """(the JSON header, where the data starts, the file's size); an unreadable or cut-off file,
    or a header that is not a JSON object, is one line."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) != 8:
                raise BuildError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
            (header_len,) = struct.unpack("<Q", raw_len)
            if header_len > min(_MAX_HEADER_BYTES, size - 8):
                raise BuildError(f"{path}: corrupt safetensors header (declared length {header_len} bytes)")
            text = f.read(header_len)
    except OSError as e:
        raise BuildError(f"{path}: cannot read ({e.strerror or e})") from None
    header = parse_json(text, path, "corrupt safetensors header")
    if not isinstance(header, dict):
        raise BuildError(f"{path}: corrupt safetensors header (not a JSON object)")
    return header, 8 + header_len, size


def _entry(path: Path, name: str, entry: object) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, each of the type the format prescribes:
    JSON integers, never negative, fractional, boolean or too large for a file (1e309, NaN)."""

    def count(x: object) -> bool:
        return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64

    if isinstance(entry, dict):
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if (isinstance(shape, list) and all(count(d) for d in shape) and isinstance(offsets, list)
                and len(offsets) == 2 and all(count(x) for x in offsets) and offsets[0] <= offsets[1]):
            if isinstance(dtype, str) and dtype in DTYPES:
                return DTYPES[dtype], tuple(shape), offsets[0], offsets[1]
            raise BuildError(f"{path}: tensor {_short(name)} has dtype {_short(dtype)}; supported: {', '.join(DTYPES)}")
    raise BuildError(f"{path}: corrupt safetensors header entry for tensor {_short(name)}: {_short(entry)}")


def _check_tiling(path: Path, tensors: dict[str, TensorInfo], data_start: int, size: int) -> None:
    """The safetensors library's rule: sorted by their byte ranges, tensors start where the one
    before ends (the first at 0) and the last ends at the end of the file. Two tensors sharing
    bytes would otherwise alias each other silently."""
    end, before = data_start, None
    for info in sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes)):
        if info.offset != end:
            where = f"tensor {_short(before)}, which ends at byte {end - data_start}" if before else "the data's start"
            how = "overlaps" if info.offset < end else "leaves a gap after"
            raise BuildError(f"{path}: corrupt safetensors header: tensor {_short(info.name)} (bytes "
                             f"{info.offset - data_start}..{info.offset - data_start + info.nbytes}) {how} {where}")
        end, before = info.offset + info.nbytes, info.name
    if end != size:
        raise BuildError(f"{path}: corrupt safetensors header: its tensors end at byte {end} but the file has "
                         f"{size} (bytes no tensor accounts for)")


def _short(value: object, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: a message stays one readable line whatever the file holds."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def safetensors_files(folder: Path) -> list[Path]:
    """The checkpoint's weight files: those the index names, else every *.safetensors in the folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        files = sorted({folder / name for name in _index_file_names(index)})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise BuildError(f"{index} names files that are missing: {', '.join(missing)}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
        raise BuildError(
            f"{folder} holds only pickle weights (*.bin/*.pt); builder never unpickles: "
            "convert them to safetensors first"
        )
    raise BuildError(f"{folder} has no *.safetensors weights")


def _index_file_names(index: Path) -> set[str]:
    """The file names an index's weight_map maps tensors to. Each must be a plain name in the index's
    own folder: an absolute path or `../` would read (and copy into the output) files outside the
    model folder, which build.yaml does not record."""
    try:
        raw = load_json(index, "not a valid safetensors index")
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"{index}: not a valid safetensors index ({e})") from None
    except RecursionError:
        raise BuildError(f"{index}: not a valid safetensors index (nested too deeply)") from None
    weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BuildError(f"{index}: not a valid safetensors index (weight_map must map tensor names to file names)")
    names = set(weight_map.values())
    for name in sorted(names):
        if name in ("", ".", "..") or Path(name).name != name:
            raise BuildError(f"{index}: weight_map names {name!r}, which is not a file of this folder "
                             "(builder reads nothing outside the model folder)")
    return names


def read_headers(folder: str | os.PathLike) -> dict[str, TensorInfo]:
    """Every tensor of a folder's safetensors files, by name; a name in two files is refused."""
    tensors: dict[str, TensorInfo] = {}
    for path in safetensors_files(Path(folder)):
        for name, info in read_header(path).items():
            if name in tensors:
                raise BuildError(f"tensor {name!r} is in both {tensors[name].path.name} and {path.name}")
            tensors[name] = info
    return tensors


class SafetensorsCheckpoint(NamedTensors):
    """The tensors of a safetensors checkpoint by Hugging Face name, and which of them were used
    (the public API's `builder.Checkpoint`).

    Example:
        >>> ckpt = SafetensorsCheckpoint.open("path/to/folder")   # doctest: +SKIP
        >>> w = ckpt.weight("model.embed_tokens.weight")           # a recipe; nothing is read yet
        >>> ckpt.check_consumed(ignore=["*.rotary_emb.inv_freq"])
    """

    @classmethod
    def open(cls, folder: str | os.PathLike) -> SafetensorsCheckpoint:
        """The checkpoint of a folder's safetensors files; reads their headers, no tensor."""
        return cls(read_headers(folder))

    def weight(self, name: str, shape: Iterable[int] | None = None, packed: bool = False) -> Weight:
        """A lazy recipe for tensor `name`; marks it consumed. `shape`, if given, is checked.
        `packed` accepts an integer tensor (the uint8 blocks and scales of an MXFP4 checkpoint)."""
        info = self.info(name)
        if not packed and info.dtype.kind != "f" and info.dtype != DTYPES["BF16"]:
            scaled = " (float8 weights need the quantization_config and scales of an FP8 checkpoint)" \
                if info.dtype.name.startswith("float8") else ""
            raise BuildError(f"tensor {name!r} has dtype {info.dtype.name}; a weight must be floating point{scaled}")
        if shape is not None and tuple(shape) != info.shape:
            raise BuildError(
                f"tensor {name!r} has shape {list(info.shape)} but config.json implies {list(shape)}"
            )
        self._consumed.add(name)
        return Weight.source(info.shape, info.dtype, lambda stack: stack.enter_context(mapped(info)), name,
                             origin=(str(info.path), info.offset, info.nbytes))

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        """Whether tensors `a` and `b` hold the same values; reads both, a row block at a time."""
        ia, ib = self.info(a), self.info(b)
        if ia.shape != ib.shape or not ia.shape:
            return False
        with mapped(ia) as x, mapped(ib) as y:
            for start in range(0, ia.shape[0], rows_per_chunk):
                xs, ys = x[start:start + rows_per_chunk], y[start:start + rows_per_chunk]
                if ia.dtype == ib.dtype:
                    equal = np.array_equal(xs.view(np.uint8), ys.view(np.uint8))
                else:
                    equal = np.array_equal(xs.astype(np.float32), ys.astype(np.float32))
                if not equal:
                    return False
        return True


class SafetensorsSource:
    """A model folder: config.json, float safetensors, and the tokenizer and generation_config.json
    beside them (a Source, builder/inputs/source.py). The AWQ/GPTQ and FP8 sources are this with
    another checkpoint."""

    stores_blocks = False
    can_package = True

    def __init__(self, folder: Path, config: dict[str, Any]):
        self.folder = folder
        self.config = config
        self.config_path = folder / "config.json"

    def check_quantization(self, accepted: tuple[str, ...]) -> None:
        """Refuses any quantization_config but the architecture's own (`accepted`)."""
        check_not_prequantized(self.config, self.config_path, accepted)

    def open_checkpoint(self) -> SafetensorsCheckpoint:
        """The folder's safetensors headers, read now."""
        return SafetensorsCheckpoint.open(self.folder)

    def check_tokenizer(self) -> None:
        """The folder's tokenizer files, copied into the output, must load."""
        check_tokenizer_files(self.folder)

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        """The folder's generation_config.json, as genai_config.json's search takes it."""
        return generation_config(self.folder, vocab_size)

    def write_files(self, folder: Path) -> None:
        """Nothing: the writer copies the folder's tokenizer files."""

    def files_memory(self) -> int:
        return 0


class ReadQuantizationSource(SafetensorsSource):
    """A model folder whose top-level quantization_config names a format builder reads itself
    (AWQ/GPTQ, FP8; `fmt` is what it says); subclasses open their own checkpoint."""

    def __init__(self, folder: Path, config: dict[str, Any], fmt: Any):
        super().__init__(folder, config)
        self.fmt = fmt

    def check_quantization(self, accepted: tuple[str, ...]) -> None:
        """Its own top-level quantization_config is read here; a text_config's would belong to
        other tensor names, and is refused as any other."""
        check_not_prequantized({**self.config, "quantization_config": None}, self.config_path, accepted)

