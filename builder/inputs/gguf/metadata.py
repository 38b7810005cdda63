"""config.json's equivalent from a GGUF file's metadata, and the checks of every value it reads
(type, range, and agreement with the tensors) before anything is sized by one."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.errors import BuildError
from builder.inputs.gguf.names import FAMILIES, Family

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
    check_values(metadata, arch)
    key = _reader(metadata, arch)
    raw = _sizes(metadata, arch, tensor_names, key)
    per_head = raw["hidden_size"] // raw["num_attention_heads"]
    head_dim = key("attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = key("rope.dimension_count")
    if head_dim is not None:
        raw["head_dim"] = head_dim
    _family_keys(raw, FAMILIES[arch], key, per_head, head_dim)
    _rope_scaling(raw, arch, key, rope_tensors or {}, per_head, head_dim)
    for name, meta in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        raw[name] = _one(metadata.get(f"tokenizer.ggml.{meta}"))
    return {k: v for k, v in raw.items() if v is not None}


def _reader(metadata: dict[str, Any], arch: str) -> Callable[..., Any]:
    """key(name, default=None): the value of `{arch}.<name>`, a one-element list as its element."""

    def key(name: str, default: Any = None) -> Any:
        return _one(metadata.get(f"{arch}.{name}", default))

    return key


def _sizes(metadata: dict[str, Any], arch: str, tensor_names: set[str], key: Callable[..., Any]) -> dict[str, Any]:
    """The keys every family has; refuses metadata that lacks one, or has fewer hidden units than heads."""
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
    if raw["hidden_size"] // raw["num_attention_heads"] == 0:
        raise BuildError(f"the GGUF metadata's {arch}.embedding_length ({raw['hidden_size']}) is smaller than its "
                         f"{arch}.attention.head_count ({raw['num_attention_heads']})")
    return raw


def _family_keys(raw: dict[str, Any], family: Family, key: Callable[..., Any], per_head: int,
                 head_dim: int | None) -> None:
    """The keys only some families state: a sliding window, soft-caps, Gemma's query scale and
    all-global layers, Phi-4-mini's partial rotary."""
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


def _rope_scaling(raw: dict[str, Any], arch: str, key: Callable[..., Any], rope_tensors: dict[str, list[float]],
                  per_head: int, head_dim: int | None) -> None:
    """rope_scaling from the scaling keys, or from the rotary tensors llama.cpp's converter wrote
    in their place: Llama 3.1/3.2's per-frequency factors, Phi-3's LongRoPE."""
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
        pairs = (key("rope.dimension_count") or head_dim or per_head) // 2  # one factor per rotated pair of dimensions
        if not len(rope_tensors["long_factor"]) == len(rope_tensors["short_factor"]) == pairs:
            raise BuildError(f"rope_factors_long and rope_factors_short hold {len(rope_tensors['long_factor'])} and "
                             f"{len(rope_tensors['short_factor'])} factors; the rotary dimensions need {pairs}")
        raw["rope_scaling"] = {"rope_type": "longrope", "long_factor": rope_tensors["long_factor"],
                               "short_factor": rope_tensors["short_factor"]}
        if key("rope.scaling.attn_factor") is not None:
            raw["rope_scaling"]["attention_factor"] = key("rope.scaling.attn_factor")
