"""Reading Hugging Face config.json the way transformers reads it: the same keys, the same defaults.

Architectures declare a frozen dataclass whose field names are config.json's keys and whose
defaults are those of transformers' config class; `from_dict` fills it, and `rope_parameters`
resolves the three spellings of rotary settings (`rope_theta` + `rope_scaling` with `type`, with
`rope_type`, or the newer `rope_parameters`) to the single dict transformers standardizes them to.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from builder.errors import BuildError

T = TypeVar("T")

SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")


def read_json(path: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise BuildError(f"{path.parent} has no {path.name}: not a Hugging Face {what} folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: expected a JSON object")
    return data


def from_dict(cls: type[T], raw: dict[str, Any], defaults: dict[str, Any] | None = None, **derived: Any) -> T:
    """Builds dataclass `cls` from config keys; `defaults` overrides the class defaults (per variant)."""
    values = dict(defaults or {})
    names = {f.name for f in dataclasses.fields(cls)}
    values.update({k: v for k, v in raw.items() if k in names})
    values.update(derived)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        raise BuildError(f"config.json: {e}") from None


def rope_parameters(
    raw: dict[str, Any], max_position_embeddings: int, default_theta: float = 10_000.0
) -> dict[str, Any]:
    """The standardized `rope_parameters` dict transformers derives from any config.json form.

    Priority, as in transformers' RotaryEmbeddingConfigMixin: values inside `rope_scaling` /
    `rope_parameters`, then top-level `rope_theta` / `partial_rotary_factor`, then defaults.
    """
    params = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
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


def token_ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


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
    given = raw.get("rope_parameters")
    params = {k: dict(v) for k, v in given.items()} if isinstance(given, dict) and "full_attention" in given else {}
    full = params.setdefault("full_attention", {"rope_type": "default"})
    sliding = params.setdefault("sliding_attention", {"rope_type": "default"})
    if raw.get("rope_scaling"):
        full.update(raw["rope_scaling"])
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
    text = dict(raw.get(key) or {})
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if raw.get(name) is not None:
            text[name] = raw[name]
    return text
