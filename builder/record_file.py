"""build.yaml, builder's record in every output, as far as telling it from anyone else's file
goes: its name, its key, and `is_record`. Low on purpose: the publishing of an output
(output_folder.py) asks whether a folder is a previous build's without importing the options
that record.py writes into it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

# Every output holds one, builder's record; only a folder with it may be replaced (--overwrite).
RECORD_FILE = "build.yaml"
RECORD_KEY = "record"  # written by builder into build.yaml: version, source revision, input hashes
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
