"""A GGUF file as a Source and its tensors as a Checkpoint: llama.cpp's names mapped to transformers'
(names.py), q/k rows un-permuted, Gemma's norms un-shifted, float tensors read as they are,
quantized ones as their stored blocks or dequantized (see the package's docstring)."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder.errors import BuildError
from builder.inputs.gguf import header as gguf_header
from builder.inputs.gguf.blocks import LAYOUT, WITH_MINIMUM, gguf_blocks
from builder.inputs.gguf.header import TensorEntry
from builder.inputs.gguf.metadata import check_layer_count, check_sizes, check_values, config
from builder.inputs.gguf.names import FAMILIES, hf_name
from builder.inputs.gguf.tokenizer import check_tokenizer_metadata, tokenizer_memory, write_tokenizer
from builder.inputs.mapping import TensorInfo, mapped
from builder.inputs.source import NamedTensors
from builder.lazy import Weight
from builder.mapped_pages import release
from builder.materialize import ComputedRows

log = logging.getLogger("builder")

FLOAT = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
BLOCK = 32  # the smallest whole row of every quantized type
# Rotary tensors llama.cpp's converter writes in place of config keys: read into the config.
ROPE_TENSORS = {"rope_freqs.weight": "freq_factors", "rope_factors_long.weight": "long_factor",
                "rope_factors_short.weight": "short_factor"}


def find(path: Path) -> Path | None:
    """The GGUF file `path` names: the file itself, or the one *.gguf in a folder without config.json."""
    if path.is_file():
        return path if path.suffix == ".gguf" else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    files = sorted(path.glob("*.gguf"))
    if len(files) > 1:
        raise BuildError(f"{path} holds {len(files)} GGUF files ({', '.join(f.name for f in files[:4])}); "
                         "pass the one to build as --model FILE.gguf")
    return files[0] if files else None


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: its raw bytes as [rows, bytes per row], and what they hold."""

    raw: TensorInfo
    kind: str  # GGML type name
    shape: tuple[int, ...]  # Hugging Face's order ([out, in]); GGUF lists dims innermost first
    rows: np.ndarray | None = None  # the row order that undoes a permutation, or None
    shift: float = 0.0  # subtracted from the values (a Gemma norm's stored 1 + weight)


def _read(t: GGUFTensor, stack) -> np.ndarray:
    """The raw bytes [rows, bytes per row] (a float tensor: its values), rows un-permuted."""
    raw = stack.enter_context(mapped(t.raw))
    return raw[t.rows] if t.rows is not None else raw


def _dequantized(t: GGUFTensor):
    """The tensor as float32 (a float build's): a 2-D one as `ComputedRows`, dequantized a block of
    rows at a time as the writer (or a quantizer's chunk) asks for rows, each range's mapped pages
    given back, so a float build holds its result and one block, never the whole tensor
    dequantized beside it (Qwen2.5-1.5B's 934 MB float32 lm_head was held twice)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[t.kind]

    def decode(raw: np.ndarray) -> np.ndarray:
        """Rows of raw bytes as float32; a damaged block's NaN or infinite fp16 scale is refused
        where the weight is written (builder/finite.py)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return dequantize(np.asarray(raw), qtype)

    def compute(stack):
        if len(t.shape) != 2:
            return decode(_read(t, stack)).reshape(t.shape)
        raw = stack.enter_context(mapped(t.raw))

        def rows(start: int, stop: int) -> np.ndarray:
            if t.rows is not None:  # un-permuted: gathered from the source rows of the same heads
                order = t.rows[start:stop]
                out = decode(raw[order])
                if len(order):
                    release(raw[order.min():order.max() + 1])
                return out
            piece = raw[start:stop]
            out = decode(piece)
            release(piece)
            return out

        return ComputedRows(rows, t.shape)

    return compute


def unpermute_rows(rows: int, heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's q/k permutation (transformers'
    LlamaTensorProcessor._reverse_permute_weights, on row indices)."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(2, 1).reshape(-1)


class GGUFCheckpoint(NamedTensors):
    """A GGUF file's tensors by Hugging Face name (see the package's docstring).

    Example:
        >>> raw, ckpt, metadata = GGUFCheckpoint.open_file("model-Q4_0.gguf")   # doctest: +SKIP
        >>> ckpt.weight("model.layers.0.self_attn.q_proj.weight").blocks.bits   # doctest: +SKIP
        4
    """

    def __init__(self, tensors: dict[str, GGUFTensor], path: Path):
        super().__init__({name: TensorInfo(name, FLOAT.get(t.kind, np.dtype(np.uint8)), t.shape, path, t.raw.offset,
                                           t.raw.nbytes) for name, t in tensors.items()})
        self.gguf = tensors
        self.path = path

    @classmethod
    def open_file(cls, path: str | os.PathLike) -> tuple[dict[str, Any], GGUFCheckpoint, dict[str, Any]]:
        """(config.json's equivalent, the checkpoint, the file's metadata) for a GGUF file."""
        path = Path(path)
        if importlib.util.find_spec("gguf") is None:  # its type table and dequantization are used
            raise BuildError("reading a GGUF file needs the gguf package (pip install gguf)")
        header = gguf_header.read(path)
        metadata = header.metadata
        entries = [(t.name, t.kind, t.shape, t.offset, t.nbytes) for t in header.tensors if t.name not in ROPE_TENSORS]
        rope = {ROPE_TENSORS[t.name]: rope_values(path, t) for t in header.tensors if t.name in ROPE_TENSORS}
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str) or arch not in FAMILIES:
            raise BuildError(f"{path}: GGUF architecture {arch!r:.80} is not supported; supported: "
                             f"{', '.join(sorted(FAMILIES))}")
        check_types(path, entries)
        names = {e[0] for e in entries}
        check_layer_count(path, metadata, arch, names)  # before config() sizes anything by it
        check_values(metadata, arch, path)
        check_sizes(path, metadata, arch, max(max(shape) for _, _, shape, _, _ in entries))
        check_tokenizer_metadata(path, metadata)  # now, not when the tokenizer is written after the weights
        raw = config(metadata, arch, names, rope)
        tensors = dict(_tensor(path, entry, arch, raw) for entry in entries)
        return raw, cls(tensors, path), metadata

    def weight(self, name: str, shape: Iterable[int] | None = None, packed: bool = False) -> Weight:
        """A lazy recipe for tensor `name`: a float tensor's values, a quantized one's blocks (its
        float32 values in a float build); marks it consumed. `packed` changes nothing: a GGUF holds
        no integer tensor an architecture unpacks itself."""
        info = self.info(name)
        if shape is not None and tuple(shape) != info.shape:
            raise BuildError(f"tensor {name!r} has shape {list(info.shape)} but the GGUF metadata implies "
                             f"{list(shape)}")
        self._consumed.add(name)
        t = self.gguf[name]
        if t.shift:  # in float32, as transformers' `weights - 1` on the dequantized values
            float_weight = self._unshifted(name)
            return float_weight.map(lambda x: x.astype(np.float32) - np.float32(t.shift), np.float32)
        return self._unshifted(name)

    def _unshifted(self, name: str) -> Weight:
        t = self.gguf[name]
        if t.kind in FLOAT:
            return Weight.source(t.shape, FLOAT[t.kind], lambda stack: _read(t, stack), name,
                                 by_rows=t.rows is None)  # un-permuted rows are gathered whole
        blocks = gguf_blocks(t.kind, t.shape, lambda stack: _read(t, stack)) if len(t.shape) == 2 else None
        return Weight(t.shape, np.float32, _dequantized(t), (name,), blocks, by_rows=len(t.shape) == 2)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        """Whether tensors `a` and `b` are stored alike: the same type, shape and bytes."""
        ta, tb = self.gguf[a], self.gguf[b]
        if ta.kind != tb.kind or ta.shape != tb.shape:
            return False
        with mapped(ta.raw) as x, mapped(tb.raw) as y:
            return bool(np.array_equal(x.view(np.uint8), y.view(np.uint8)))


def _tensor(path: Path, entry: tuple[str, str, tuple[int, ...], int, int], arch: str,
            raw: dict[str, Any]) -> tuple[str, GGUFTensor]:
    """One tensor of the file under its Hugging Face name, with what undoes the converter's changes
    (q/k rows permuted, a norm stored plus one)."""
    name, kind, shape, offset, nbytes = entry
    family = FAMILIES[arch]
    hf = hf_name(name, family)
    if hf is None:
        raise BuildError(f"{path}: tensor {name!r:.80} has no Hugging Face counterpart for {arch} "
                         "(not supported yet)")
    rows = shape[0] if len(shape) > 1 else 1
    info = TensorInfo(hf, FLOAT.get(kind, np.dtype(np.uint8)),
                      shape if kind in FLOAT else (rows, nbytes // rows), path, offset, nbytes)
    order = None
    if family.permute_qk and hf.endswith(("q_proj.weight", "k_proj.weight")):
        heads = raw["num_attention_heads"] if "q_proj" in hf else raw["num_key_value_heads"]
        if len(shape) != 2 or shape[0] % (2 * heads):
            raise BuildError(f"{path}: tensor {name} has shape {list(shape)}; llama.cpp's q/k row order "
                             f"needs an even number of rows per head for {heads} heads")
        order = unpermute_rows(shape[0], heads)
    shift = family.norm_shift if hf.endswith("norm.weight") else 0.0
    return hf, GGUFTensor(info, kind, shape, order, shift)


def check_types(path: Path, entries: list[tuple[str, str, tuple[int, ...], int, int]]) -> None:
    """Refuses, in one line, any tensor type builder cannot read; logs what happens to the others."""
    counts = Counter(kind for _, kind, *_ in entries)
    refused = sorted(k for k in counts if k not in FLOAT and k not in LAYOUT)
    if refused:
        first = next(name for name, kind, *_ in entries if kind == refused[0])
        raise BuildError(f"{path}: GGUF tensor type {', '.join(refused)} is not supported (e.g. {first}); "
                         f"supported: {', '.join([*FLOAT, *LAYOUT])}")
    for name, kind, shape, *_ in entries:
        if kind not in FLOAT and shape[-1] % BLOCK:
            raise BuildError(f"{path}: tensor {name} ({kind}) has rows of {shape[-1]} values, not whole blocks")
    how = {**{k: "float" for k in FLOAT},
           **{k: f"{b}-bit MatMulNBits blocks of {n} as stored{' with block minimums' if k in WITH_MINIMUM else ''} "
                 "in a quantized build, exact float otherwise" for k, (b, n) in LAYOUT.items()}}
    for kind, n in sorted(counts.items()):
        log.info("GGUF %s: %d tensors, %s", kind, n, how[kind])


def rope_values(path: Path, tensor: TensorEntry) -> list[float]:
    """A rotary scaling tensor's factors: finite and positive (each divides a frequency)."""
    if tensor.kind not in FLOAT:
        raise BuildError(f"{path}: {tensor.name} is {tensor.kind}, not a float tensor")
    info = TensorInfo(tensor.name, FLOAT[tensor.kind], tensor.shape, path, tensor.offset, tensor.nbytes)
    with mapped(info) as values:
        factors = values.astype(np.float32).reshape(-1)
    if not (np.isfinite(factors).all() and (factors > 0).all()):
        raise BuildError(f"{path}: {tensor.name} holds factors that are not positive finite numbers")
    return factors.tolist()




class GGUFSource:
    """A GGUF file (a Source): the config its metadata implies, its checkpoint (already open: the
    header is read for the config), and the tokenizer it carries, written into the output."""

    can_package = False  # a GGUF holds a decoder only

    def __init__(self, path: Path):
        self.config, self.checkpoint, self.metadata = GGUFCheckpoint.open_file(path)
        self.config_path = path
        self.stores_blocks = any(t.kind not in FLOAT for t in self.checkpoint.gguf.values())

    def check_quantization(self, accepted: tuple[str, ...]) -> None:
        """Nothing to refuse: the config made from the metadata has no quantization_config, and the
        file's quantized types are read as stored (check_types refused the others)."""

    def open_checkpoint(self) -> GGUFCheckpoint:
        """The file's tensors, whose header was read with the config."""
        return self.checkpoint

    def check_tokenizer(self) -> None:
        """Nothing left: the tokenizer metadata was checked when the file was opened."""

    def generation_config(self, vocab_size: int) -> dict[str, Any]:
        """None: a GGUF file stores no generation_config.json, so genai_config.json's defaults hold."""
        return {}

    def write_files(self, folder: Path) -> None:
        """tokenizer.json and tokenizer_config.json, made from the file's tokenizer metadata."""
        write_tokenizer(self.metadata, folder)

    def files_memory(self) -> int:
        return tokenizer_memory(self.metadata)
