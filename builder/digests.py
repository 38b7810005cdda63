"""The sha256 of each input file that build.yaml records, computed once per file version.

Hashing a checkpoint costs 0.6 CPU-seconds per GB here for the sha256 itself, plus 0.5 to 1.4 for
reading it (the most when it is larger than memory): half the CPU time of a gemma-3-12b-it int4
RTN build on two cores. Two kinds of input avoid it:
- a Hugging Face cache link to an LFS blob: the blob's file name is the sha256;
- a local file already hashed by an earlier build: its digest is remembered in
  `$XDG_CACHE_HOME/builder/sha256.json` (default `~/.cache/builder`), keyed by the file's resolved
  path and trusted only while its size, inode, device, mtime and ctime are all unchanged (the
  ctime changes with any write and cannot be set back, as git's index relies on).
The cache is an optimization only: when it cannot be read or written the file is hashed, and a
file that changes while it is hashed, or was modified in the last seconds, is not remembered. A
FIFO, folder or device at the cache path is skipped with a warning, never read or replaced.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import re
import stat
import tempfile
import time
from pathlib import Path

log = logging.getLogger("builder")
_SHA256 = re.compile(r"[0-9a-f]{64}")
CACHE_NAME = "sha256.json"
# A file modified less than this long before its hashing began is not remembered (git's "racily
# clean" rule; coarse file systems stamp to the second or two).
RECENT_NS = 3 * 10**9
# Remembered files at most; the oldest entries go first.
MAX_ENTRIES = 4096


def cache_path() -> Path | None:
    """The cache file, or None where there is no absolute place for it (no HOME: expanduser would
    leave a relative `~`; a relative XDG_CACHE_HOME, which the XDG spec says to ignore)."""
    root = os.environ.get("XDG_CACHE_HOME")
    if not root or not os.path.isabs(root):
        root = os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "builder" / CACHE_NAME if os.path.isabs(root) else None


def _stamp(path: Path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_ino, st.st_dev, st.st_mtime_ns, st.st_ctime_ns]


def _blob_name(path: Path) -> str | None:
    """A Hugging Face cache link to an LFS blob: the blob's name, which is the file's sha256."""
    if path.is_symlink():
        blob = Path(path.resolve()).name
        if _SHA256.fullmatch(blob):
            return blob
    return None


def file_sha256(path: Path) -> str:
    """The file's sha256 (read and hashed; for a hub blob link, the blob's name)."""
    if blob := _blob_name(path):
        return blob
    # Read through the page cache, where the writer may find the bytes again. O_DIRECT reads,
    # measured on the 24 GB gemma-3-12b-it, cost 14 CPU-s less but 14 s more wall time.
    digest = hashlib.sha256()
    buf = bytearray(8 * 2**20)  # one reused buffer: no fresh pages to fault in per chunk
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            digest.update(view[:n])  # releases the GIL: hashing overlaps the weight writer
    return digest.hexdigest()


def usable_cache_path() -> Path | None:
    """cache_path(), unless something other than a regular file is there: a FIFO would block the
    read forever, and a folder or a device is not ours to replace. That is skipped with a warning."""
    path = cache_path()
    try:
        mode = os.stat(path).st_mode if path is not None else None
    except OSError:  # none yet, or unreadable: reading it fails harmlessly, writing creates it
        return path
    if mode is not None and not stat.S_ISREG(mode):
        log.warning("warning: %s is not a regular file; input digests are not remembered there", path)
        return None
    return path


def _load(path: Path | None) -> dict[str, dict]:
    try:
        if path is None:
            return {}
        # O_NONBLOCK: a FIFO put there after usable_cache_path() looked must not block the open.
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return {}
            entries = json.loads(f.read())
    except Exception:  # noqa: BLE001 - whatever is wrong with the cache, the build hashes instead
        return {}
    return entries if isinstance(entries, dict) else {}


def _store(new: dict[str, dict], path: Path | None) -> None:
    """Merges `new` into the cache file, re-read just before (what another build wrote meanwhile
    is mostly kept; an entry lost to a race only means hashing that file again)."""
    if path is None:
        return
    try:
        if os.path.lexists(path) and not stat.S_ISREG(os.stat(path).st_mode):
            return  # became a FIFO or a folder since usable_cache_path() looked: not ours to replace
        entries = _load(path)
        for key in new:  # re-inserted at the end: the newest entries are the ones kept
            entries.pop(key, None)
        entries.update(new)
        entries = dict(list(entries.items())[-MAX_ENTRIES:])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{CACHE_NAME}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
    except Exception:  # noqa: BLE001 - the cache is an optimization: it never fails a build
        return


def cached_sha256(files: list[Path]) -> dict[Path, str]:
    """The files whose digest is known without reading them (hub blobs, remembered files)."""
    return _cached(files, usable_cache_path())


def _cached(files: list[Path], cache: Path | None) -> dict[Path, str]:
    known, entries = {}, None
    for f in files:
        if blob := _blob_name(f):
            known[f] = blob
            continue
        if entries is None:
            entries = _load(cache)
        entry = entries.get(str(f.resolve()))
        try:
            if (isinstance(entry, dict) and entry.get("stat") == _stamp(f)
                    and _SHA256.fullmatch(str(entry.get("sha256")))):
                known[f] = entry["sha256"]
        except (OSError, TypeError, ValueError):
            pass
    return known


def _hash_and_remember(files: list[Path]) -> dict[str, str]:
    cache = usable_cache_path()
    known = _cached(files, cache)
    digests, remembered = {}, {}
    for f in sorted(files):
        if f in known:
            digests[f.name] = known[f]
            continue
        started = time.time_ns()
        before = _stamp(f)
        digests[f.name] = file_sha256(f)
        # Not remembered: a file that changed while it was hashed, or one last modified so shortly
        # before the hash began that a rewrite during it, within the file system's timestamp
        # granularity, could have left the same stamp (measured from the start: hashing a large
        # file takes longer than RECENT_NS).
        if _stamp(f) == before and started - max(before[3], before[4]) > RECENT_NS:
            remembered[str(f.resolve())] = {"stat": before, "sha256": digests[f.name]}
    if remembered:
        _store(remembered, cache)
    return digests


def hash_inputs(files: list[Path]) -> concurrent.futures.Future:
    """Hashes `files` on a background thread (only those not already known); the future yields
    {name: sha256}."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
    future = pool.submit(_hash_and_remember, list(files))
    pool.shutdown(wait=False)
    return future
