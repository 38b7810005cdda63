"""YAML build files: the keys of BuildOptions, checked before anything else happens.

    model: google/gemma-3-12b-it
    precision: int4
    execution_provider: cpu
    block_size: 32
    search: {top_k: 64, top_p: 0.95}

Paths inside (model, input, output) are relative to the current folder, as on the command line.
A build's own record, build.yaml, is such a file; its `record` section is informational.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from builder.errors import BuildError
from builder.options import BuildOptions, OptionError
from builder.record_file import RECORD_KEY


def read(path: str | Path) -> dict[str, Any]:
    """The file's options as a dict (the `record` section dropped); one-line errors name the file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BuildError(f"{path}: cannot read ({e})") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise BuildError(f"{path}: not valid YAML{at}") from None
    except RecursionError:  # PyYAML composes nested collections recursively: [[[[...]]]] exhausts the stack
        raise BuildError(f"{path}: not valid YAML (nested too deeply)") from None
    except ValueError as e:  # an integer of more digits than int() takes (4300)
        raise BuildError(f"{path}: not valid YAML ({e})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BuildError(f"{path}: expected a mapping of option keys to values")
    data.pop(RECORD_KEY, None)
    return data


def options(path: str | Path | None, overrides: dict[str, Any], describe_override=lambda key: key) -> BuildOptions:
    """BuildOptions from a YAML file with `overrides` (command-line values) on top.

    An error names the file and key, or — for an overridden key — `describe_override(key)`.
    """
    values = read(path) if path is not None else {}
    values.update(overrides)
    try:
        return BuildOptions.from_dict(values)
    except OptionError as e:
        if e.key in overrides or path is None:
            raise BuildError(f"{describe_override(e.key)}: {e.message}") from None
        raise BuildError(f"{path}: key '{e.key}': {e.message}") from None
