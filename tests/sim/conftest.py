"""Launch the simulator as a real process tree, the way the plugin does, and leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import die_with_pytest
from simtools import Sim, alive, free_port


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., Sim]]:
    """launch(knobs_dict, *flags, port=None) -> Sim; every process is killed at teardown."""
    sims: list[Sim] = []

    def _launch(knobs: dict[str, Any] | None = None, *flags: str, module: str = "pytest_sglang.sim",
                port: int | None = None, env: dict[str, str] | None = None) -> Sim:
        port = port or free_port()
        log_path = tmp_path / f"sim-{len(sims)}.log"
        full_env = dict(os.environ)
        full_env.pop("PYTEST_SGLANG_SIM", None)
        if knobs is not None:
            full_env["PYTEST_SGLANG_SIM"] = json.dumps(knobs)
        full_env.update(env or {})
        args = list(flags)
        if module == "pytest_sglang.sim":
            args = ["--model-path", "sim/tiny", "--port", str(port), *args]
        with open(log_path, "wb") as log:
            launched = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                    start_new_session=True, preexec_fn=die_with_pytest())
        sim = Sim(proc, log_path, port, launched)
        sims.append(sim)
        return sim

    yield _launch
    for sim in sims:
        sim.kill_all()
    for sim in sims:
        for p in sim.seen.values():
            assert not alive(p), f"process {p.pid} survived teardown"
