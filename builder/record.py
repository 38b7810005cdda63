"""build.yaml: the resolved options, the tool's version, the source and the sha256 of every input
file (builder/digests.py) — enough for `python -m builder --config out/build.yaml --output other` to rebuild it.
Its name, key and `is_record` lie below, in record_file.py, for the publishing of an output."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from builder.options import BuildOptions
from builder.record_file import MAX_RECORD_BYTES, RECORD_KEY, is_record

# is_record and MAX_RECORD_BYTES are record_file.py's, re-exported for this module's users.
__all__ = ["MAX_RECORD_BYTES", "RECORD_KEY", "build_record", "hub_revision", "is_record", "write"]

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


def write(path: Path, document: dict[str, Any]) -> None:
    path.write_text(yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=100))
