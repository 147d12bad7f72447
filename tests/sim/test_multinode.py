"""The simulator across nodes (--nnodes/--node-rank/--dist-init-addr): rank 0 loads only once every other node
has joined at the dist-init address, a node >= 1 serves /health alone, and faults happen on `fault_node`."""

from __future__ import annotations

import time
from collections.abc import Callable

from simtools import Sim, free_port


def _nodes(launch: Callable[..., Sim], knobs: dict[str, object], nnodes: int = 2) -> list[Sim]:
    dist = f"127.0.0.1:{free_port()}"
    return [launch(knobs, "--tp", "2", "--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", dist)
            for rank in range(nnodes)]


def test_rank_0_waits_for_node_1_then_both_serve(launch: Callable[..., Sim]) -> None:
    dist = f"127.0.0.1:{free_port()}"
    flags = ("--tp", "2", "--nnodes", "2", "--dist-init-addr", dist)
    rank0 = launch({"startup_seconds": 1.0}, *flags, "--node-rank", "0")
    time.sleep(1.5)  # alone, rank 0 stays in its distributed init
    assert "Load weight begin" not in rank0.text() and "Init torch distributed begin." in rank0.text()
    rank1 = launch({"startup_seconds": 1.0}, *flags, "--node-rank", "1")
    rank0.wait_ready()
    assert " TP0] Load weight begin" in rank0.text()
    assert " TP1] Load weight begin" in rank1.text() and " TP0]" not in rank1.text()
    deadline = time.monotonic() + 10
    while rank1.get("/health").status_code != 200:
        assert time.monotonic() < deadline, rank1.text()
        time.sleep(0.1)
    assert rank1.get("/v1/models").status_code == 404  # a node >= 1 runs SGLang's health server only
    assert "fired up" not in rank1.text()
    assert rank0.get("/v1/models").status_code == 200


def test_traceback_on_fault_node_only(launch: Callable[..., Sim]) -> None:
    rank0, rank1 = _nodes(launch, {"startup_seconds": 1.5, "fault": "traceback", "fault_node": 1})
    rank1.wait_for(r"AttributeError: 'KimiK25ForConditionalGeneration'")
    assert " TP1] Scheduler hit an exception" in rank1.text()
    assert "Traceback" not in rank0.text()


def test_hang_on_node_1_never_joins(launch: Callable[..., Sim]) -> None:
    rank0, rank1 = _nodes(launch, {"startup_seconds": 0.5, "fault": "hang", "fault_node": 1})
    time.sleep(2.0)
    for sim in (rank0, rank1):
        assert sim.text().splitlines()[-1].endswith("Init torch distributed begin."), sim.text()
    assert rank1.get("/health").status_code == 503


def test_bad_multinode_flags_are_usage_errors(launch: Callable[..., Sim]) -> None:
    no_addr = launch({}, "--nnodes", "2", "--node-rank", "1")
    assert no_addr.proc.wait(20) == 2
    assert "--nnodes > 1 needs --dist-init-addr HOST:PORT" in no_addr.text()
    bad_rank = launch({}, "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "127.0.0.1:1")
    assert bad_rank.proc.wait(20) == 2
    assert "the node rank must be in 0..nnodes-1" in bad_rank.text()
