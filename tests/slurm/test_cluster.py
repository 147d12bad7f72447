"""The test cluster itself (.ci/slurm-cluster.sh as conftest.py runs it): ports of its own, so that a second
cluster, or any controller on SLURM's port 6817, never gets its nodes; and a session that dies unannounced
(SIGKILL) leaves none of its daemons behind."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from slurmtools import SCRIPT, Cluster, cluster_script

DEFAULT_CTLD_PORT = 6817


def _ports(conf: Path) -> list[int]:
    return [int(p) for p in re.findall(r"^(?:SlurmctldPort|NodeName=\S+ .*Port)=?(\d+)", conf.read_text(), re.M)]


def _states(conf: Path) -> list[str]:
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=15,
                         env={**cluster_script(conf.parent), "SLURM_CONF": str(conf)}, check=False).stdout
    return sorted(out.split("\n")[:-1])


def _daemons(where: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and str(where / "slurm.conf") in " ".join(proc.cmdline()):
                found.append(proc)
    return found


@contextlib.contextmanager
def _squatter() -> Iterator[None]:
    """Something listening on SLURM's own port, as another cluster's controller would (if it is free here)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", DEFAULT_CTLD_PORT))
            s.listen()
        except OSError:
            pass  # a real one is there already: the same case
        yield


def test_a_second_cluster_has_ports_of_its_own_and_goes_with_the_session_that_started_it(cluster: Cluster) -> None:
    where = Path(tempfile.mkdtemp(prefix="sglang-slurm-"))
    session = subprocess.Popen(["sleep", "300"])  # the session that starts the second cluster
    watcher = subprocess.Popen(["bash", str(SCRIPT), "watch", str(session.pid)], env=cluster_script(where),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        with _squatter():
            done = subprocess.run(["bash", str(SCRIPT), "start"], env=cluster_script(where), capture_output=True,
                                  text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        ours, theirs = _ports(cluster.conf), _ports(where / "slurm.conf")
        assert len(ours) == len(theirs) == 3 and not set(ours) & set(theirs), (ours, theirs)
        assert DEFAULT_CTLD_PORT not in ours + theirs
        assert _states(where / "slurm.conf") == _states(cluster.conf) == ["node1 idle", "node2 idle"]
        assert _daemons(where), "the second cluster's daemons are not running"

        session.kill()  # no teardown runs: the watcher alone stops what the session started
        session.wait()
        deadline = time.monotonic() + 60
        while (left := _daemons(where)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert left == [], [p.cmdline() for p in left]
        assert watcher.wait(timeout=30) == 0
        assert _states(cluster.conf) == ["node1 idle", "node2 idle"]  # the session's own cluster untouched
    finally:
        session.kill()
        subprocess.run(["bash", str(SCRIPT), "stop"], env=cluster_script(where), capture_output=True, timeout=120,
                       check=False)
        watcher.kill()
        watcher.wait()
        subprocess.run(["rm", "-rf", str(where)], check=False)
