"""The history store on real SQLite files: appends, concurrent writers in separate processes, and every file it
must refuse (locked, foreign, not SQLite, damaged, read-only, newer format) refused with the file left byte for
byte as it was."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import die_with_pytest

from pytest_sglang.errors import HistoryError, PluginError
from pytest_sglang.history import store as store_module
from pytest_sglang.history.store import APPLICATION_ID, BenchRecord, HistoryStore, RunRecord


def run(commit: str | None, tok_s: float, *, test: str = "t.py::test_a", workload: str = "input_len=16") -> RunRecord:
    bench = BenchRecord(profile="p", test=test, machine="m | sglang 0.5", workload=workload,
                        rounds={"output_throughput": [tok_s * 0.98, tok_s, tok_s * 1.01],
                                "median_ttft_ms": [40.0, 41.0, float("nan")]},
                        server_version="sglang 0.5", outcome="passed", gate="passed")
    return RunRecord(commit=commit, time=1_700_000_000.0, exit_status=0, gate="passed", benchmarks=(bench,))


def stored(path: Path, *runs: RunRecord) -> Path:
    with HistoryStore.open(path) as store:
        for r in runs:
            store.append(r)
    return path


def test_a_run_is_appended_with_its_rounds_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "h.sqlite"  # a missing folder is made
    with HistoryStore.open(path) as store:
        assert store.append(run("abc1234", 100.0)) == 1
        assert store.append(run(None, 90.0)) == 2
        rows = store.rows()
        runs = store.runs()
    assert [(r.id, r.commit, r.exit_status, r.gate) for r in runs] == [(1, "abc1234", 0, "passed"),
                                                                      (2, None, 0, "passed")]
    assert runs[0].created == "2023-11-14T22:13:20+00:00"
    tok = [r for r in rows if r.metric == "output_throughput"]
    assert [(r.run_id, r.median, r.rounds) for r in tok] == [(1, 100.0, (98.0, 100.0, 101.0)),
                                                             (2, 90.0, (90.0 * 0.98, 90.0, 90.0 * 1.01))]
    ttft = [r for r in rows if r.metric == "median_ttft_ms"]
    assert [r.rounds for r in ttft] == [(40.0, 41.0), (40.0, 41.0)]  # the NaN round is not stored
    assert {(r.profile, r.test, r.machine, r.workload, r.server_version) for r in rows} == {
        ("p", "t.py::test_a", "m | sglang 0.5", "input_len=16", "sglang 0.5")}
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    assert dict(raw.execute("SELECT key, value FROM meta"))["format"] == "pytest-sglang-history"
    raw.close()


def test_opening_an_existing_store_to_check_it_changes_no_byte(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    HistoryStore.open(path).close()
    HistoryStore.open(path, write=False).close()
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.sqlite"]  # no journal left beside it


def test_an_empty_file_becomes_a_new_store(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"
    path.touch()
    with HistoryStore.open(path) as store:
        assert store.append(run("a", 1.0)) == 1


def test_reading_a_missing_store_says_so(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"no history store at .*nope.sqlite: no such file"):
        HistoryStore.open(tmp_path / "nope.sqlite", write=False)
    assert not (tmp_path / "nope.sqlite").exists()


WRITER = textwrap.dedent('''
    import sys
    from pytest_sglang.history.store import BenchRecord, HistoryStore, RunRecord
    path, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(count):
        benches = tuple(BenchRecord(profile=name, test=f"t.py::test_{j}", machine="m", workload="w",
                                    rounds={"output_throughput": [float(i), float(i) + 1]}) for j in range(3))
        with HistoryStore.open(path, timeout=60) as store:  # each append opens anew, as each pytest run does
            store.append(RunRecord(commit=f"{name}-{i}", time=float(i), benchmarks=benches))
''')


def test_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "h.sqlite"  # created by whichever writer comes first
    writers, count = 4, 15
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"w{n}", str(count)],
                              preexec_fn=die_with_pytest(), stderr=subprocess.PIPE, text=True)
             for n in range(writers)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * writers, errors
    with HistoryStore.open(path, write=False) as store:
        runs, rows = store.runs(), store.rows()
    assert [r.id for r in runs] == list(range(1, writers * count + 1))
    assert sorted(r.commit or "" for r in runs) == sorted(f"w{n}-{i}" for n in range(writers) for i in range(count))
    assert len(rows) == writers * count * 3
    for n in range(writers):  # each writer's runs in its own order, each with all three benchmarks
        mine = [r for r in rows if r.profile == f"w{n}"]
        assert [r.median for r in mine] == [i + 0.5 for i in range(count) for _ in range(3)]


HOLDER = textwrap.dedent('''
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.read()
''')


def test_a_store_locked_past_the_timeout_is_an_error_and_left_as_it_is(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, preexec_fn=die_with_pytest())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(HistoryError, match=r"stayed locked by another process for 0.5 s .*"
                                               r"PYTEST_SGLANG_HISTORY_TIMEOUT"):
            HistoryStore.open(path, timeout=0.5)
    finally:
        holder.communicate("", timeout=30)
    assert path.read_bytes() == before
    with HistoryStore.open(path, timeout=5) as store:  # once released, the same store appends
        assert store.append(run("b", 1.0)) == 2


def foreign_db(path: Path) -> Path:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.commit()
    conn.close()
    return path


def damaged(path: Path) -> Path:
    stored(path, *(run(str(i), float(i)) for i in range(1, 40)))
    data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xff" * 4096  # page 2: a table's pages, header intact
    path.write_bytes(bytes(data))
    return path


BAD_FILES = {
    "foreign": (foreign_db, r"is an SQLite database but not a pytest-sglang history store \(its tables: users\)"),
    "not sqlite": (lambda p: (p.write_text('{"format": "pytest-sglang-baselines"}\n'), p)[1],
                   r"is not a usable pytest-sglang history store \(file is not a database\)"),
    "damaged": (damaged, r"is not a usable pytest-sglang history store \(database disk image is malformed\)"),
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_file_that_is_not_a_usable_store_is_refused_and_left_as_it_is(tmp_path: Path, kind: str) -> None:
    make, message = BAD_FILES[kind]
    path = make(tmp_path / "h.sqlite")
    before = path.read_bytes()
    for write in (True, False):
        with pytest.raises(HistoryError, match=message) as err:
            HistoryStore.open(path, write=write)
        assert "It was left as it is" in str(err.value) and "--sglang-history" in str(err.value)
    assert isinstance(err.value, PluginError)
    assert path.read_bytes() == before


def test_a_read_only_store_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        with pytest.raises(HistoryError, match=r"h.sqlite is read-only \(mode -r--r--r--\).*chmod u\+w"):
            HistoryStore.open(path)
        with HistoryStore.open(path, write=False) as store:  # reading it (the CLI) still works
            assert len(store.runs()) == 1
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == before


def test_a_store_in_a_read_only_folder_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    path = stored(folder / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    folder.chmod(0o555)
    try:
        with pytest.raises(HistoryError, match=r"sits in a read-only folder .*journal"):
            HistoryStore.open(path)
        with pytest.raises(HistoryError, match=r"new.sqlite cannot be created: its folder .*ro is read-only"):
            HistoryStore.open(folder / "new.sqlite")
    finally:
        folder.chmod(0o755)
    assert path.read_bytes() == before
    assert sorted(p.name for p in folder.iterdir()) == ["h.sqlite"]


def test_a_folder_is_not_a_store(tmp_path: Path) -> None:
    with pytest.raises(HistoryError, match=r"is a folder, not a file: .*\.sglang-history\.sqlite"):
        HistoryStore.open(tmp_path)


def set_version(path: Path, version: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'version'", (version,))
    conn.commit()
    conn.close()


def test_a_store_of_a_newer_format_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    set_version(path, "2")
    before = path.read_bytes()
    for write in (True, False):
        with pytest.raises(HistoryError, match=r"of format version 2, newer than this pytest-sglang reads "
                                               r"\(version 1\).*pip install -U pytest-sglang"):
            HistoryStore.open(path, write=write)
    assert path.read_bytes() == before


def test_an_older_format_is_upgraded_by_its_migration_and_keeps_every_row(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0), run("b", 90.0))

    def to_2(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE runs ADD COLUMN branch TEXT")

    monkeypatch.setattr(store_module, "VERSION", 2)
    monkeypatch.setattr(store_module, "MIGRATIONS", {1: to_2})
    with HistoryStore.open(path) as store:
        assert [r.commit for r in store.runs()] == ["a", "b"]
        assert store.append(run("c", 80.0)) == 3
    conn = sqlite3.connect(path)
    assert dict(conn.execute("SELECT key, value FROM meta"))["version"] == "2"
    assert [r[0] for r in conn.execute("SELECT branch FROM runs")] == [None, None, None]
    conn.close()


def test_an_older_format_without_a_migration_is_refused_and_left_as_it_is(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    monkeypatch.setattr(store_module, "VERSION", 3)
    monkeypatch.setattr(store_module, "MIGRATIONS", {1: lambda conn: None})
    with pytest.raises(HistoryError, match=r"cannot upgrade \(no migration from version 2\)"):
        HistoryStore.open(path)
    assert path.read_bytes() == before


def test_a_write_that_fails_midway_is_a_history_error_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0))
    before = path.read_bytes()
    big = BenchRecord(profile="p", test="t.py::test_big", machine="m", workload="w",
                      rounds={f"m{i}_ms": [float(v) for v in range(200)] for i in range(50)})
    with HistoryStore.open(path) as store:
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages + 1}")  # the disk is full after one more page
        with pytest.raises(HistoryError, match=r"cannot be written \(database or disk is full\): is its disk full\? "
                                               r"Nothing of this run was written"):
            store.append(RunRecord(commit="b", time=2.0, benchmarks=(big,)))
        assert [r.commit for r in store.runs()] == ["a"]
    assert path.read_bytes() == before


def test_rows_can_be_read_without_their_rounds_and_for_some_metrics(tmp_path: Path) -> None:
    path = stored(tmp_path / "h.sqlite", run("a", 100.0), run("b", 90.0))
    with HistoryStore.open(path, write=False) as store:
        full = store.rows()
        lean = store.rows(["output_throughput"], rounds=False)
    assert [(r.run_id, r.metric, r.median, r.rounds) for r in lean] == [
        (r.run_id, r.metric, r.median, ()) for r in full if r.metric == "output_throughput"]
    assert all(r.rounds for r in full)
