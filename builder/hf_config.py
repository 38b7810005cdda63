"""Reading Hugging Face config.json the way transformers reads it: the same keys, the same defaults.

Architectures declare a frozen dataclass whose field names are config.json's keys and whose
defaults are those of transformers' config class; `from_dict` fills it, refusing in one line any
value that is not of the field's annotated type or not in the range its use needs (a NaN epsilon,
a zero head count, a token id past int32: the checks of builder.config_checks), and
`rope_parameters` resolves the three spellings of rotary settings (`rope_theta` + `rope_scaling`
with `type`, with `rope_type`, or the newer `rope_parameters`) to the single dict transformers
standardizes them to.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path
from typing import Any, TypeVar

from builder.config_checks import (
    LAYER_TYPES,
    check_together,
    config_object,
    config_value,
    rope_sources,
    warn_past_vocabulary,
)
from builder.errors import BuildError

T = TypeVar("T")

SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")


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
    check_together(values, fields, key_prefix, getattr(cls, "LAYER_TYPES", LAYER_TYPES))
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise BuildError(f"config.json: {e}") from None


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
    # Only the per-type entries: transformers keeps a flat dict given beside them, and ignores it.
    params = {k: dict(given[k]) for k in ("full_attention", "sliding_attention") if k in given} \
        if "full_attention" in given else {}
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
