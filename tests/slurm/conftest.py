"""A real two-node SLURM cluster on this host for the slurm tests: .ci/slurm-cluster.sh starts it (slurmctld and
two slurmd, node1 and node2, each in its own UTS namespace), once per session (per worker under pytest-xdist),
in a folder of the session's own and on free ports of its own, so that neither another session's cluster nor a
controller already on SLURM's port 6817 is ever the one its nodes register with; the session stops it at its
end, and a watcher (the script's `watch`) stops it should the session be SIGKILLed. Where SLURM is not
installed or the cluster cannot start (not root, no unshare), every test here is skipped with the script's
reason. Each test runs pytest in a subprocess on a project of its own, so that a SIGKILL or a Ctrl-C hits that
pytest alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import marked_processes
from slurmtools import SCRIPT, Cluster, Project, cluster_script


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    if shutil.which("srun") is None or shutil.which("slurmd") is None:
        pytest.skip("SLURM is not installed here (no srun/slurmd): .ci/run installs Debian's slurmctld, slurmd and "
                    "slurm-client (`.ci/slurm-cluster.sh install`)")
    # a short path of its own: slurmd puts its steps' unix sockets (108 bytes at most) under the spool folder here
    where = Path(tempfile.mkdtemp(prefix="sglang-slurm-"))
    # started before the cluster, so that a SIGKILL during its start leaves nothing either
    watcher = subprocess.Popen(["bash", str(SCRIPT), "watch", str(os.getpid())], env=cluster_script(where),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        done = subprocess.run(["bash", str(SCRIPT), "start"], env=cluster_script(where), capture_output=True,
                              text=True, timeout=120, check=False)
        if done.returncode != 0:
            pytest.skip(f"the two-node SLURM cluster could not start: {(done.stdout + done.stderr).strip()[-600:]}")
        yield Cluster(conf=where / "slurm.conf")
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=cluster_script(where), capture_output=True, timeout=120,
                       check=False)
        watcher.kill()
        watcher.wait()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def project(cluster: Cluster, tmp_path: Path, mark: str) -> Iterator[Project]:
    yield Project(path=tmp_path, cluster=cluster, mark=mark)
    for proc in marked_processes(mark):  # a failed test must not leave its server to the next one
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    for job in cluster.queue():
        subprocess.run(["scancel", job.split()[0]], env=cluster.env(), check=False, capture_output=True)
