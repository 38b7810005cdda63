"""Publishing a build: it is written into a hidden staging folder beside the output and renamed
into place only once complete.

Publishing never loses a file of the user's: an existing output is replaced only when it is
provably a previous build's (builder's build.yaml record and nothing but files a build writes),
one build at a time writes a path (a lock file beside it), the path is checked again at the moment
of publishing, and what killed builds left beside it is cleaned up, or put back, by the next build.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from builder.errors import BuildError
from builder.leftovers import STAGING_MARKER, clean_leftovers, remove_files
from builder.output_folder import check_output, not_replaceable, output_files
from builder.output_lock import lock_file, try_lock, unlock
from builder.renames import exchange, rename_without_replacing


class InterruptedAfterPublishing(KeyboardInterrupt):
    """Ctrl-C or SIGTERM came while the output was being published: it is complete at `folder`."""

    def __init__(self, folder: Path):
        super().__init__(str(folder))
        self.folder = folder


@contextlib.contextmanager
def staged_folder(final: Path, overwrite: bool, inputs: Iterable[Path] = (),
                  flag: str = "--overwrite", on_published: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yields a temporary sibling of `final`; on success it replaces `final`, on any failure it vanishes.

    A failed or interrupted build leaves neither a partial output nor a changed existing one. One
    build at a time writes a path (a lock beside it, held until published); the output is checked
    again when it is published, so a folder that appeared there meanwhile is never replaced; and
    what killed builds left beside it is cleaned up first (a previous output put back).
    `on_published(final)` is called the moment it is published, signals held: an interruption
    after it (while the lock is released, or on the caller's way out) knows the output is complete.
    """
    given, inputs = Path(final), list(inputs)
    check_output(given, overwrite, inputs, flag)
    # `-o out/.` is out, whose siblings are in out's parent; a link is published where it leads.
    final = Path(os.path.realpath(given))
    lock_path = lock_file(final.parent, final.name)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        lock = try_lock(lock_path)
    except OSError as e:
        raise BuildError(f"cannot write to {final.parent}: {e.strerror or e}") from None
    if lock is None:
        raise BuildError(f"another build is writing {given}; wait for it to finish")
    try:
        if lock >= 0:  # without a lock a running build's folders cannot be told from a killed one's
            clean_leftovers(final)
        check_output(given, overwrite, inputs, flag)  # again under the lock: a restored output counts
        existed = os.path.lexists(final)  # an empty folder, or with overwrite a previous output
        staging, published = None, False
        try:
            try:
                with _signals_deferred():  # a signal between the folder's creation and its naming would leave it
                    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.partial-", dir=final.parent))
                staging.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; the output follows the umask like mkdir
                (staging / STAGING_MARKER).write_text(f"{os.getpid()}\n")
            except OSError as e:
                raise BuildError(f"cannot write to {final.parent}: {e.strerror or e}") from None
            yield staging
            (staging / STAGING_MARKER).unlink()
            with _signals_deferred():
                replaced = _publish(staging, final, given, overwrite, existed)
                published = True
                if on_published is not None:
                    on_published(given)
                if replaced:
                    remove_files(output_files(staging), [staging], kept_warning=True)
        except KeyboardInterrupt as e:
            if published:
                raise InterruptedAfterPublishing(given) from e
            raise
        finally:
            if staging is not None and not published:
                shutil.rmtree(staging, ignore_errors=True)
    finally:
        unlock(lock_path, lock)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(staging: Path, final: Path, given: Path, overwrite: bool, existed: bool) -> bool:
    """Moves the complete build to `final`, refusing whatever appeared there during the build.
    Returns whether an output was replaced (then `staging` holds it, to be removed)."""
    if not os.path.lexists(final):
        if not rename_without_replacing(staging, final):
            raise _appeared(given)
        return False
    if not existed:
        raise _appeared(given)
    if not overwrite:
        # The empty folder that was there at the start: removed only while still empty (rmdir), then
        # the rename creates the output or fails, never replacing what was made in between.
        try:
            os.rmdir(final)
        except OSError:
            raise BuildError(f"output folder {given} changed during the build: it is no longer empty; not "
                             "replacing it (the build is discarded)") from None
        if not rename_without_replacing(staging, final):
            raise _appeared(given)
        return False
    why = not_replaceable(final)
    if why is not None:
        raise BuildError(f"output folder {given} changed during the build: it {why}; not replacing it "
                         "(the build is discarded)")
    if not exchange(staging, final):
        raise _appeared(final)
    return True


def _appeared(folder: Path) -> BuildError:
    return BuildError(f"output folder {folder} appeared during the build; not replacing it (the build is discarded)")


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends, so that publishing is never cut in half; one
    that came meanwhile is then handled as it would have been (a handler called, or the default)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread receives them as exceptions
        return
    caught: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not None:  # None: a handler not set from Python, left alone
            previous[signum] = signal.signal(signum, lambda received, _frame: caught.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in caught[:1]:
            handler = previous[signum]
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)
