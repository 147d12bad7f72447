"""The agent's modes and its end (shipped last: the package's LOADER calls ``main`` once all are in place)."""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

from pytest_sglang.launch.agent.gpus import gpus, machine
from pytest_sglang.launch.agent.tree import stream, supervise, sweep

MODES = {"supervise": supervise, "stream": stream, "sweep": sweep, "machine": machine, "gpus": gpus}


def main(argv: list[str]) -> NoReturn:
    spec = json.loads(sys.stdin.buffer.readline())
    code = MODES[argv[-1]](spec)
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    # not the interpreter's exit: its finalization aborts (SIGABRT, "could not acquire lock for <stdin>") while
    # a daemon thread is blocked reading stdin, as supervise's is
    os._exit(code)

