"""build.yaml: the resolved options, the tool's version, the source and the sha256 of every input
file (builder/digests.py) — enough for `python -m builder --config out/build.yaml --output other` to rebuild it."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from builder.config_file import RECORD_KEY
from builder.options import BuildOptions

_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_revision(folder: Path) -> str | None:
    """The commit of a huggingface_hub snapshot folder (…/snapshots/<commit>)."""
    if folder.parent.name == "snapshots" and _COMMIT.fullmatch(folder.name):
        return folder.name
    return None


def build_record(options: BuildOptions, folder: Path, hashes: dict[str, str], version: str,
                 adapter: tuple[Path, dict[str, str]] | None = None) -> dict[str, Any]:
    """The YAML document: options with the source pinned, then the informational `record`.
    `adapter`: a LoRA adapter's local folder and the sha256 of its files; the rebuild reads the
    same folder (a hub adapter: its snapshot in the cache, whose commit the record names)."""
    values = options.to_dict()
    revision = hub_revision(folder)
    if options.input is not None or revision is None:
        values["input"] = str(folder.resolve())  # a local folder: rebuild from the same folder
    else:
        values["revision"] = revision  # a hub model: rebuild from the same commit
    values["output"] = str(options.output_folder.resolve())
    values["overwrite"] = False
    values[RECORD_KEY] = {
        "builder_version": version,
        "source": {"model": options.model, "folder": str(folder.resolve()), "revision": revision},
        "sha256": hashes,
    }
    if adapter is not None:
        adapter_folder, adapter_hashes = adapter
        values["adapter"] = str(adapter_folder.resolve())
        values[RECORD_KEY]["adapter"] = {"adapter": options.adapter, "folder": str(adapter_folder.resolve()),
                                         "revision": hub_revision(adapter_folder), "sha256": adapter_hashes}
    return values


# A build.yaml larger than this is no record of builder's (one lists a few hundred input files).
MAX_RECORD_BYTES = 16 * 2**20


def is_record(path: Path) -> bool:
    """Whether `path` is a build.yaml builder wrote: a YAML mapping whose `record` section names the
    builder_version (every build's since build.yaml exists, and save()'s crafted ones). Dart's,
    Flutter's or anyone else's build.yaml is not."""
    try:
        # Not blocking on a FIFO named build.yaml, not following a link: only a regular file is read.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            text = f.read(MAX_RECORD_BYTES + 1)
        if len(text) > MAX_RECORD_BYTES:
            return False
        document = yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError, RecursionError):  # unreadable or not YAML: not ours
        return False
    section = document.get(RECORD_KEY) if isinstance(document, dict) else None
    return isinstance(section, dict) and isinstance(section.get("builder_version"), str)


def write(path: Path, document: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100))
