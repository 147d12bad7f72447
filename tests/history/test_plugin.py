"""--sglang-history through real pytest runs on the simulator: each run appends one run (once under
pytest-xdist), with its commit, rounds, machine key and workload; the report's history section; and every store
it cannot use refused at session start, before any server launches, with the file left byte for byte."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import die_with_pytest, profile_toml

from pytest_sglang.history.store import HistoryStore

BENCH = '''
def test_tok_s(sglang_server, sglang_bench):
    r = sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=8, warmup=0, rounds=2)
    assert r.completed == 4
'''
SECOND = '''
def test_other(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=2, input_len=8, output_len=8, warmup=0)
'''


@pytest.fixture
def project(pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    for name in ("PYTEST_SGLANG_COMMIT", "GITHUB_SHA", "PYTEST_SGLANG_HISTORY_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "hist-machine")
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + profile_toml(
        "p", mark, sim="startup_seconds = 0.2, decode_tok_s = 400, ttft_ms = 5"))
    pytester.makepyfile(test_bench=BENCH)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim", *args,
                                         timeout=120)


def test_each_run_appends_one_run_with_its_commit_rounds_and_keys(project: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    run(project).assert_outcomes(passed=1)
    assert not [p for p in project.path.rglob("*") if p.suffix in (".sqlite", ".db")]  # nothing without the option
    history, report_path = project.path / "h.sqlite", project.path / "report.json"
    assert run(project, "--collect-only", f"--sglang-history={history}").ret == pytest.ExitCode.OK
    with HistoryStore.open(history, write=False) as store:
        assert store.runs() == []  # checked (and created) at the start; a run that ran nothing appends nothing

    monkeypatch.setenv("GITHUB_SHA", "0123456789abcdef0123456789abcdef01234567")
    run(project, f"--sglang-history={history}").assert_outcomes(passed=1)
    monkeypatch.setenv("PYTEST_SGLANG_COMMIT", "v1.2-rc")  # overrides GITHUB_SHA
    run(project, f"--sglang-history={history}").assert_outcomes(passed=1)
    monkeypatch.delenv("PYTEST_SGLANG_COMMIT")
    monkeypatch.delenv("GITHUB_SHA")  # and the project is no git repository: no commit to read
    run(project, f"--sglang-history={history}", f"--sglang-report={report_path}").assert_outcomes(passed=1)

    with HistoryStore.open(history, write=False) as store:
        runs, rows = store.runs(), store.rows()
    assert [(r.id, r.commit, r.exit_status) for r in runs] == [
        (1, "0123456789abcdef0123456789abcdef01234567", 0), (2, "v1.2-rc", 0), (3, None, 0)]
    tok = [r for r in rows if r.metric == "output_throughput"]
    assert [r.run_id for r in tok] == [1, 2, 3]
    report = json.loads(report_path.read_text())
    bench = report["profiles"]["p"]["benchmarks"][0]
    for row in tok:
        assert (row.profile, row.test) == ("p", "test_bench.py::test_tok_s")
        assert row.machine == bench["machine_key"] and row.machine.startswith("hist-machine | sglang ")
        assert row.workload == ("api=completions input_len=8 max_concurrency=4 num_requests=4 output_len=8 "
                                "prompt_kind=token_ids request_rate=inf rounds=2 seed=0 warmup=0")
        assert row.server_version == report["profiles"]["p"]["server_version"]
        assert len(row.rounds) == 2 and min(row.rounds) <= row.median <= max(row.rounds)
    assert tok[-1].rounds == tuple(r["output_throughput"] for r in bench["result"]["rounds"])
    assert {"median_ttft_ms", "median_tpot_ms", "request_throughput"} <= {r.metric for r in rows}
    section = report["history"]
    assert section["path"] == str(history) and section["run_id"] == 3 and section["commit"] is None
    series = {s["metric"]: s for s in section["series"]}
    assert series["output_throughput"]["runs"] == 3 and series["output_throughput"]["test"] == bench["test_id"]
    points = series["output_throughput"]["points"]
    assert [(p["run_id"], p["commit"], p["value"]) for p in points] == [(r.run_id, r.commit, r.median) for r in tok]
    assert section["steps"] == []  # three runs are too few to search


def test_the_ini_path_is_relative_to_the_ini_file_and_git_names_the_commit(project: pytest.Pytester,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    toml = (project.path / "pyproject.toml").read_text().replace(
        "[tool.pytest.ini_options]\n", '[tool.pytest.ini_options]\nsglang_history = "ci/history.sqlite"\n', 1)
    (project.path / "pyproject.toml").write_text(toml)
    sub = project.mkdir("sub")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "pyproject.toml"], ["commit", "-q", "-m", "first"]):
        subprocess.run([*git, *args], cwd=project.path, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=project.path, check=True,
                          capture_output=True, text=True).stdout.strip()
    monkeypatch.chdir(sub)
    run(project, "../test_bench.py").assert_outcomes(passed=1)
    with HistoryStore.open(project.path / "ci" / "history.sqlite", write=False) as store:
        assert [r.commit for r in store.runs()] == [head]  # the rootdir's git HEAD, with no variable set
    assert not (sub / "ci").exists()


def test_under_xdist_the_controller_appends_the_run_once_with_every_worker_s_benchmarks(
        project: pytest.Pytester) -> None:
    project.makepyfile(test_second=SECOND)
    history = project.path / "h.sqlite"
    run(project, "-n", "2", f"--sglang-history={history}").assert_outcomes(passed=2)
    with HistoryStore.open(history, write=False) as store:
        runs, rows = store.runs(), store.rows()
    assert len(runs) == 1
    assert {r.test for r in rows} == {"test_bench.py::test_tok_s", "test_second.py::test_other"}


def test_two_pytest_runs_at_once_both_append(project: pytest.Pytester) -> None:
    """Two CI jobs sharing one store, each a whole pytest run with its own server: both runs land, whole."""
    project.makepyfile(test_bench=BENCH.replace("output_len=8", "output_len=24"))
    history = project.path / "h.sqlite"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim",
            f"--sglang-history={history}"]
    procs = [project.popen([*args, f"--sglang-log-dir=logs{n}", f"--sglang-report=report{n}.json"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
             for n in range(2)]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    sections = [json.loads((project.path / f"report{n}.json").read_text())["history"] for n in range(2)]
    assert sorted(s["run_id"] for s in sections) == [1, 2]
    with HistoryStore.open(history, write=False) as store:
        assert [r.id for r in store.runs()] == [1, 2]
        rows = store.rows(["output_throughput"])
    for section in sections:  # each run's benchmark is there with both rounds, unless its figures were unusable
        mine = [len(r.rounds) for r in rows if r.run_id == section["run_id"]]
        assert mine == ([] if section["skipped"] else [2]), section["skipped"]
    assert len(rows) + sum(len(s["skipped"]) for s in sections) == 2


HOLDER = '''
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
'''


def _foreign(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER)")  # a table of our name does not make it ours
    conn.commit()
    conn.close()


def _history(path: Path, version: str | None = None) -> None:
    HistoryStore.open(path).close()
    if version is not None:
        conn = sqlite3.connect(path)
        conn.execute("UPDATE meta SET value = ? WHERE key = 'version'", (version,))
        conn.commit()
        conn.close()


BAD = {
    "foreign": (_foreign, "is an SQLite database but not a pytest-sglang history store (its tables: runs)"),
    "not sqlite": (lambda p: p.write_bytes(b"PK\x03\x04 a zip, not a store" * 64),
                   "is not a usable pytest-sglang history store (file is not a database)"),
    "read-only": (lambda p: (_history(p), p.chmod(0o444)), "is read-only (mode -r--r--r--)"),
    "newer": (lambda p: _history(p, "7"), "is of format version 7, newer than this pytest-sglang reads (version 1)"),
    "locked": (_history, "stayed locked by another process for 0.5 s"),
    "read-only folder": (lambda p: (_history(p), p.parent.chmod(0o555)), "sits in a read-only folder"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_a_store_the_run_cannot_use_stops_it_before_any_server_launches(project: pytest.Pytester, kind: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    make, message = BAD[kind]
    history, logs = project.path / "h.sqlite", project.path / "logs"
    make(history)
    before = history.read_bytes()
    holder = None
    if kind == "locked":
        monkeypatch.setenv("PYTEST_SGLANG_HISTORY_TIMEOUT", "0.5")
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(history)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, preexec_fn=die_with_pytest())
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    try:
        result = run(project, f"--sglang-history={history}", f"--sglang-log-dir={logs}")
    finally:
        if holder is not None:
            holder.communicate("", timeout=30)
        history.chmod(0o644)
        history.parent.chmod(0o755)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --sglang-history: *{message}*"])
    assert "It was left as it is" in result.stderr.str()
    assert not logs.exists(), "a server was launched"
    assert history.read_bytes() == before


STORE_BREAKS = '''
import os
from pathlib import Path

def test_tok_s(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=8, warmup=0)
    Path(os.environ["HISTORY"]).write_bytes(b"overwritten by the test, not a store any more")
'''


def test_a_run_that_cannot_be_appended_at_the_end_fails_and_says_why(project: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    history = project.path / "h.sqlite"
    monkeypatch.setenv("HISTORY", str(history))
    project.makepyfile(test_bench=STORE_BREAKS)
    result = run(project, f"--sglang-history={history}", "--sglang-report=report.json")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*ERROR: --sglang-history: this run was not appended: *not a usable*"])
    assert history.read_bytes() == b"overwritten by the test, not a store any more"
    section = json.loads((project.path / "report.json").read_text())["history"]
    assert section["path"] == str(history) and "not a usable" in section["error"]


def test_a_slower_server_from_some_run_on_is_a_step_in_the_report(project: pytest.Pytester,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Six sessions of the simulator, then six of one four times slower at decoding (far beyond what a loaded
    2-core runner's noise does to it): the twelfth run's report names the step at the first slow run, in the bad
    direction, with that run's commit."""
    project.makepyfile(test_bench=BENCH.replace("output_len=8", "output_len=32"))
    history, report_path = project.path / "h.sqlite", project.path / "report.json"
    toml = (project.path / "pyproject.toml").read_text()
    kept = []  # the runs whose benchmark was appended (a client-bound one on a loaded host is not)
    for i in range(12):
        if i == 6:
            (project.path / "pyproject.toml").write_text(toml.replace("decode_tok_s = 400", "decode_tok_s = 100"))
        monkeypatch.setenv("PYTEST_SGLANG_COMMIT", f"c{i + 1}")
        run(project, f"--sglang-history={history}", f"--sglang-report={report_path}").assert_outcomes(passed=1)
        if not json.loads(report_path.read_text())["history"]["skipped"]:
            kept.append(i + 1)
    section = json.loads(report_path.read_text())["history"]
    assert section["run_id"] == 12
    shown = subprocess.run([sys.executable, "-m", "pytest_sglang.history", str(history)], capture_output=True,
                           text=True, timeout=60, check=True).stdout
    steps = {s["metric"]: s for s in section["steps"]}
    assert "output_throughput" in steps, shown
    tok = steps["output_throughput"]
    first_slow = next(n for n in kept if n >= 7)
    assert (tok["index"], tok["run_id"], tok["commit"], tok["status"]) == (
        kept.index(first_slow) + 1, first_slow, f"c{first_slow}", "regressed"), shown
    assert tok["change_pct"] < -50 and tok["p_value"] <= 0.01
    assert f"output_throughput stepped down {abs(tok['change_pct']):.1f} % at run {tok['index']} " in shown


AB_TEST = '''
import pytest

@pytest.mark.sglang_ab("main", "cand")
def test_cand(sglang_ab):
    sglang_ab(num_requests=4, concurrency=4, input_len=8, output_len=16, rounds=3, warmup=0)
'''


def test_each_side_of_an_ab_run_is_its_own_series_keyed_by_the_ab_workload(pytester: pytest.Pytester, mark: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_SGLANG_MACHINE", "hist-machine")
    monkeypatch.setenv("PYTEST_SGLANG_COMMIT", "abc")
    sim = "startup_seconds = 0.2, decode_tok_s = {}, ttft_ms = 5"
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + profile_toml("main", mark, sim=sim.format(400))
                      + profile_toml("cand", mark, sim=sim.format(200)))
    pytester.makepyfile(test_ab=AB_TEST)
    history, report_path = pytester.path / "h.sqlite", pytester.path / "report.json"
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "--sglang-profile=main,cand",
                                  f"--sglang-history={history}", f"--sglang-report={report_path}",
                                  timeout=120).assert_outcomes(passed=1)
    with HistoryStore.open(history, write=False) as store:
        rows = store.rows(["output_throughput"])
    report = json.loads(report_path.read_text())
    (ab,) = report["ab"]
    skipped = {s["profile"] for s in report["history"]["skipped"]}  # client-bound on a loaded host: left out
    assert {r.profile for r in rows} == {"main", "cand"} - skipped
    for row in rows:
        assert row.test == "test_ab.py::test_cand" and row.machine.startswith("hist-machine | sglang ")
        assert row.workload == "concurrency=4 input_len=8 num_requests=4 output_len=16 rounds=3"
        assert list(row.rounds) == ab["rounds"][row.profile]  # every round, as the report's A/B lists them


def test_an_empty_history_option_is_a_usage_error(project: pytest.Pytester) -> None:
    result = run(project, "--sglang-history=", "--sglang-log-dir=logs")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --sglang-history was given but names no file (an unset CI variable*"])
    assert not (project.path / "logs").exists()
