"""The registry, read from the families' own declarations: every module here that declares a
`builder.family.Family` registers it on import, and this package imports them all.

Adding a family is adding its module (and its test); nothing here names it.
"""

from __future__ import annotations

import importlib
import pkgutil

from builder.errors import BuildError
from builder.family import FAMILIES, Family, ModelType
from builder.package import PACKAGES as _REGISTERED_PACKAGES
from builder.package import PackageBuilder

__all__ = ["ALIASES", "ARCHITECTURES", "MODEL_TYPES", "PACKAGES", "BuildError", "canonical", "families", "load", "load_package"]


def _import_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_import_all()

# config.json's architecture name -> the family that builds it.
_BY_ARCHITECTURE: dict[str, Family] = {a: f for f in FAMILIES.values() for a in f.architectures}
# ... and the module (architectures/<name>.py) that declares it: what --list-architectures prints.
ARCHITECTURES: dict[str, str] = {a: f.name for a, f in _BY_ARCHITECTURE.items()}
# The hub's model_types that transformers builds with one of a family's rows (Family.model_types):
# model_type -> (the row's architecture, what renames its keys and tensors).
MODEL_TYPES: dict[str, tuple[str, ModelType]] = {
    model_type: (alias.architecture, alias) for f in FAMILIES.values() for model_type, alias in f.model_types.items()
}
# Architectures whose checkpoints hold more than a decoder -> what builds the rest, registered by
# the module that defines it (builder.package.register_package).
PACKAGES: dict[str, PackageBuilder] = dict(_REGISTERED_PACKAGES)

# Hub spellings of a class that transformers knows by another name (the checkpoint's model_type
# selects transformers' own class): microsoft/Phi-3.5-MoE-instruct's config.json says PhiMoE.
ALIASES: dict[str, str] = {
    "PhiMoEForCausalLM": "PhimoeForCausalLM",
}


def canonical(architecture: str) -> str:
    return ALIASES.get(architecture, architecture)


def families() -> list[Family]:
    """Every declared family, in the order of their modules' names."""
    return [FAMILIES[name] for name in sorted(FAMILIES)]


def load_package(architecture: str) -> PackageBuilder | None:
    """The builder of `architecture`'s other models (its towers, an encoder), or None for a decoder alone."""
    return PACKAGES.get(architecture)


def load(architecture: str) -> Family:
    """The family that builds `architecture`; an unknown name fails listing the supported ones."""
    if architecture not in _BY_ARCHITECTURE:
        raise BuildError(
            f"unsupported architecture {architecture!r}; supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    return _BY_ARCHITECTURE[architecture]
