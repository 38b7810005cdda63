"""One build at a time writes an output path: an exclusive lock on a hidden `.NAME.lock` file
beside it, held from before the build's staging folder is made until it is published."""

from __future__ import annotations

import errno
import os
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no flock; concurrent builds to one path are then caught only at publishing
    fcntl = None


def lock_file(parent: Path, name: str) -> Path:
    """The lock file of the output `name` in `parent` (a sibling, never inside an output)."""
    return parent / f".{name}.lock"


def try_lock(path: Path) -> int | None:
    """An exclusive lock on `path` (created if missing) as an open descriptor, or None while another
    process holds it. The holder unlinks the file on release, so a lock taken on a file unlinked
    meanwhile is taken again on the new one. -1 where there is no flock (Windows, some file
    systems): no locking."""
    if fcntl is None:
        return -1
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            unlock(path, fd)  # a file system without flock (some FUSE mounts): no locking there
            return -1
        except BaseException:
            os.close(fd)
            raise
        if _still_named(path, fd):
            return fd
        os.close(fd)


def _still_named(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (its holder may have unlinked it)."""
    opened = os.fstat(fd)
    try:
        current = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return (current.st_ino, current.st_dev) == (opened.st_ino, opened.st_dev)


def unlock(path: Path, fd: int) -> None:
    """Releases `try_lock`'s lock, unlinking its file first: builder never writes into it, so an
    empty file is the lock; a file of the user's that has contents is left alone."""
    if fd < 0:
        return
    try:
        if os.fstat(fd).st_size == 0:
            os.unlink(path)
    except OSError:
        pass  # a lock file left behind only costs the next build an open()
    finally:
        os.close(fd)
