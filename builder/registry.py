"""Which family builds a config.json, read from the families' own declarations.

Families and package builders register themselves when their modules are imported
(builder.family.register, builder.package.register_package). The modules are those of every
installed distribution's `builder.families` entry point: this project declares its own
`architectures` package in pyproject.toml, and another package of families registers the same
way, with no change here. The core therefore never imports a family by name; it asks this module.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any

from builder.errors import BuildError
from builder.family import FAMILIES, Family, ModelType
from builder.package import PACKAGES, PackageBuilder

GROUP = "builder.families"
# A source tree used without installing it has no entry points: its own families, by their package.
SOURCE_TREE_FAMILIES = "architectures"
_loaded: list[bool] = []


def _load() -> None:
    """Imports every `builder.families` entry point once (each module registers what it declares)."""
    if _loaded:
        return
    _loaded.append(True)
    points = importlib.metadata.entry_points(group=GROUP)
    for point in points:
        point.load()
    if not points:
        importlib.import_module(SOURCE_TREE_FAMILIES)


def families() -> list[Family]:
    """Every declared family, in the order of their names."""
    _load()
    return [FAMILIES[name] for name in sorted(FAMILIES)]


def architectures() -> dict[str, str]:
    """config.json's `architectures` names builder reads -> the family (its module's name) that builds each."""
    return {a: f.name for f in families() for a in f.architectures}


def model_types() -> dict[str, tuple[str, ModelType]]:
    """The hub's model_types that a family's row builds (Family.model_types) -> (the row, its ModelType)."""
    return {t: (alias.architecture, alias) for f in families() for t, alias in f.model_types.items()}


def load(architecture: str) -> Family:
    """The family that builds `architecture`; an unknown name fails listing the supported ones."""
    for family in families():
        if architecture in family.variants:
            return family
    raise BuildError(f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(architectures()))}")


def load_package(architecture: str) -> PackageBuilder | None:
    """The builder of `architecture`'s other models (its towers, an encoder), or None for a decoder alone."""
    _load()
    return PACKAGES.get(architecture)


def resolve(raw: dict[str, Any]) -> str:
    """The row that builds config.json `raw`: its model_type's where a family declares that
    model_type (as transformers' auto classes dispatch on it), else its first architecture."""
    model_type = raw.get("model_type")
    types = model_types()
    if isinstance(model_type, str) and model_type in types:
        return types[model_type][0]
    return raw["architectures"][0]
