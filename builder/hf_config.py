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
