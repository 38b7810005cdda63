"""builder's own families: every module here that declares a `builder.family.Family` (or a
package builder) registers it on import, and this package imports them all. pyproject.toml declares
it as a `builder.families` entry point, which builder/registry.py loads; the names below are that
registry's, kept here for the tests and for code that imports the families directly.

Adding a family is adding its module (and its test); nothing here names it.
"""

from __future__ import annotations

import importlib
import pkgutil

from builder import registry
from builder.errors import BuildError
from builder.package import PACKAGES

__all__ = ["ARCHITECTURES", "MODEL_TYPES", "PACKAGES", "BuildError", "families", "load", "load_package"]


def _import_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


_import_all()

# config.json's architecture name -> the family (architectures/<name>.py) that builds it.
ARCHITECTURES: dict[str, str] = registry.architectures()
# The hub's model_types a family's row builds -> (the row, its builder.family.ModelType).
MODEL_TYPES = registry.model_types()
families, load, load_package = registry.families, registry.load, registry.load_package
