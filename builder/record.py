"""build.yaml: the resolved options, the tool's version, the source and the sha256 of every input
file — enough for `python -m builder --config out/build.yaml --output other` to rebuild it."""

from __future__ import annotations

import concurrent.futures
import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from builder.config_file import RECORD_KEY
from builder.options import BuildOptions

_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def file_sha256(path: Path) -> str:
    """The file's sha256; for a Hugging Face cache link to an LFS blob, the blob's name is that hash."""
    if path.is_symlink():
        blob = Path(path.resolve()).name
        if _SHA256.fullmatch(blob):
            return blob
    digest = hashlib.sha256()
    buf = bytearray(8 * 2**20)  # one reused buffer: no fresh pages to fault in per chunk
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            digest.update(view[:n])  # releases the GIL: hashing overlaps the weight writer
    return digest.hexdigest()


def hash_inputs(files: list[Path]) -> concurrent.futures.Future:
    """Hashes `files` on a background thread; the future yields {name: sha256}."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
    future = pool.submit(lambda: {f.name: file_sha256(f) for f in sorted(files)})
    pool.shutdown(wait=False)
    return future


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
