"""Server logs are private, and old ones do not pile up.

A server's log holds secrets: SGLang logs its whole ``server_args=ServerArgs(... api_key='...')``, vLLM its
arguments. So every folder the plugin makes for logs is 0700 and every log file 0600, whatever the umask.

Without --sglang-log-dir, each run writes to a new folder ``<temp>/pytest-sglang-<uid>/logs/<time>-<pid>``
(``PYTEST_SGLANG_STATE_DIR`` replaces ``<temp>/pytest-sglang-<uid>``). A new run keeps the KEEP_LOG_DIRS
newest of those folders, its own included, and removes the older ones, except a folder whose run is still
alive or whose log a server kept by --sglang-reuse still writes to. A folder given with --sglang-log-dir is
the user's and is never pruned.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

from pytest_sglang.envknobs import STATE_DIR_ENV, env_knobs
from pytest_sglang.errors import PluginError
from pytest_sglang.launch.members import pid_alive

KEEP_LOG_DIRS = 10
_RUN_DIR = re.compile(r"^\d{8}-\d{6}-(\d+)$")


def state_dir() -> Path:
    """This user's private folder for the plugin's state: kept servers, xdist runs, auto-created logs."""
    return env_knobs().state_dir or Path(tempfile.gettempdir()) / f"pytest-sglang-{os.getuid()}"


def private_dir(path: Path, *, ours: bool = False) -> Path:
    """``mkdir -p`` where every folder made is 0700. ``ours``: the folder is the plugin's own (under the temp
    dir): an existing one is made 0700 too, and one that another user owns (planted in a shared /tmp) is
    refused. A folder the user named that already exists keeps its mode."""
    missing = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for folder in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another xdist worker made it a moment ago
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # the umask may have taken bits away; it cannot add any, but be exact
    if ours and path not in missing:
        info = path.lstat()
        if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
            raise PluginError(f"{path} is not a folder of this user's (uid {os.getuid()}): refusing to write "
                              f"server logs there. Remove it, or set {STATE_DIR_ENV} to a private folder.")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(path, 0o700)
    return path


def open_log(path: Path) -> BinaryIO:
    """Open a server's log for writing, truncated, readable by this user only (also when it existed)."""
    private_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "wb")


def auto_log_dir(keep: int = KEEP_LOG_DIRS) -> Path:
    """A new private folder for this run's logs, after pruning the old ones down to ``keep`` with it."""
    base = state_dir()
    private_dir(base, ours=True)
    logs = private_dir(base / "logs", ours=True)
    prune_log_dirs(logs, keep=keep - 1)
    folder = logs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return private_dir(folder)


def prune_log_dirs(logs: Path, keep: int = KEEP_LOG_DIRS) -> list[Path]:
    """Remove the run folders under ``logs`` older than the ``keep`` newest; return what was removed. A
    folder whose run is alive, or that holds the log of a server kept by --sglang-reuse, stays."""
    runs = sorted((p for p in logs.iterdir() if _RUN_DIR.match(p.name) and p.is_dir()), key=lambda p: p.name)
    old = runs[:-keep] if keep > 0 else runs
    if not old:
        return []
    kept = _kept_log_dirs()
    removed = []
    for folder in old:
        match = _RUN_DIR.match(folder.name)
        if match is None or folder.resolve() in kept or pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _kept_log_dirs() -> set[Path]:
    """The log folders of servers that --sglang-reuse keeps (their state files say where each logs)."""
    found = set()
    for path in (state_dir() / "kept").glob("*/*.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            log_path = json.loads(path.read_text(encoding="utf-8"))["record"]["log_path"]
            if log_path:
                found.add(Path(log_path).resolve().parent)
    return found

