"""The load generator spread over processes (issue 20 point 5): the cap's slots and the requests dealt out, one
Poisson arrival process across the workers, their results merged in request order, and no worker left behind."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from pytest_sglang.bench import run_bench, runner
from pytest_sglang.bench.spread import arrival_offsets, deal
from pytest_sglang.errors import BenchmarkError

from .simproc import run_sim

pytestmark = pytest.mark.timeout(120)


def test_the_caps_slots_and_the_requests_are_dealt_in_proportion() -> None:
    dealt = deal(20, 3, 8)
    assert [slots for _, slots in dealt] == [3, 3, 2]
    assert sorted(j for ix, _ in dealt for j in ix) == list(range(20))
    assert [len(ix) for ix, _ in dealt] == [8, 7, 5]  # 20 requests over 8 slots in turn: 3, 3 and 2 of each 8
    assert [slots for _, slots in deal(5, 4, 2)] == [1, 1]  # fewer slots than processes: one process per slot
    assert deal(5, 2, None) == [([0, 2, 4], None), ([1, 3], None)]


def test_the_arrivals_are_the_single_loops_poisson_process() -> None:
    rng = random.Random(7)
    gaps = [rng.expovariate(20.0) for _ in range(9)]
    offsets = arrival_offsets(10, 20.0, random.Random(7))
    assert offsets is not None and offsets[0] == 0.0
    assert [b - a for a, b in zip(offsets, offsets[1:], strict=False)] == pytest.approx(gaps)
    assert arrival_offsets(10, float("inf"), random.Random(7)) is None


def test_a_run_over_two_processes_keeps_the_cap_and_merges_every_request(tmp_path: Path) -> None:
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with run_sim(tmp_path, {"decode_tok_s": 100, "ttft_ms": 20, "max_batch": 64}, "--enable-metrics") as sim:
        r = run_bench(sim, num_requests=12, concurrency=4, input_len=8, output_len=20, warmup=1, rounds=2,
                      client_processes=2)
        paced = run_bench(sim, num_requests=12, concurrency=4, input_len=8, output_len=20, warmup=1,
                          request_rate=40.0, client_processes=3)
    assert r.client_processes == 2 and r.completed == 12 and r.failed == 0
    assert r.server_generation_tokens == r.total_output_tokens == 12 * 20  # the server saw what the workers sent
    assert all(rnd.concurrency <= 4 + 1e-9 for rnd in r.rounds)  # achieved: e2e summed over the duration
    assert all(rnd.concurrency > 3 for rnd in r.rounds), [rnd.concurrency for rnd in r.rounds]
    assert paced.completed == 12 and paced.client_processes == 3
    offsets = arrival_offsets(12, 40.0, random.Random(1))
    assert offsets is not None
    starts = [req.start - paced.requests[0].start for req in paced.requests]
    # each request left at its drawn arrival time (plus the cap's wait and the shared machine's scheduling)
    assert all(s >= o - 0.05 for s, o in zip(starts, offsets, strict=True)), (starts, offsets)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not [p for p in left if psutil.pid_exists(p)]


def test_a_bad_process_count_is_a_usage_error() -> None:
    with pytest.raises(BenchmarkError, match="client_processes must be an integer of at least 1"):
        run_bench("http://127.0.0.1:9", client_processes=0)


def test_workers_end_with_a_parent_that_is_killed(tmp_path: Path) -> None:
    code = ("import sys, time\nfrom pytest_sglang.bench.spread import WorkerPool\n"
            "pool = WorkerPool(2, 'http://127.0.0.1:9', None, 'completions', 5.0)\n"
            "print(' '.join(str(p.pid) for p in pool._procs), flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        workers = [psutil.Process(int(pid)) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2
    finally:
        parent.kill()
        parent.wait()
    _, alive = psutil.wait_procs(workers, timeout=15)
    for proc in alive:
        proc.kill()
    assert not alive, [p.pid for p in alive]


def test_a_client_bound_single_loop_is_run_again_over_the_spare_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that hogs the interpreter's lock makes this process's event loop wake late: the self-check calls
    the round client-bound, and the runner runs it again over worker processes (the machine's size stood in
    for: this one has too few cores to spare)."""
    monkeypatch.setattr(runner, "spare_processes", lambda: 2)
    stop = threading.Event()

    def hog() -> None:
        while not stop.is_set():
            sum(range(10_000))

    previous = sys.getswitchinterval()
    sys.setswitchinterval(0.1)  # each turn of the hog holds the lock 100 ms
    thread = threading.Thread(target=hog, daemon=True)
    thread.start()
    try:
        with run_sim(tmp_path, {"decode_tok_s": 200, "ttft_ms": 5}) as sim:
            r = run_bench(sim, num_requests=8, concurrency=8, input_len=8, output_len=60)
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous)
    assert r.client_processes == 2, r.client_bound_reason
    assert r.completed == 8 and r.failed == 0
