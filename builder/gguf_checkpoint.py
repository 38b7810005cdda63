"""GGUF files (llama.cpp's format) read as a Checkpoint: Hugging Face tensor names, lazy weights,
and the config.json that the file's metadata implies.

builder/gguf_header.py reads the header (metadata, tensor names, types, shapes and offsets), every
count checked against the file's size; each tensor's bytes are then mapped only while it is written,
like a safetensors slice. The metadata config.json is made from is checked for type and range, the
layer count against the tensors present, before anything is sized by it. Names follow
llama.cpp's (`blk.3.attn_q.weight`) and are mapped back to transformers' (`model.layers.3.self_attn.
q_proj.weight`), undoing what llama.cpp's converter (convert_hf_to_gguf.py) changed on the way in:
Llama's q/k rows permuted for its rotary layout (transformers' LlamaTensorProcessor reverses it the
same way, modeling_gguf_pytorch_utils.py); Gemma's norm weights stored as 1 + weight (its converter
folds Gemma's RMSNorm offset in; transformers' Gemma2TensorProcessor subtracts 1 again, as here).
Per family, some names differ: Gemma 2/3's sandwich norms (`post_attention_norm`, `ffn_norm` before
the MLP, `post_ffw_norm`), Phi-3's fused `attn_qkv` and `ffn_up` (gate rows, then up rows).

Rotary scaling that llama.cpp's converter stores as tensors (ROPE_TENSORS) is read into the config:
Llama 3.1/3.2's llama3 scaling as per-frequency factors (`rope_freqs`: each frequency divided by its
factor, as llama.cpp's rope does; transformers' GGUF loader skips it and builds the plain rotary),
Phi-3's LongRoPE long/short factors.

Tensor types: F32, F16 and BF16 are float weights. Q4_0, Q8_0, Q4_1, Q5_0, Q5_1 and the K-quants
Q2_K..Q6_K are written into MatMulNBits value for value by a quantized build (builder/gguf_blocks.py:
4- or 8-bit codes, blocks of 32 or 16, the minimums of Q4_1, Q5_1, Q2_K, Q4_K and Q5_K as per-block
offsets), nothing re-quantized; a float build dequantizes them (gguf.quants, the same numbers
transformers loads). Any other type is refused by name.
Decided: an int4 build of a Q8_0 tensor keeps its 8-bit blocks (8-bit MatMulNBits, lossless; 32 code
bytes and a scale per 32 values against int4's 16 and a scale, 1.8-1.9 times the bytes) rather than
rounding them again to 4 bits, which would stack a second rounding on the first; a user who wants
int4 sizes builds from the float checkpoint, where int4 rounds the original weights once.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from builder import gguf_header
from builder.checkpoint import Checkpoint
from builder.errors import BuildError
from builder.gguf_blocks import LAYOUT, WITH_MINIMUM, gguf_blocks
from builder.gguf_header import TensorEntry
from builder.gguf_tokenizer import check_tokenizer_metadata
from builder.lazy import Weight
from builder.mapping import TensorInfo, mapped

log = logging.getLogger("builder")

FLOAT = {"F32": np.dtype(np.float32), "F16": np.dtype(np.float16), "BF16": np.dtype(ml_dtypes.bfloat16)}
BLOCK = 32  # the smallest whole row of every quantized type


@dataclass(frozen=True)
class Family:
    """How one llama.cpp architecture maps onto a transformers architecture."""

    architecture: str  # transformers' class name, the key of architectures.ARCHITECTURES
    permute_qk: bool = False  # llama.cpp permuted q/k rows (LlamaModel.permute in its converter)
    names: dict[str, str] = field(default_factory=dict)  # layer names that differ from LAYER_NAMES
    norm_shift: float = 0.0  # llama.cpp stores norm weights plus this (Gemma: 1 + weight)
    model_type: str | None = None  # config.json's model_type, where it is not the GGUF architecture
    # Config keys the family reads from `{arch}.<metadata key>` when present.
    keys: dict[str, str] = field(default_factory=dict)
    # llama.cpp scales Gemma's queries by 1/sqrt(head_dim), or for the 27B (this many layers) by
    # 1/sqrt(hidden/heads) (llama-model.cpp, f_attention_scale); the file stores no query_pre_attn_scalar.
    layers_27b: int | None = None
    partial_rotary: bool = False  # rope.dimension_count gives partial_rotary_factor (Phi-4-mini's 0.75)


GEMMA_NAMES = {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"}
WINDOW = {"sliding_window": "attention.sliding_window"}
FAMILIES = {
    "llama": Family("LlamaForCausalLM", permute_qk=True),
    "qwen2": Family("Qwen2ForCausalLM"),
    "qwen3": Family("Qwen3ForCausalLM"),
    "gemma": Family("GemmaForCausalLM", norm_shift=1.0),  # plain pre-norm layers, no window or soft-cap
    "gemma2": Family("Gemma2ForCausalLM", names=GEMMA_NAMES, norm_shift=1.0, layers_27b=46, keys={
        **WINDOW, "attn_logit_softcapping": "attn_logit_softcapping",
        "final_logit_softcapping": "final_logit_softcapping"}),
    "gemma3": Family("Gemma3ForCausalLM", names=GEMMA_NAMES, norm_shift=1.0, layers_27b=62, model_type="gemma3_text",
                     keys={**WINDOW, "final_logit_softcapping": "final_logit_softcapping",
                           "rope_local_base_freq": "rope.freq_base_swa"}),
    "phi3": Family("Phi3ForCausalLM", names={"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
                   partial_rotary=True,
                   keys={**WINDOW, "original_max_position_embeddings": "rope.scaling.original_context_length"}),
}

# llama.cpp's names -> transformers' (gguf-py's tensor_mapping.py, read backwards).
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(name: str, family: Family = FAMILIES["llama"]) -> str | None:
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    layer_names = {**LAYER_NAMES, **family.names}
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in layer_names:
        return f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
    return None


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
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[t.kind]
    return lambda stack: dequantize(np.asarray(_read(t, stack)), qtype).reshape(t.shape)


def unpermute_rows(rows: int, heads: int) -> np.ndarray:
    """The row order that undoes llama.cpp's q/k permutation (transformers'
    LlamaTensorProcessor._reverse_permute_weights, on row indices)."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).swapaxes(2, 1).reshape(-1)


class GGUFCheckpoint(Checkpoint):
    """A GGUF file's tensors by Hugging Face name (see the module's docstring).

    Example:
        >>> raw, ckpt = GGUFCheckpoint.open_file("model-Q4_0.gguf")   # doctest: +SKIP
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
        tensors = {}
        for name, kind, shape, offset, nbytes in entries:
            hf = hf_name(name, FAMILIES[arch])
            if hf is None:
                raise BuildError(f"{path}: tensor {name!r:.80} has no Hugging Face counterpart for {arch} "
                                 "(not supported yet)")
            rows = shape[0] if len(shape) > 1 else 1
            info = TensorInfo(hf, FLOAT.get(kind, np.dtype(np.uint8)),
                              shape if kind in FLOAT else (rows, nbytes // rows), path, offset, nbytes)
            order = None
            if FAMILIES[arch].permute_qk and hf.endswith(("q_proj.weight", "k_proj.weight")):
                heads = raw["num_attention_heads"] if "q_proj" in hf else raw["num_key_value_heads"]
                if len(shape) != 2 or shape[0] % (2 * heads):
                    raise BuildError(f"{path}: tensor {name} has shape {list(shape)}; llama.cpp's q/k row order "
                                     f"needs an even number of rows per head for {heads} heads")
                order = unpermute_rows(shape[0], heads)
            shift = FAMILIES[arch].norm_shift if hf.endswith("norm.weight") else 0.0
            tensors[hf] = GGUFTensor(info, kind, shape, order, shift)
        return raw, cls(tensors, path), metadata

    def weight(self, name: str, shape=None) -> Weight:
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
            return Weight.source(t.shape, FLOAT[t.kind], lambda stack: _read(t, stack), name)
        blocks = gguf_blocks(t.kind, t.shape, lambda stack: _read(t, stack)) if len(t.shape) == 2 else None
        return Weight(t.shape, np.float32, _dequantized(t), (name,), blocks)

    def same_values(self, a: str, b: str, rows_per_chunk: int = 4096) -> bool:
        ta, tb = self.gguf[a], self.gguf[b]
        if ta.kind != tb.kind or ta.shape != tb.shape:
            return False
        with mapped(ta.raw) as x, mapped(tb.raw) as y:
            return bool(np.array_equal(x.view(np.uint8), y.view(np.uint8)))


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


# Rotary tensors llama.cpp's converter writes in place of config keys: read into the config.
ROPE_TENSORS = {"rope_freqs.weight": "freq_factors", "rope_factors_long.weight": "long_factor",
                "rope_factors_short.weight": "short_factor"}


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


_LAYER = re.compile(r"blk\.([0-9]+)\.")


def check_layer_count(path: Path, metadata: dict[str, Any], arch: str, names: set[str]) -> None:
    """Refuses a block_count that disagrees with the layers the tensors are for (blk.0 ... blk.N-1),
    before anything is sized by it: a corrupt count of 10^9 would otherwise allocate per-layer lists."""
    key = f"{arch}.block_count"
    count = _one(metadata.get(key))
    if not _is_int(count) or count < 1:
        raise BuildError(f"{path}: {key} must be a positive integer, got {count!r:.80}")
    layers = {int(m.group(1)) for m in map(_LAYER.match, names) if m}
    if len(layers) != count or min(layers) != 0 or max(layers) != count - 1:
        held = f"layers {min(layers)} to {max(layers)} ({len(layers)} of them)" if layers else "no layer"
        raise BuildError(f"{path}: {key} is {count} but the file has tensors for {held}")


def _one(value: Any) -> Any:
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# What config() reads from `{arch}.<key>`, by what it must hold where the file has it: sizes and
# counts (divisors, list lengths) positive integers, scales positive finite numbers (a NaN epsilon
# builds a model of NaNs, a zero one divides by zero).
POSITIVE_INTS = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count",
                 "attention.head_count_kv", "context_length", "attention.key_length", "rope.dimension_count",
                 "vocab_size", "rope.scaling.original_context_length")
POSITIVE_NUMBERS = ("attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.freq_base_swa", "rope.scaling.factor",
                    "rope.scaling.attn_factor", "attn_logit_softcapping", "final_logit_softcapping")
TOKEN_IDS = ("bos_token_id", "eos_token_id", "padding_token_id")
# Widths that are some tensor's dimension, or less.
SIZES = ("embedding_length", "feed_forward_length", "attention.head_count", "attention.head_count_kv",
         "attention.key_length", "rope.dimension_count", "vocab_size")


def check_sizes(path: Path, metadata: dict[str, Any], arch: str, largest: int) -> None:
    """Refuses a width no tensor has: each of these sizes is some tensor's dimension or less, and a
    corrupt one of 10^9 would size arrays (the rotary tables) before any tensor's shape is checked."""
    for name in SIZES:
        value = _one(metadata.get(f"{arch}.{name}", 0))
        if value > largest:
            raise BuildError(f"{path}: the GGUF metadata's {arch}.{name} is {value}, larger than any tensor "
                             f"dimension ({largest})")


def check_values(metadata: dict[str, Any], arch: str, path: Path | None = None) -> None:
    """Refuses, naming the metadata key (and the file, if given), a value config() reads that has
    the wrong type or range."""
    where = f"{path}: " if path else ""

    def refuse(key: str, want: str) -> BuildError:
        return BuildError(f"{where}the GGUF metadata's {key} must be {want}, got {metadata[key]!r:.80}")

    if isinstance(metadata.get(f"{arch}.attention.head_count_kv"), list) and \
            len(metadata[f"{arch}.attention.head_count_kv"]) > 1:
        raise BuildError(f"{where}this GGUF has a per-layer key/value head count, which builder does not read")
    for name in POSITIVE_INTS:
        value = _one(metadata.get(f"{arch}.{name}", 1))
        if not _is_int(value) or value < 1:
            raise refuse(f"{arch}.{name}", "a positive integer")
    for name in POSITIVE_NUMBERS:
        value = _one(metadata.get(f"{arch}.{name}", 1.0))
        if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0):
            raise refuse(f"{arch}.{name}", "a positive finite number")
    window = _one(metadata.get(f"{arch}.attention.sliding_window", 0))
    if not _is_int(window) or window < 0:
        raise refuse(f"{arch}.attention.sliding_window", "an integer of at least 0")
    if not isinstance(metadata.get(f"{arch}.rope.scaling.type", ""), str):
        raise refuse(f"{arch}.rope.scaling.type", "a string")
    for name in TOKEN_IDS:
        value = _one(metadata.get(f"tokenizer.ggml.{name}", 0))
        if not _is_int(value) or not 0 <= value < 2**31:
            raise refuse(f"tokenizer.ggml.{name}", "a token id (an integer from 0)")


def config(metadata: dict[str, Any], arch: str, tensor_names: set[str],
           rope_tensors: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """config.json's equivalent from the metadata, with the keys transformers reads them into
    (transformers/integrations/ggml.py, GGUF_CONFIG_MAPPING), plus what they leave out that the
    file states: head_dim (attention.key_length), rotary scaling (its keys, and the ROPE_TENSORS
    values in `rope_tensors`), the special token ids."""

    def key(name: str, default: Any = None) -> Any:
        return _one(metadata.get(f"{arch}.{name}", default))

    check_values(metadata, arch)
    rope_tensors = rope_tensors or {}
    family = FAMILIES[arch]
    tokens = metadata.get("tokenizer.ggml.tokens")
    raw: dict[str, Any] = {
        "architectures": [family.architecture],
        "model_type": family.model_type or arch,
        "num_hidden_layers": key("block_count"),
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv", key("attention.head_count")),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": key("context_length"),
        "rope_theta": key("rope.freq_base"),
        "vocab_size": key("vocab_size", len(tokens) if tokens is not None else None),
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }
    missing = [k for k, v in raw.items() if v is None]
    if missing:
        raise BuildError(f"the GGUF metadata lacks what {', '.join(missing)} is read from "
                         f"({arch}.block_count, .embedding_length, ...)")
    per_head = raw["hidden_size"] // raw["num_attention_heads"]
    if per_head == 0:
        raise BuildError(f"the GGUF metadata's {arch}.embedding_length ({raw['hidden_size']}) is smaller than its "
                         f"{arch}.attention.head_count ({raw['num_attention_heads']})")
    head_dim = key("attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = key("rope.dimension_count")
    if head_dim is not None:
        raw["head_dim"] = head_dim
    for name, meta in family.keys.items():
        if key(meta) is not None:
            raw[name] = key(meta)
    if raw.get("sliding_window") == 0:  # Phi-3's converter writes 0 for "none" (Phi-4)
        del raw["sliding_window"]
    if family.layers_27b is not None:
        raw["query_pre_attn_scalar"] = per_head if raw["num_hidden_layers"] == family.layers_27b else head_dim
        if "sliding_window" not in raw:  # Gemma 3's converter writes none for sliding_window_pattern 1: all global
            raw["layer_types"] = ["full_attention"] * raw["num_hidden_layers"]
    rope_dims = key("rope.dimension_count")
    if family.partial_rotary and rope_dims is not None:  # partial rotary (Phi-4-mini): rotated dims per head
        raw["partial_rotary_factor"] = rope_dims / per_head
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        if key("rope.scaling.factor") is None:
            raise BuildError(f"the GGUF metadata's {arch}.rope.scaling.type is {scaling!r:.80} but it has no "
                             f"{arch}.rope.scaling.factor")
        rope = {"rope_type": scaling, "factor": key("rope.scaling.factor")}
        if key("rope.scaling.original_context_length") is not None:
            rope["original_max_position_embeddings"] = key("rope.scaling.original_context_length")
        raw["rope_scaling"] = rope
    if "freq_factors" in rope_tensors:  # Llama 3.1/3.2's llama3 scaling, as llama.cpp stores it: theta_i / factor_i
        raw["rope_scaling"] = {**raw.get("rope_scaling", {"rope_type": "default"}),
                               "freq_factors": rope_tensors["freq_factors"]}
    if "long_factor" in rope_tensors or "short_factor" in rope_tensors:  # Phi-3's LongRoPE
        if set(rope_tensors) != {"long_factor", "short_factor"} or "original_max_position_embeddings" not in raw:
            raise BuildError("a LongRoPE GGUF needs rope_factors_long, rope_factors_short and "
                             f"{arch}.rope.scaling.original_context_length")
        pairs = (rope_dims or head_dim or per_head) // 2  # one factor per rotated pair of dimensions
        if not len(rope_tensors["long_factor"]) == len(rope_tensors["short_factor"]) == pairs:
            raise BuildError(f"rope_factors_long and rope_factors_short hold {len(rope_tensors['long_factor'])} and "
                             f"{len(rope_tensors['short_factor'])} factors; the rotary dimensions need {pairs}")
        raw["rope_scaling"] = {"rope_type": "longrope", "long_factor": rope_tensors["long_factor"],
                               "short_factor": rope_tensors["short_factor"]}
        if key("rope.scaling.attn_factor") is not None:
            raw["rope_scaling"]["attention_factor"] = key("rope.scaling.attn_factor")
    for name, meta in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        value = _one(metadata.get(f"tokenizer.ggml.{meta}"))
        raw[name] = value
    return {k: v for k, v in raw.items() if v is not None}
