"""The version of builder (its own module, so no module needs the whole package to read it)."""

__version__ = "0.1.0"
