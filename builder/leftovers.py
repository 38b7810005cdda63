"""What killed builds leave beside an output, and its cleanup by the next build into the same
parent: a previous output that a killed --overwrite moved aside is put back, and hidden staging
folders are removed, each only when provably a build's and no build of that name is running."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from builder.output_folder import is_output_file
from builder.output_lock import lock_file, try_lock, unlock
from builder.renames import rename_without_replacing

log = logging.getLogger("builder")

# In a staging folder from its creation until it is published: a hidden `.NAME.partial-*` folder
# holding it is a killed build's, for the next build to remove.
STAGING_MARKER = ".builder-staging"
# A build's hidden siblings of its output NAME (tempfile.mkdtemp's 8 random characters): its
# staging folder, and the previous output moved aside while replacing it (the two-rename fallback).
LEFTOVER = re.compile(r"\.(?P<name>.+)\.(?P<kind>partial|old)-[a-z0-9_]{8}")
# onnx_ir's temporary folder for a weights file it is writing (the file inside is renamed out).
WRITER_TEMPORARY = re.compile(r"\..+\.onnx\.data\.[a-z0-9_]{8}")


def clean_leftovers(final: Path) -> None:
    """Puts back the previous output of any name in `final`'s parent that a killed --overwrite left
    aside (`.NAME.old-*`), then removes the hidden folders killed builds left there, each only when
    provably a build's and when no build of that name is running (its lock is free). Called with
    `final`'s own lock held."""
    parent = final.parent
    count, size = 0, 0
    for name, folders in sorted(_leftovers_by_name(parent).items()):
        lock_path = lock_file(parent, name)
        ours = name == final.name  # its lock is held already
        try:
            lock = None if ours else try_lock(lock_path)
        except OSError:
            continue  # cannot tell whether that build runs: leave its folders
        if not ours and (lock is None or lock < 0):
            continue  # that build is running (or, without locks, may be): its folders are in use
        try:
            removed, freed = _clean_name(parent / name, folders)
            count, size = count + removed, size + freed
        finally:
            if not ours:
                unlock(lock_path, lock)
    if count:
        from builder.units import human

        log.info("removed %d folder%s that killed builds left in %s (%s)", count, "" if count == 1 else "s",
                 parent, human(size))


def _leftovers_by_name(parent: Path) -> dict[str, list[Path]]:
    """The hidden `.NAME.partial-*` / `.NAME.old-*` folders in `parent`, by output NAME (none if
    `parent` cannot be read)."""
    groups: dict[str, list[Path]] = {}
    try:
        for entry in os.scandir(parent):
            match = LEFTOVER.fullmatch(entry.name)
            if match and entry.is_dir(follow_symlinks=False):
                groups.setdefault(match["name"], []).append(parent / entry.name)
    except OSError:
        return {}
    return groups


def _clean_name(final: Path, folders: list[Path]) -> tuple[int, int]:
    """clean_leftovers for one output name, under its lock: the folders removed and their bytes."""
    count, size = 0, 0
    try:
        _restore_previous_output(final, [f for f in folders if LEFTOVER.fullmatch(f.name)["kind"] == "old"])
        for folder in folders:
            owned = _owned(folder)
            if owned is None:
                log.info("kept %s: it holds files a build does not write", folder)
                continue
            size += remove_files(*owned)
            count += not os.path.lexists(folder)
    except OSError as e:  # an unreadable leftover stays; it does not stop this build
        log.info("kept what killed builds left beside %s: %s", final, e.strerror or e)
    return count, size


def _restore_previous_output(final: Path, asides: list[Path]) -> None:
    """A killed two-rename --overwrite left no output at `final` and the previous one in a
    `.NAME.old-*` folder: moved back (never over anything), the newest first."""
    if os.path.lexists(final):
        return
    candidates = [aside / final.name for aside in asides if (aside / final.name).is_dir()]
    for previous in sorted(candidates, key=lambda p: p.stat().st_mtime_ns, reverse=True):
        if rename_without_replacing(previous, final):
            log.warning("warning: restored %s: a build was killed while replacing it", final)
            return


def _owned(folder: Path) -> tuple[list[Path], list[Path]] | None:
    """The files and folders (deepest first) of a leftover `.NAME.partial-*` / `.NAME.old-*` folder
    when provably a build's: a staging folder with its marker, or only what a build writes (an
    output's files; onnx_ir's temporary `.X.onnx.data.*` folders; a moved-aside output). Else None."""
    if (folder / STAGING_MARKER).is_file() and not (folder / STAGING_MARKER).is_symlink():
        files, dirs = [], []
        for root, subdirs, names in os.walk(folder, topdown=False):
            files += [Path(root) / n for n in names] + [Path(root) / d for d in subdirs if Path(root, d).is_symlink()]
            dirs += [Path(root) / d for d in subdirs if not Path(root, d).is_symlink()]
        return files, [*dirs, folder]
    files, dirs = [], []
    for entry in sorted(folder.iterdir()):
        if is_output_file(entry):
            files.append(entry)
        elif entry.is_dir() and not entry.is_symlink() and _is_build_subfolder(folder, entry):
            inner = list(entry.iterdir())
            if not all(is_output_file(f) for f in inner):
                return None
            files += inner
            dirs.append(entry)
        else:
            return None
    return files, [*dirs, folder]


def _is_build_subfolder(folder: Path, entry: Path) -> bool:
    """onnx_ir's temporary folder for a weights file, or the output moved aside into `.NAME.old-*`."""
    kind = LEFTOVER.fullmatch(folder.name)["kind"]
    if kind == "old":
        return entry.name == LEFTOVER.fullmatch(folder.name)["name"]
    return WRITER_TEMPORARY.fullmatch(entry.name) is not None


def remove_files(files: list[Path], dirs: list[Path], kept_warning: bool = False) -> int:
    """Unlinks exactly `files`, then removes `dirs` (deepest first) if that left them empty; returns
    the bytes freed. A folder holding anything else is kept (with a warning if asked)."""
    freed = 0
    for f in files:
        try:
            size = f.lstat().st_size
            f.unlink()
            freed += size
        except OSError:
            pass  # gone already, or not ours to remove after all: its folder is then kept
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            if kept_warning:
                log.warning("warning: kept %s: files a build does not write appeared in it while it was replaced", d)
    return freed
