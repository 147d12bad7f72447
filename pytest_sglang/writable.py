"""Whether a file or folder may be written, told before a run spends a GPU startup on it: the baseline file
and the run history are checked at session start with this."""

from __future__ import annotations

import os
import stat
from pathlib import Path


def existing_parent(path: Path) -> Path:
    """The nearest folder above ``path`` that exists (where a missing file or folder would be made)."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def may_write(path: Path) -> bool:
    """``os.access`` says whether this user may write; the mode bits say whether anyone is meant to (a file or
    folder made read-only with chmod a-w stays unwritten even by root, whom os.access lets through)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return os.access(path, os.W_OK) and bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
