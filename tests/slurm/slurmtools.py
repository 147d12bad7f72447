"""The slurm tests' helpers: the cluster's queue, a project with one slurm profile run by pytest in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers import REPO, interruptible, marked_processes, wait_for_no_processes

SCRIPT = REPO / ".ci" / "slurm-cluster.sh"


def cluster_script(where: Path) -> dict[str, str]:
    """The environment of .ci/slurm-cluster.sh for the cluster that lives in ``where``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**env, "SLURM_TEST_DIR": str(where)}


@dataclass(frozen=True)
class Cluster:
    conf: Path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTEST_XDIST", "PYTEST_CURRENT"))}
        return {**env, "SLURM_CONF": str(self.conf), "PYTHONPATH": str(REPO)}

    def queue(self) -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=15,
                             env=self.env(), check=False).stdout
        return [line for line in out.splitlines() if line.strip()]

    def wait_queue_empty(self, timeout: float = 20.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.queue()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


@dataclass
class Project:
    """A project folder with one slurm profile, a test file, and the pytest run on it."""

    path: Path
    cluster: Cluster
    mark: str

    def write(self, profile: str, tests: str) -> None:
        (self.path / "pyproject.toml").write_text(profile)
        (self.path / "test_it.py").write_text(tests)

    def argv(self, name: str, sim: bool = True) -> list[str]:
        return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                f"--sglang-profile={name}", *(["--sglang-sim"] if sim else []),
                f"--sglang-log-dir={self.path / 'logs'}", "-rA"]

    def run(self, name: str, timeout: float = 90.0, sim: bool = True) -> tuple[str, float]:
        began = time.monotonic()
        done = subprocess.run(self.argv(name, sim), cwd=self.path, capture_output=True, text=True, timeout=timeout,
                              env=self.cluster.env(), check=False)
        return done.stdout + done.stderr, time.monotonic() - began

    def start(self, name: str) -> subprocess.Popen[str]:
        return subprocess.Popen(self.argv(name), cwd=self.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=self.cluster.env(), start_new_session=True, preexec_fn=interruptible)

    def node_log(self, name: str, rank: int) -> Path:
        return self.path / "logs" / f"{name}.node{rank}.log"

    def wait_logged(self, name: str, rank: int, pattern: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = self.node_log(name, rank)
            if log.exists() and re.search(pattern, log.read_text(errors="replace")):
                return
            time.sleep(0.1)
        raise AssertionError(f"node {rank} never logged /{pattern}/ in {timeout} s")

    def left_behind(self) -> tuple[list[str], list[str]]:
        """What is left on either node (processes of this test's server) and in the queue, once settled."""
        procs = [" ".join(p.cmdline()[:6]) for p in wait_for_no_processes(self.mark, timeout=20.0)]
        return procs, self.cluster.wait_queue_empty()

    def node_processes(self, rank: int) -> list[int]:
        found = []
        for proc in marked_processes(self.mark):
            try:
                env = proc.environ()
                if env.get("SLURM_NODEID") == str(rank) and "pytest_sglang.sim" in " ".join(proc.cmdline()) \
                        and "pytest_sglang.sim.worker" not in " ".join(proc.cmdline()):
                    found.append(proc.pid)
            except Exception:  # noqa: BLE001 - gone meanwhile
                continue
        return found


def profile(name: str, mark: str, *, sim: str = "startup_seconds = 2", slurm: str = "nodes = 2",
            extra: str = "") -> str:
    return (f"[tool.pytest_sglang.profiles.{name}]\nargs = [\"--tp\", \"2\"]\nslurm = {{ {slurm} }}\n"
            f"env = {{ TEST_MARK = \"{mark}\" }}\nsim = {{ {sim} }}\n{extra}\n")
