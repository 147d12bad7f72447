"""A real two-node SLURM cluster on this host for the slurm tests: .ci/slurm-cluster.sh starts it (slurmctld and
two slurmd, node1 and node2, each in its own UTS namespace), once per session; starting a running one only
checks it. Where SLURM is not installed or the cluster cannot start (not root, no unshare), every test here is
skipped with the script's reason. Each test runs pytest in a subprocess on a project of its own, so that a
SIGKILL or a Ctrl-C hits that pytest alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import marked_processes
from slurmtools import CLUSTER_DIR, SCRIPT, Cluster, Project


@pytest.fixture(scope="session")
def cluster() -> Cluster:
    if shutil.which("srun") is None or shutil.which("slurmd") is None:
        pytest.skip("SLURM is not installed here (no srun/slurmd): .ci/run installs Debian's slurmctld, slurmd and "
                    "slurm-client (`.ci/slurm-cluster.sh install`)")
    done = subprocess.run(["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        pytest.skip(f"the two-node SLURM cluster could not start: {(done.stdout + done.stderr).strip()[-600:]}")
    return Cluster(conf=CLUSTER_DIR / "slurm.conf")


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
