"""Reading Hugging Face config.json the way transformers reads it: the same keys, the same defaults.

Architectures declare a frozen dataclass whose field names are config.json's keys and whose
defaults are those of transformers' config class; `from_dict` fills it, refusing in one line any
value that is not of the field's annotated type or not in the range its use needs (a NaN epsilon,
a zero head count, a token id past int32), and `rope_parameters` resolves the three spellings of
rotary settings (`rope_theta` + `rope_scaling` with `type`, with `rope_type`, or the newer
`rope_parameters`) to the single dict transformers standardizes them to.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from builder.errors import BuildError

log = logging.getLogger("builder")

T = TypeVar("T")

SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")

# config.json integers that size or count something: zero divides by zero or builds nothing.
# (Not sliding_window: 0 is no window, as transformers itself saves Qwen2-MoE's without one; nor
# sliding_window_pattern, which Exaone4Config saves as 0 without a window: a family that derives
# layer_types from it refuses 0 there.)
POSITIVE = frozenset({
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "original_max_position_embeddings",
    "num_local_experts", "num_experts_per_tok",
    "moe_intermediate_size", "decoder_sparse_step", "moe_k", "moe_num_experts", "moe_layer_interval",
    "no_rope_layer_interval", "num_channels", "image_size", "patch_size", "mm_tokens_per_image", "text_hidden_size",
    # Numbers that divide: an eps of 0 makes a zero row (a padding token's embedding) 0/0 = NaN;
    # a scalar of 0 is 0 ** -0.5; a softcap of 0 is x / 0.
    "rms_norm_eps", "layer_norm_eps", "norm_eps", "norm_epsilon",
    "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
})
# Integers that may be negative: ERNIE 4.5's moe_layer_end_index (-1: the last layer). Every other
# integer is a count, an index or a flag, and at least 0.
SIGNED = frozenset({"moe_layer_end_index"})
# The layer types builder builds (transformers knows more: chunked, linear, ... attention).
LAYER_TYPES = ("full_attention", "sliding_attention")
# onnxruntime-genai reads token ids as int32.
INT32_MAX = 2**31 - 1
# Rotary settings that divide or scale the frequencies: positive finite numbers when given.
ROPE_POSITIVE = ("rope_theta", "factor", "attention_factor", "low_freq_factor", "high_freq_factor")
ROPE_FINITE = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "llama_4_scaling_beta")
ROPE_FACTOR_LISTS = ("short_factor", "long_factor", "freq_factors")


def parse_json(text: str | bytes, source: Path, problem: str = "not valid JSON") -> Any:
    """JSON from an input file: every JSON the build reads from the user's files goes through here,
    so a malformed one is one line (`source`: `problem` (why)), never a traceback. Bytes must be
    UTF-8 (json.loads would also guess UTF-16 or UTF-32, which no Hugging Face file is)."""
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except ValueError as e:  # not UTF-8, not JSON, or a number of more digits than int() takes (4300)
        raise BuildError(f"{source}: {problem} ({e})") from None
    except RecursionError:  # json's parser recurses per nesting level: [[[[...]]]] exhausts the stack
        raise BuildError(f"{source}: {problem} (nested too deeply)") from None


def load_json(path: Path, problem: str = "not valid JSON") -> Any:
    """The JSON value of the file at `path` (see parse_json); an unreadable file is one line too."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise BuildError(f"{path}: cannot read ({e.strerror or e})") from None
    return parse_json(text, path, problem)


def read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path` (config.json, generation_config.json), refused in one line when
    missing, unreadable or not an object."""
    if not path.is_file():
        raise BuildError(f"{path.parent} has no {path.name}: not a Hugging Face {what} folder")
    data = load_json(path)
    if not isinstance(data, dict):
        raise BuildError(f"{path}: expected a JSON object")
    return data


def from_dict(cls: type[T], raw: dict[str, Any], defaults: dict[str, Any] | None = None, key_prefix: str = "",
              **derived: Any) -> T:
    """Builds dataclass `cls` from config keys; `defaults` overrides the class defaults (per variant).

    Each value config.json gives, and each `derived` from it, is checked against the field's type
    annotation and the range its use needs (config_value), and the fields against each other
    (check_together), before the dataclass's __post_init__ divides or allocates by them; a bad one
    is refused in one line naming the key (`key_prefix` + key: "text_config.hidden_size")."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = dict(defaults or {})
    values.update({k: config_value(k, v, hints[k], key_prefix + k) for k, v in raw.items() if k in fields})
    values.update({k: config_value(k, v, hints[k], key_prefix + k) if k in hints else v for k, v in derived.items()})
    check_together(values, fields, key_prefix)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise BuildError(f"config.json: {e}") from None


def config_value(key: str, value: Any, hint: Any, name: str | None = None, source: str = "config.json") -> Any:
    """`value` of config key `key` (`name` in messages) when it has the annotated type `hint` and a
    value its use can take; else one line naming it. JSON gives no more than transformers' own
    checks accept: an integer where a float is annotated is a float's value; a float, a bool or a
    string is never an integer. Sizes and counts are positive, other integers not negative,
    numbers finite (JSON's NaN and Infinity parse), token ids int32 (see token_id); a negative
    pad_token_id reads as none."""
    name = name or key
    if not _conforms(value, hint):
        raise BuildError(f"{source}: {name} is {_shown(value)}; expected {_described(hint)}")
    if key.endswith("_token_id"):
        return token_ids(value, name, source) if isinstance(value, list) else token_id(value, name, source)
    if key == "rope_parameters" and isinstance(value, dict):
        check_rope(value, name, source)
        return value
    floats = hint is float or float in typing.get_args(hint)
    for number in value if isinstance(value, list) else [value]:
        _check_number(key, number, floats, name, source)
    return value


def _check_number(key: str, value: Any, float_field: bool, name: str, source: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if not math.isfinite(value):
        raise BuildError(f"{source}: {name} is {_shown(value)}; expected a finite number")
    if key in POSITIVE and value <= 0:
        kind = "number" if float_field else "integer"
        raise BuildError(f"{source}: {name} is {_shown(value)}; expected a positive {kind}")
    if not float_field and key not in SIGNED and value < 0:
        raise BuildError(f"{source}: {name} is {_shown(value)}; expected an integer of at least 0")
    if not float_field and abs(value) > INT32_MAX:  # ONNX Runtime and genai read sizes and ids as int32
        raise BuildError(f"{source}: {name} is {_shown(value)}; expected an integer below 2^31")


def check_together(values: dict[str, Any], fields: dict[str, dataclasses.Field], key_prefix: str = "") -> None:
    """Refuses config fields that disagree: attention heads that do not group over the KV heads,
    a head_dim derived from a hidden_size the heads do not divide, layer_types not one known type
    per layer, LongRoPE factors not one per rotated pair of the head (numpy would broadcast a
    single one). `values`: the given ones; `fields`: the dataclass's, for the defaults of the rest."""
    def get(name: str) -> Any:
        field = fields.get(name)
        default = None if field is None or field.default is dataclasses.MISSING else field.default
        return values.get(name, default)

    hidden, heads, kv = get("hidden_size"), get("num_attention_heads"), get("num_key_value_heads")
    if heads and kv and heads % kv:
        raise BuildError(f"config.json: {key_prefix}num_attention_heads ({heads}) is not a multiple of "
                         f"num_key_value_heads ({kv})")
    if hidden and heads and get("head_dim") is None and hidden % heads:
        raise BuildError(f"config.json: {key_prefix}hidden_size ({hidden}) is not a multiple of "
                         f"num_attention_heads ({heads}), and no head_dim says the heads' width")
    layer_types, layers = values.get("layer_types"), get("num_hidden_layers")
    if isinstance(layer_types, list):
        unknown = [t for t in layer_types if t not in LAYER_TYPES]
        if unknown:
            raise BuildError(f"config.json: {key_prefix}layer_types has {unknown[0]!r}; builder builds "
                             f"{' and '.join(LAYER_TYPES)} layers")
        if layers is not None and len(layer_types) != layers:
            raise BuildError(f"config.json: {key_prefix}layer_types has {len(layer_types)} entries for "
                             f"{layers} layers (num_hidden_layers)")
    rope = values.get("rope_parameters")
    if isinstance(rope, dict) and hidden and heads:
        head_dim = get("head_dim") or hidden // heads
        for params in rope.values() if any(t in rope for t in LAYER_TYPES) else [rope]:
            _check_rope_factor_counts(params, head_dim, key_prefix)


def _check_rope_factor_counts(params: dict[str, Any], head_dim: int, key_prefix: str) -> None:
    dims = int(head_dim * (params.get("partial_rotary_factor") or 1.0))  # as builder/blocks/rope.py rotates
    pairs = (dims + 1) // 2
    for key in ("short_factor", "long_factor"):
        factors = params.get(key)
        if isinstance(factors, list) and len(factors) != pairs:
            raise BuildError(f"config.json: {key_prefix}{key} has {len(factors)} factors, but a head rotating "
                             f"{dims} dimensions needs one per pair: {pairs}")


def token_id(value: Any, name: str = "token id", source: str = "config.json") -> int | None:
    """A special token id as onnxruntime-genai reads it (an int32 row of the vocabulary), or None.
    Several hub configs say pad_token_id -1 for "no pad token", which transformers accepts with a
    warning: read as none (genai then pads with the eos id), with a warning."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BuildError(f"{source}: {name} is {_shown(value)}; a token id is an integer of at least 0")
    if value < 0 and name.endswith("pad_token_id"):
        log.warning("warning: %s: %s %d is no token; building without a pad token", source, name, value)
        return None
    if not 0 <= value <= INT32_MAX:
        raise BuildError(f"{source}: {name} is {value}; a token id is an integer from 0 to 2^31 - 1 "
                         "(onnxruntime-genai reads int32)")
    return value


def token_ids(value: Any, name: str = "eos_token_id", source: str = "config.json") -> list[int]:
    """A token id or a list of them (eos_token_id), each checked by token_id."""
    if value is None:
        return []
    values = value if isinstance(value, (list, tuple)) else [value]
    return [i for i in (token_id(v, name, source) for v in values) if i is not None]


# generation_config.json's sampling settings genai_config.json takes, and the type each must have.
SAMPLING = {"do_sample": bool, "temperature": float, "top_k": int, "top_p": float, "repetition_penalty": float}


def generation_config(folder: Path, vocab_size: int) -> dict[str, Any]:
    """generation_config.json ({} without one) with what onnxruntime-genai takes from it checked:
    the token ids as token_id reads them (a bos id, eos and pad ids or lists of them; a pad
    list reads as its first id), the sampling settings as SAMPLING types them (numbers finite,
    top_k at least 0). Ids past the vocabulary are a warning, as in transformers."""
    path = folder / "generation_config.json"
    if not path.is_file():
        return {}
    generation = dict(read_json(path, "model"))
    source = "generation_config.json"
    for key, hint in {"bos_token_id": int | None, "eos_token_id": int | list[int] | None,
                      "pad_token_id": int | list[int] | None, **{k: t | None for k, t in SAMPLING.items()}}.items():
        if key in generation:
            generation[key] = config_value(key, generation[key], hint, source=source)
    if isinstance(generation.get("pad_token_id"), list):
        generation["pad_token_id"] = (generation["pad_token_id"] or [None])[0]
    warn_past_vocabulary({k: generation.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
                         vocab_size, source)
    return generation


def warn_past_vocabulary(ids: dict[str, int | list[int] | None], vocab_size: int, source: str) -> None:
    """Token ids past the vocabulary: transformers only warns (hub configs have them), but the
    model never produces such an eos, and genai pads with such a pad id into an out-of-range lookup."""
    for name, value in ids.items():
        past = [i for i in token_ids(value, name, source) if i >= vocab_size]
        if past:
            log.warning("warning: %s: %s %d is past the vocabulary (%d tokens)", source, name, past[0], vocab_size)


def check_rope(params: dict[str, Any], name: str, source: str = "config.json") -> None:
    """Refuses rotary settings that make NaN or infinite cos/sin tables (a theta or factor that is
    not a positive finite number, a partial_rotary_factor outside (0, 1], ...). `params`: one
    rope dict, or one per layer type (Gemma 3, OLMo 3); `name`: its key, for the message."""
    if any(t in params for t in LAYER_TYPES):
        for layer_type, p in params.items():
            if not isinstance(p, dict):
                raise BuildError(f"{source}: {name}.{layer_type} is {_shown(p)}; expected a JSON object")
            check_rope(p, f"{name}.{layer_type}", source)
        return
    for key, value in params.items():
        where = f"{source}: {f'{name}.' if name else ''}{key} is {_shown(value)}"
        if value is None and key == "rope_theta":  # every other rotary setting may be null (computed)
            raise BuildError(f"{where}; expected a positive finite number")
        if value is None:
            continue
        if key in ROPE_POSITIVE and not _positive_number(value):
            raise BuildError(f"{where}; expected a positive finite number")
        if key in ROPE_FINITE and not _finite_number(value):
            raise BuildError(f"{where}; expected a finite number")
        if key == "partial_rotary_factor" and not (_positive_number(value) and value <= 1):
            raise BuildError(f"{where}; expected a fraction of the head in (0, 1]")
        if key == "original_max_position_embeddings" and not (_conforms(value, int) and value > 0):
            raise BuildError(f"{where}; expected a positive integer")
        if key in ROPE_FACTOR_LISTS and not (isinstance(value, list) and all(_positive_number(v) for v in value)):
            raise BuildError(f"{where}; expected a list of positive finite numbers")
        if key in ("rope_type", "type") and not isinstance(value, str):
            raise BuildError(f"{where}; expected a string")
    low, high = params.get("low_freq_factor"), params.get("high_freq_factor")
    if params.get("rope_type") == "llama3" and low is not None and high is not None and low >= high:
        raise BuildError(f"{source}: {name}: llama3 rope needs low_freq_factor ({low}) below high_freq_factor ({high})")


def config_object(raw: dict[str, Any], key: str, source: str = "config.json") -> dict[str, Any]:
    """`raw[key]` when it is a JSON object, {} when absent or null; anything else is refused."""
    value = raw.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BuildError(f"{source}: {key} is {_shown(value)}; expected a JSON object")
    return value


def rope_sources(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """config.json's `rope_scaling` and `rope_parameters` as given (each {} when absent), checked,
    with the top-level rotary numbers (rope_theta, Gemma 3's rope_local_base_freq,
    partial_rotary_factor), before any is merged into the standardized dict."""
    top = {k: raw[k] for k in ("rope_theta", "partial_rotary_factor") if raw.get(k) is not None}
    check_rope(top, "")
    local = raw.get("rope_local_base_freq")
    if local is not None and not _positive_number(local):
        raise BuildError(f"config.json: rope_local_base_freq is {_shown(local)}; expected a positive finite number")
    scaling, given = config_object(raw, "rope_scaling"), config_object(raw, "rope_parameters")
    check_rope(scaling, "rope_scaling")
    check_rope(given, "rope_parameters")
    return scaling, given


def _positive_number(value: Any) -> bool:
    return _finite_number(value) and value > 0


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _conforms(value: Any, hint: Any) -> bool:
    """Whether a JSON value has the annotated type (an int is a float's value; a bool is no number)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, h) for h in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list or hint is list:
        return isinstance(value, list) and (not args or all(_conforms(v, args[0]) for v in value))
    if origin is tuple:  # structure the modeling files fix, never a config.json key
        return isinstance(value, (list, tuple))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


_KINDS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("a boolean", "booleans"),
          str: ("a string", "strings"), type(None): ("null", "nulls")}


def _described(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_described(h) for h in args]
        return ", ".join(parts[:-1]) + " or " + parts[-1]
    if origin is list:
        return f"a list of {_KINDS.get(args[0], ('', 'values'))[1]}" if args else "a list"
    if origin is dict or hint is dict:
        return "a JSON object"
    return _KINDS.get(hint, (str(hint), ""))[0]


def _shown(value: Any) -> str:
    """A config value as JSON writes it, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def rope_parameters(
    raw: dict[str, Any], max_position_embeddings: int, default_theta: float = 10_000.0
) -> dict[str, Any]:
    """The standardized `rope_parameters` dict transformers derives from any config.json form.

    Priority, as in transformers' RotaryEmbeddingConfigMixin: values inside `rope_scaling` /
    `rope_parameters`, then top-level `rope_theta` / `partial_rotary_factor`, then defaults.
    """
    scaling, given = rope_sources(raw)
    params = dict(scaling or given)
    params.setdefault("rope_theta", raw.get("rope_theta", default_theta))
    if raw.get("partial_rotary_factor") is not None:
        params.setdefault("partial_rotary_factor", raw["partial_rotary_factor"])
    params.setdefault("rope_type", params.get("type", "default"))
    if params["rope_type"] in SCALED_ROPE_TYPES:
        if "original_max_position_embeddings" in raw:
            # Phi-3 keeps the pretraining length at top level; transformers lets it win.
            params["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
        else:
            params.setdefault("original_max_position_embeddings", max_position_embeddings)
    return params


def effective_window(window: int | None, max_positions: int) -> int | None:
    """A sliding window that can cut anything: one at least the context long never does (Phi-3.5's
    262144 over 131072 positions), and is dropped so those layers stay ordinary global ones."""
    return window if window and window < max_positions else None


def rope_parameters_by_layer_type(
    raw: dict[str, Any], max_position_embeddings: int, global_theta: float, local_theta_key: str, local_theta: float,
) -> dict[str, dict[str, Any]]:
    """Rotary settings per layer type, as transformers resolves them for configs whose sliding
    layers rotate differently (Gemma 3: Gemma3TextConfig): `rope_scaling` and `rope_theta`
    (default `global_theta`) apply to full-attention layers, `raw[local_theta_key]` (default
    `local_theta`) to sliding ones, which are never scaled. A `rope_parameters` already given per
    layer type is kept."""
    scaling, given = rope_sources(raw)
    params = {k: dict(v) for k, v in given.items()} if "full_attention" in given else {}
    full = params.setdefault("full_attention", {"rope_type": "default"})
    sliding = params.setdefault("sliding_attention", {"rope_type": "default"})
    full.update(scaling)
    full.setdefault("rope_theta", raw.get("rope_theta", global_theta))
    sliding.setdefault("rope_theta", raw.get(local_theta_key, local_theta))
    for p in (full, sliding):
        p.setdefault("rope_type", p.get("type", "default"))
        if p["rope_type"] in SCALED_ROPE_TYPES:
            p.setdefault("original_max_position_embeddings", max_position_embeddings)
    return params


def text_config(raw: dict[str, Any], key: str) -> dict[str, Any]:
    """A multimodal config.json's text decoder settings (`raw[key]`), with the outer config's token
    ids where it sets them: transformers' GenerationConfig.from_model_config takes the outer ones
    first and the text config's only where the outer config has none."""
    text = dict(config_object(raw, key))
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if raw.get(name) is not None:
            text[name] = config_value(name, raw[name], int | list[int] | None)
    return text
