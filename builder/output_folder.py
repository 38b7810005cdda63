"""What an output folder may be: the checks made before a build does any work, and the test of
whether an existing folder is a previous build's output, the only kind --overwrite replaces."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from builder.errors import BuildError
from builder.hub import TOKENIZER_FILES
from builder.audio_processor import AUDIO_PROCESSOR_FILE
from builder.image_processor import PROCESSOR_FILE
from builder.record_file import RECORD_FILE, is_record

# What a build writes besides *.onnx and *.onnx.data: a folder holding anything else is not a
# previous output, and --overwrite leaves it alone.
OUTPUT_FILES = frozenset({"genai_config.json", RECORD_FILE, PROCESSOR_FILE, AUDIO_PROCESSOR_FILE, *TOKENIZER_FILES})


def check_output(folder: Path, overwrite: bool, inputs: Iterable[Path] = (), flag: str = "--overwrite") -> None:
    """Refuses, before any work, an output that exists and is not an empty folder (unless overwrite,
    and then only a previous build's output), and any output that is, or holds, one of `inputs`.
    `flag` is how the caller asks to overwrite, for the messages."""
    if folder.is_file():
        raise BuildError(f"output {folder} is a file")
    if os.path.lexists(folder) and not folder.is_dir():
        raise BuildError(f"output {folder} exists and is not a folder")
    out = _real_path(folder)
    for source in inputs:
        if any(_within(path, out) for path in _input_paths(source)):
            raise BuildError(f"output {folder} is the input {source} or a folder holding it; choose another output")
    if _within(Path.cwd().resolve(), out):
        raise BuildError(f"output {folder} is the current folder or holds it; name a folder to create "
                         "(the build is written beside it and renamed into place)")
    if folder.is_dir() and any(folder.iterdir()):
        if not overwrite:
            raise BuildError(f"output folder {folder} exists and is not empty ({flag} replaces a previous build's output)")
        why = not_replaceable(folder)
        if why is not None:
            raise BuildError(f"output folder {folder} {why}; not replacing it, even with {flag}")


def _real_path(path: Path) -> Path:
    """Where `path` leads, through however many links; a link loop is left unresolved (as
    builder/inputs/trust.py judges one) where Path.resolve() would raise RuntimeError."""
    return Path(os.path.realpath(path))


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _input_paths(source: Path) -> list[Path]:
    """The input folder and wherever its files' links lead (a hub snapshot links into blobs/)."""
    source = _real_path(source)
    if not source.is_dir():
        return [source]
    return [source, *{_real_path(f).parent for f in source.iterdir() if f.is_symlink()}]


def is_output_file(path: Path) -> bool:
    """A regular file named as a build names its files (a link or a folder never is)."""
    try:
        regular = stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False
    return regular and (path.name in OUTPUT_FILES or path.name.endswith((".onnx", ".onnx.data")))


def output_files(folder: Path) -> list[Path]:
    """The files of `folder` that a build writes (none if it cannot be read)."""
    try:
        return [entry for entry in folder.iterdir() if is_output_file(entry)]
    except OSError:
        return []


def not_replaceable(folder: Path) -> str | None:
    """Why `folder` is not a previous build's output (what follows "output folder X"), or None when
    it is one, or empty: its build.yaml is builder's record and it holds nothing a build does not write."""
    try:
        if folder.is_symlink() or not folder.is_dir():
            return "is no longer a folder"
        names = sorted(os.listdir(folder))
    except OSError as e:
        return f"cannot be read ({e.strerror or e})"
    if not names:
        return None
    if RECORD_FILE not in names:
        return f"is not empty and has no {RECORD_FILE}, so it is not a previous build's output"
    if not is_record(folder / RECORD_FILE):
        return f"has a {RECORD_FILE} that builder did not write"
    unexpected = [name for name in names if not is_output_file(folder / name)]
    if unexpected:
        shown = ", ".join(unexpected[:3]) + (f" and {len(unexpected) - 3} more" if len(unexpected) > 3 else "")
        return f"holds {shown}, which a build does not write"
    return None
