"""Kill a server's tree if the pytest process that launched it dies without tearing it down (SIGKILL, OOM).

Run as `python -m pytest_sglang.launch.reaper PYTEST_PID SERVER_PID OWNER_TOKEN [SCANCEL_ARGS...]` in its own
session; with SCANCEL_ARGS (a SLURM server's job, launch/slurm.py) it runs `scancel SCANCEL_ARGS` first, so that
every node's tasks end too. It exits on its own once the server is gone; the launcher kills it after a normal
teardown.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import psutil

from pytest_sglang.launch.process import kill_tree, owned_processes

POLL_SECONDS = 0.5


def main(argv: list[str]) -> int:
    pytest_pid, server_pid, token, scancel = int(argv[0]), int(argv[1]), argv[2], argv[3:]
    while True:
        time.sleep(POLL_SECONDS)
        if not psutil.pid_exists(pytest_pid) or psutil.Process(pytest_pid).status() == psutil.STATUS_ZOMBIE:
            if scancel:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    subprocess.run(["scancel", *scancel], capture_output=True, timeout=30, check=False)
            kill_tree(server_pid, token, grace=5.0)
            return 0
        if not psutil.pid_exists(server_pid) and not owned_processes(token):
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
