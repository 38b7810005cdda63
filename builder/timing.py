"""The wall time of each stage of a build, logged at -v."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

log = logging.getLogger("builder")


@contextlib.contextmanager
def timed(stage: str) -> Iterator[None]:
    """Logs the stage's wall time at -v."""
    started = time.perf_counter()
    yield
    log.debug("%-20s %.2f s", stage, time.perf_counter() - started)
