"""A tensor-parallel server of two ranks (torchrun, gloo on the CPU) through the plugin's generic kind.

benchmarks/tp_server/server.py under ``python -m torch.distributed.run --standalone --nproc-per-node 2``, in an
inner pytest run (realservers.InnerProject): readiness and the per-rank phase lines, a ``sglang_bench`` run,
and faults on rank 1 only while rank 0 waits in the step's all_reduce: a Python exception, and a SIGKILL.
Each fault's error must name the rank and its root cause within the fail-fast targets (docs/failures.md, "Every
fault"), and no process of the tree may survive (counted by TEST_MARK).

Needs torch: the vLLM CPU venv's (PYTEST_SGLANG_VLLM_PYTHON, as the real-server tests); skips without it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import REPO, marked_processes
from realservers import InnerProject, reap, server_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SERVER = REPO / "benchmarks" / "tp_server" / "server.py"
READY = "tp_server ready:"
FAULT_TIME = re.compile(r"\[rank1\]: fault: .* at t=(\d+\.\d+)")
# The fail-fast targets (docs/failures.md): an exit during startup 0.5 s, a traceback while alive about 1 s, a
# member's death "within about a second"; torchrun's agent adds its own reaction (monitor interval 0.1 s,
# SIGTERM to rank 0).
# Those are speeds, printed here and measured where speed is measured; the test holds the error to a margin it
# sets instead: well before the startup timeout (120 s) or the stall timeout (300 s) could have ended the startup,
# so the error is the fault's own, on a loaded runner too.
FAIL_FAST_S = 30.0

# The inner project's conftest: when a test's setup fails, the unix time (the fault line carries one too).
INNER_CONFTEST = '''
import json, os, time
def pytest_runtest_logreport(report):
    if report.when == "setup" and report.failed:
        with open(os.environ["TP_ERROR_STAMPS"], "a") as fh:
            fh.write(json.dumps({"test": report.nodeid, "t": time.time()}) + "\\n")
'''

INNER_TESTS = '''
import requests

def test_ready(sglang_server):
    assert requests.get(sglang_server.url("/health"), timeout=5).json() == {"status": "ok", "tp": 2}
    print("PHASES", sorted(sglang_server.phases), "STARTUP", sglang_server.startup_seconds)
    assert "ready" in sglang_server.phases and "http_up" in sglang_server.phases

def test_bench(sglang_bench):
    result = sglang_bench(num_requests=8, concurrency=4, input_len=16, output_len=16, warmup=1)
    print("BENCH", result.completed, result.total_output_tokens, round(result.output_throughput, 1))
    assert result.completed == 8 and result.total_output_tokens == 8 * 16
'''


def _profile(name: str, python: str, model: Path, mark: str, *extra: str) -> str:
    command = [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SERVER),
               "--model", "{model}", "--host", "{host}", "--port", "{port}", *extra]
    return (f"[profiles.{name}]\nkind = \"generic\"\nmodel = {json.dumps(str(model))}\n"
            f"command = {json.dumps(command)}\nready_pattern = {json.dumps(READY)}\nstartup_timeout = 120\n"
            f"shutdown_grace = 5\nenv = {{ TEST_MARK = \"{mark}\", PYTHONPATH = \"\" }}\n")


@pytest.fixture
def project(tmp_path: Path, mark: str) -> InnerProject:
    python = server_python("vllm")
    model = tmp_path / "tp-tiny"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 256, "hidden_size": 64}))
    (tmp_path / "inner").mkdir()
    inner = InnerProject(tmp_path / "inner", mark)
    inner.write("conftest.py", INNER_CONFTEST)
    inner.write("test_inner.py", INNER_TESTS)
    inner.write("profiles.toml", _profile("tp2", python, model, mark)
                + _profile("exc", python, model, mark, "--fault", "exception")
                + _profile("kill", python, model, mark, "--fault", "sigkill"))
    return inner


def test_two_ranks_are_ready_with_phases_and_serve_a_bench(project: InnerProject, mark: str) -> None:
    run = project.run("--sglang-profile=tp2", "-s", tag="ok", timeout=180)
    assert run.returncode == 0, run.explain()
    assert run.outcome("test_ready").outcome == "passed" and run.outcome("test_bench").outcome == "passed"
    print("\n".join(ln for ln in run.stdout.splitlines() if any(w in ln for w in ("PHASES", "BENCH", "ready in"))))
    log = (project.log_dir / "tp2.log").read_text()
    for rank in (0, 1):  # every rank's phases are in the one log, each line naming its rank
        for phase in ("Init torch distributed begin (backend gloo, world 2)", "Load weight begin", "Warmup end"):
            assert f"[rank{rank}]: {phase}" in log, log
    assert "[rank0]: Listening on http://127.0.0.1:" in log
    assert not reap(mark), "server processes survived"


@pytest.mark.parametrize("fault", ["exc", "kill"])
def test_a_fault_on_rank_1_names_it_at_once_and_leaves_nothing(
    project: InnerProject, mark: str, fault: str, tmp_path: Path
) -> None:
    stamps = tmp_path / "stamps.jsonl"
    run = project.run(f"--sglang-profile={fault}", "-k", "test_ready", tag=fault, timeout=180,
                      env={"TP_ERROR_STAMPS": str(stamps), "COLUMNS": "400"})
    left = marked_processes(mark)  # at once: pytest has exited, nothing of the tree may be waiting still
    message = run.outcome("test_ready").message
    assert run.outcome("test_ready").outcome == "error", run.explain()
    log = (project.log_dir / f"{fault}.log").read_text()
    match = FAULT_TIME.search(log)
    assert match, log
    took = json.loads(stamps.read_text().splitlines()[0])["t"] - float(match.group(1))
    print(f"{fault}: error {took:.2f} s after the fault\n{message[:3000]}")
    assert not left, f"alive when pytest exited: {[p.pid for p in left]}"
    assert took < FAIL_FAST_S, f"{took:.2f} s from the fault to the error:\n{message}"
    if fault == "exc":
        assert "RuntimeError: injected fault on rank 1 in warmup step 2" in message
        assert "(raised on rank1)" in message
        # the root cause comes first: before rank 0's consequence (gloo's "Connection closed by peer"), which a
        # loaded machine may not have logged yet when the error is made
        consequence = message.find("Connection closed by peer")
        assert consequence == -1 or message.index("injected fault on rank 1") < consequence
    else:
        # rank 1 is named first; how it died is readable only while it is a zombie, and torchrun's agent reaps it
        # at once (then it is "gone"), while rank 0, SIGTERMed by that agent, may still be read
        # A loaded runner can look only after both ranks are gone (CI saw it at 3.0 s): then the order is not
        # knowable and must be said so, never guessed; rank 0 is never named first.
        first = re.search(r"First process of the server's tree to die: (rank\d) \(pid \d+\): ([^,]+)", message)
        unknowable = re.search(r"First process of the server's tree to die: not knowable: .*rank1 \(pid \d+, gone\)",
                               message)
        assert (first and first.group(1) == "rank1") or unknowable, message
        assert unknowable or first.group(2).startswith(("killed by SIGKILL", "gone")), message  # type: ignore[union-attr]
    assert not reap(mark), "server processes survived"
