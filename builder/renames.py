"""Renaming folders without ever replacing one by accident: a rename that creates its destination
or fails, and the exchange of two folders, both atomic with Linux's renameat2() and with a
fallback of plain renames elsewhere."""

from __future__ import annotations

import errno
import functools
import os
import sys
import tempfile
from pathlib import Path

# Linux renameat2() flags (linux/fs.h) and the "current folder" directory descriptor.
RENAME_NOREPLACE, RENAME_EXCHANGE, AT_FDCWD = 1, 2, -100


@functools.lru_cache(maxsize=1)
def _libc_renameat2():
    if sys.platform != "linux":
        return None
    import ctypes

    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc 2.28+, musl 1.2.3+
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def _renameat2(source: Path, destination: Path, flags: int) -> bool:
    """Linux's renameat2(); False where the libc, kernel or file system lacks it (the caller then
    falls back), OSError for any other failure (FileExistsError: RENAME_NOREPLACE found something)."""
    function = _libc_renameat2()
    if function is None:
        return False
    import ctypes

    if function(AT_FDCWD, os.fsencode(source), AT_FDCWD, os.fsencode(destination), flags) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(destination))


def rename_without_replacing(source: Path, destination: Path) -> bool:
    """Renames `source` to `destination` if nothing is there; False if something is. Atomic with
    RENAME_NOREPLACE; the fallback (a check, then a rename) could still replace an empty folder made
    in the instant between them, and nothing else (a rename never replaces a non-empty folder)."""
    try:
        if _renameat2(source, destination, RENAME_NOREPLACE):
            return True
        if os.path.lexists(destination):
            return False
        os.rename(source, destination)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def exchange(staging: Path, final: Path) -> bool:
    """Swaps the new build and the previous output, so that `staging` then holds the previous one;
    False, with both put back, when something appeared at `final` between the fallback's renames.

    Atomic with Linux's renameat2(RENAME_EXCHANGE): the output path always holds a complete build,
    and a kill afterwards leaves the previous output in a hidden `.NAME.partial-*` folder that the
    next build removes. Where the libc, kernel or file system lacks it, two renames through a hidden
    `.NAME.old-*` folder: a kill between them leaves no output at the path, and the next build into
    the same parent moves the previous output back (builder/leftovers.py).
    """
    if _renameat2(staging, final, RENAME_EXCHANGE):
        return True
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
    try:
        os.rename(final, aside / final.name)
    except BaseException:
        os.rmdir(aside)
        raise
    try:
        created = rename_without_replacing(staging, final)
    except BaseException:
        _put_back(aside, final)
        raise
    if not created:
        _put_back(aside, final)
        return False
    os.rename(aside / final.name, staging)
    os.rmdir(aside)
    return True


def _put_back(aside: Path, final: Path) -> None:
    """Undoes exchange's first rename: the previous output back at `final`."""
    os.rename(aside / final.name, final)
    os.rmdir(aside)
