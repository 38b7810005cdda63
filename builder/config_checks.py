"""The checks every config.json and generation_config.json value passes before a build uses it.

A value must have the type its dataclass field annotates (an integer is a float's value; a bool,
a float or a string is never an integer) and a value its use can take: sizes and counts positive,
other integers at least 0, numbers finite, token ids int32, rotary settings that make finite
cos/sin tables; fields must agree with each other (heads that group over the KV heads, one known
layer type per layer). Each refusal is one line naming the key. hf_config reads the files and
fills the dataclasses through these checks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import types
import typing
from typing import Any

from builder.errors import BuildError

log = logging.getLogger("builder")

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
    # Qwen-VL's vision_config
    "num_heads", "in_channels", "spatial_merge_size", "temporal_patch_size", "window_size", "out_hidden_size",
    # Whisper's (WhisperConfig's keys)
    "num_mel_bins", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
    "encoder_ffn_dim", "decoder_ffn_dim", "max_source_positions", "max_target_positions",
    # Numbers that divide: an eps of 0 makes a zero row (a padding token's embedding) 0/0 = NaN;
    # a scalar of 0 is 0 ** -0.5; a softcap of 0 is x / 0.
    "rms_norm_eps", "layer_norm_eps", "norm_eps", "norm_epsilon",
    "query_pre_attn_scalar", "final_logit_softcapping", "attn_logit_softcapping",
})
# Number lists whose upper end may be infinite: a Mamba-2 mixer's dt clamp, [0.0, Infinity] in the
# hub's configs (JSON's Infinity; transformers writes {"__float__": "Infinity"}) for "no upper limit".
UNBOUNDED_ABOVE = frozenset({"time_step_limit", "mamba_dt_limit"})
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
    numbers = value if isinstance(value, list) else [value]
    if key in UNBOUNDED_ABOVE and numbers and numbers[-1] == math.inf:
        numbers = numbers[:-1]
    for number in numbers:
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


def check_together(values: dict[str, Any], fields: dict[str, dataclasses.Field], key_prefix: str = "",
                   layer_types: tuple[str, ...] = LAYER_TYPES) -> None:
    """Refuses config fields that disagree: attention heads that do not group over the KV heads,
    a head_dim derived from a hidden_size the heads do not divide, layer_types not one known type
    per layer, LongRoPE factors not one per rotated pair of the head (numpy would broadcast a
    single one). `values`: the given ones; `fields`: the dataclass's, for the defaults of the rest;
    `layer_types`: the ones the family builds (a hybrid's convolution layers besides attention)."""
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
    given_types, layers = values.get("layer_types"), get("num_hidden_layers")
    if isinstance(given_types, list):
        unknown = [t for t in given_types if t not in layer_types]
        if unknown:
            raise BuildError(f"config.json: {key_prefix}layer_types has {unknown[0]!r}; builder builds "
                             f"{' and '.join(layer_types)} layers")
        if layers is not None and len(given_types) != layers:
            raise BuildError(f"config.json: {key_prefix}layer_types has {len(given_types)} entries for "
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
        # Only the layer types' entries count: transformers 5.25 saves a flat rope_parameters
        # given to Gemma 3 beside the per-type ones it makes, and reads the per-type ones alone.
        for layer_type, p in ((t, params[t]) for t in LAYER_TYPES if t in params):
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
    # llama3 with low_freq_factor >= high_freq_factor has no smoothing band (Llama 4 Scout's hub
    # config sets both to 1.0): transformers only warns and runs it, and so does the build
    # (blocks/rope.llama3_inv_freq refuses the one case that computes NaN).


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
