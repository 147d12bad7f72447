"""The run history: one SQLite file (standard library ``sqlite3``) that every pytest run with --sglang-history
appends one run to. Knows nothing about pytest.

Format 1::

    meta(key, value)          format = "pytest-sglang-history", version = "1", created = ISO time
    runs(id, time, created, commit, exit_status, gate)
    benchmarks(id, run_id, profile, test, machine, workload, server_version, outcome, gate)
    metrics(benchmark_id, metric, median, rounds)     rounds: every round's value, a JSON list

``PRAGMA application_id`` holds APPLICATION_ID as well, so a foreign SQLite file (another program's database)
is told apart from an empty one before anything is written. Rows are only ever inserted: nothing here updates
or deletes one. Every write is one ``BEGIN IMMEDIATE`` transaction under SQLite's own file lock with a busy
timeout, so pytest-xdist workers and CI jobs sharing the file may append at once; the default rollback journal
(not WAL) keeps the store one self-contained file that a CI cache can copy.

A store of an older format is upgraded in place by MIGRATIONS (version -> the function that takes it one
version up) inside the same transaction; a newer one is refused, never touched.
"""

from __future__ import annotations

import json
import math
import sqlite3
import stat
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_sglang.errors import HistoryError
from pytest_sglang.history.records import BenchRecord, Row, RunRecord, StoredRun
from pytest_sglang.writable import existing_parent, may_write

FORMAT = "pytest-sglang-history"
VERSION = 1
APPLICATION_ID = 0x53474C48  # "SGLH"
DEFAULT_TIMEOUT = 60.0  # seconds a write waits for another writer's lock

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, created TEXT NOT NULL, "
    "commit_sha TEXT, exit_status INTEGER, gate TEXT)",
    "CREATE TABLE benchmarks (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER NOT NULL REFERENCES runs(id), "
    "profile TEXT NOT NULL, test TEXT NOT NULL, machine TEXT NOT NULL, workload TEXT NOT NULL, "
    "server_version TEXT, outcome TEXT, gate TEXT)",
    "CREATE TABLE metrics (benchmark_id INTEGER NOT NULL REFERENCES benchmarks(id), metric TEXT NOT NULL, "
    "median REAL NOT NULL, rounds TEXT NOT NULL, PRIMARY KEY (benchmark_id, metric))",
    "CREATE INDEX benchmarks_series ON benchmarks (profile, test, machine, workload)",
)

# version -> upgrade of a store of that version to the next one, run inside the writing transaction. Format 1 is
# the first; a format 2 adds `1: _to_2` here and bumps VERSION.
Migration = Callable[[sqlite3.Connection], None]
MIGRATIONS: dict[int, Migration] = {}

__all__ = ["APPLICATION_ID", "DEFAULT_TIMEOUT", "FORMAT", "MIGRATIONS", "VERSION", "BenchRecord", "HistoryStore",
           "Row", "RunRecord", "StoredRun"]


def _finite(rounds: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    out = {}
    for metric, values in rounds.items():
        kept = [float(v) for v in values if v is not None and not isinstance(v, bool) and math.isfinite(v)]
        if kept:
            out[metric] = kept
    return out


class HistoryStore:
    """An opened, checked history file. :meth:`open` is the check a session runs before any server launches."""

    def __init__(self, path: Path, conn: sqlite3.Connection, *, writable: bool, timeout: float) -> None:
        self.path = path
        self._conn = conn
        self.writable = writable
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"HistoryStore({str(self.path)!r})"

    @classmethod
    def open(cls, path: str | Path, *, write: bool = True, timeout: float = DEFAULT_TIMEOUT) -> HistoryStore:
        """Open ``path`` as a history store, or raise HistoryError saying what is wrong and what to do.

        ``write``: create the file if it is missing (and its folder), upgrade an older format, and prove that a
        write would succeed (a rolled-back transaction: the file is left byte for byte); else the file must exist
        and is opened read-only. Nothing already in the file is ever changed by a check."""
        path = Path(path).absolute()
        _check_path(path, write=write)
        conn = _connect(path, write=write, timeout=timeout)
        store = cls(path, conn, writable=write, timeout=timeout)
        try:
            store._inspect(thorough=True)
            if write:
                store._write_check()
        except BaseException:
            conn.close()
            raise
        return store

    def _write_check(self) -> None:
        """Create a new store, upgrade an older one, or prove that a write would succeed and undo it."""
        try:
            with self._transaction() as tx:
                version = self._inspect(tx)
                if version is None:
                    _create(tx)
                elif version < VERSION:
                    _migrate(tx, version, self.path)
                else:
                    tx.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('write_check', '1')")
                    raise _Rollback
        except _Rollback:
            pass

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # Writing.

    def append(self, run: RunRecord) -> int:
        """Add ``run`` and its benchmarks in one transaction; return its id (runs are numbered as appended)."""
        if not self.writable:
            raise HistoryError(f"history store {self.path} was opened read-only; open it with write=True to append")
        created = datetime.fromtimestamp(run.time, timezone.utc).isoformat(timespec="seconds")
        with self._transaction() as tx:
            version = self._inspect(tx)
            if version is None:  # emptied since it was opened: begin it anew rather than fail the run
                _create(tx)
            else:
                _migrate(tx, version, self.path)
            cur = tx.execute("INSERT INTO runs (time, created, commit_sha, exit_status, gate) VALUES (?, ?, ?, ?, ?)",
                             (run.time, created, run.commit, run.exit_status, run.gate))
            run_id = int(cur.lastrowid or 0)
            for bench in run.benchmarks:
                cur = tx.execute(
                    "INSERT INTO benchmarks (run_id, profile, test, machine, workload, server_version, outcome, gate)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (run_id, bench.profile, bench.test, bench.machine, bench.workload, bench.server_version,
                     bench.outcome, bench.gate))
                bench_id = cur.lastrowid
                tx.executemany("INSERT INTO metrics (benchmark_id, metric, median, rounds) VALUES (?, ?, ?, ?)",
                               [(bench_id, metric, statistics.median(values), json.dumps(values))
                                for metric, values in sorted(_finite(bench.rounds).items())])
        return run_id

    # Reading.

    def runs(self) -> list[StoredRun]:
        rows = self._read("SELECT id, time, created, commit_sha, exit_status, gate FROM runs ORDER BY id")
        return [StoredRun(*row) for row in rows]

    def rows(self, metrics: Sequence[str] | None = None, *, rounds: bool = True) -> list[Row]:
        """Every stored metric (or those of ``metrics``) of every benchmark, in run order. ``rounds=False``: the
        medians alone (``Row.rounds`` empty), several times faster on a long history: no JSON to parse."""
        where = f"WHERE m.metric IN ({', '.join('?' * len(metrics))}) " if metrics is not None else ""
        found = self._read(
            "SELECT r.id, r.time, r.commit_sha, b.profile, b.test, b.machine, b.workload, b.server_version, "
            f"m.metric, m.median, {'m.rounds' if rounds else 'NULL'} FROM runs r JOIN benchmarks b ON b.run_id = r.id "
            f"JOIN metrics m ON m.benchmark_id = b.id {where}ORDER BY r.id, b.id, m.metric", tuple(metrics or ()))
        return [Row(run_id=r[0], time=r[1], commit=r[2], profile=r[3], test=r[4], machine=r[5], workload=r[6],
                    server_version=r[7], metric=r[8], median=r[9], rounds=tuple(_rounds(r[10])) if rounds else ())
                for r in found]

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        try:
            return list(self._conn.execute(sql, params))
        except sqlite3.Error as exc:
            raise HistoryError(_unusable(self.path, exc, self.timeout)) from None

    # The checks.

    def _inspect(self, conn: sqlite3.Connection | None = None, *, thorough: bool = False) -> int | None:
        """The store's format version, None for an empty database (a new store); HistoryError for anything that
        is not a history store this version can use. ``thorough``: SQLite's quick_check of every page too (once,
        when the store is opened: a damaged file is refused before the run, not found at its end)."""
        conn = conn or self._conn
        path = self.path
        try:
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not tables and app_id == 0:
                return None
            meta = dict(conn.execute("SELECT key, value FROM meta")) if "meta" in tables else {}
            if app_id != APPLICATION_ID or meta.get("format") != FORMAT:
                names = ", ".join(sorted(tables)) or "none"
                raise HistoryError(
                    f"{path} is an SQLite database but not a pytest-sglang history store (its tables: {names}). It "
                    "was left as it is. Point --sglang-history (ini sglang_history) at a new file, e.g. "
                    ".sglang-history.sqlite; a history store is created there on the first run.")
            problem = conn.execute("PRAGMA quick_check").fetchone()[0] if thorough else "ok"
        except sqlite3.Error as exc:
            raise HistoryError(_unusable(path, exc, self.timeout)) from None
        if problem != "ok":
            raise HistoryError(_corrupt(path, str(problem)))
        raw = meta.get("version", "")
        version = int(raw) if raw.isdigit() else None
        if version is None or version < 1:
            raise HistoryError(_corrupt(path, f"its format version is {raw!r}"))
        if version > VERSION:
            raise HistoryError(
                f"history store {path} is of format version {version}, newer than this pytest-sglang reads "
                f"(version {VERSION}). It was left as it is. Upgrade pytest-sglang (pip install -U pytest-sglang) "
                "where this history is written, or point --sglang-history at another file.")
        if version < VERSION and not self.writable:
            for v in range(version, VERSION):
                if v not in MIGRATIONS:
                    raise HistoryError(f"history store {path} is of format version {version}, which this "
                                       f"pytest-sglang cannot upgrade (no migration from version {v}).")
        return version

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE``: the write lock at once (waiting out the busy timeout), committed or rolled back."""
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            raise HistoryError(_not_writable(self.path, exc, self.timeout)) from None
        try:
            yield conn
        except sqlite3.Error as exc:  # a full disk, an I/O error: said as the store's problem, nothing half-written
            _rollback(conn)
            raise HistoryError(_not_writable(self.path, exc, self.timeout)) from None
        except BaseException:
            _rollback(conn)
            raise
        try:
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            _rollback(conn)
            raise HistoryError(_not_writable(self.path, exc, self.timeout)) from None


def _rollback(conn: sqlite3.Connection) -> None:
    """Undo the open transaction; where even that fails, SQLite rolls the journal back on the next open."""
    try:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    except sqlite3.Error:
        pass


class _Rollback(Exception):
    """Ends the write check's transaction without committing it."""


def _rounds(raw: object) -> list[float]:
    try:
        values = json.loads(str(raw))
    except ValueError:
        return []
    return [float(v) for v in values] if isinstance(values, list) else []


def _check_path(path: Path, *, write: bool) -> None:
    """What can be told without SQLite: a folder, a missing file, a file or folder no one may write."""
    if path.is_dir():
        raise HistoryError(f"history store {path} is a folder, not a file: point --sglang-history (ini "
                           f"sglang_history) at a file in it, e.g. {path / '.sglang-history.sqlite'}.")
    if not path.exists():
        if not write:
            raise HistoryError(f"no history store at {path}: no such file. Pass the file that pytest "
                               "--sglang-history=PATH wrote.")
        folder = existing_parent(path)
        if not may_write(folder):
            raise HistoryError(f"history store {path} cannot be created: its folder {folder} is read-only. Make "
                               "it writable, or point --sglang-history at a writable place.")
        return
    if not write:
        return
    if not may_write(path):
        raise HistoryError(f"history store {path} is read-only (mode {stat.filemode(path.stat().st_mode)}): this "
                           "run could not append to it. Make it writable (chmod u+w), or point --sglang-history at "
                           "a copy. It was left as it is.")
    if not may_write(path.parent):
        raise HistoryError(f"history store {path} sits in a read-only folder ({path.parent}): SQLite writes a "
                           "journal file beside it while it appends. Make the folder writable, or move the store. "
                           "It was left as it is.")


def _connect(path: Path, *, write: bool, timeout: float) -> sqlite3.Connection:
    try:
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
        else:
            conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=timeout, isolation_level=None)
    except (OSError, sqlite3.Error) as exc:
        raise HistoryError(f"history store {path} cannot be opened: {exc}. Check the path and its folder's "
                           "permissions, or point --sglang-history at another file.") from None
    return conn


def _create(conn: sqlite3.Connection) -> None:
    for sql in _SCHEMA:
        conn.execute(sql)
    conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                     [("format", FORMAT), ("version", str(VERSION)),
                      ("created", datetime.now(timezone.utc).isoformat(timespec="seconds"))])
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")


def _migrate(conn: sqlite3.Connection, version: int, path: Path) -> None:
    """Bring a store of an older format up to VERSION, one step at a time, in the caller's transaction."""
    while version < VERSION:
        step = MIGRATIONS.get(version)
        if step is None:
            raise HistoryError(f"history store {path} is of format version {version}, which this pytest-sglang "
                               f"cannot upgrade (no migration from version {version}). It was left as it is.")
        step(conn)
        version += 1
        conn.execute("UPDATE meta SET value = ? WHERE key = 'version'", (str(version),))


def _unusable(path: Path, exc: sqlite3.Error, timeout: float | None = None) -> str:
    text = str(exc)
    if "not a database" in text or "malformed" in text or "encrypted" in text:
        return _corrupt(path, text)
    if "locked" in text or "busy" in text:
        return _locked(path, text, timeout)
    return (f"history store {path} cannot be read: {text}. It was left as it is. Check the file and its "
            "permissions, or point --sglang-history at another file.")


def _corrupt(path: Path, what: str) -> str:
    return (f"{path} is not a usable pytest-sglang history store ({what}): not an SQLite database, or a damaged "
            "one. It was left as it is. Restore it from a backup or CI cache, or point --sglang-history at a new "
            "file (a history store is created there on the first run).")


def _locked(path: Path, what: str, timeout: float | None) -> str:
    waited = f" for {timeout:g} s" if timeout is not None else ""
    return (f"history store {path} stayed locked by another process{waited} ({what}). Is another pytest writing it, "
            "or a tool holding it open (sqlite3 shell, DB browser)? Close that and run again, or raise "
            "PYTEST_SGLANG_HISTORY_TIMEOUT. It was left as it is.")


def _not_writable(path: Path, exc: sqlite3.Error, timeout: float) -> str:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return _locked(path, text, timeout)
    if "readonly" in text or "read-only" in text or "unable to open" in text:
        return (f"history store {path} cannot be written ({text}): the file, its folder or its file system is "
                "read-only. Make it writable, or point --sglang-history at a writable place. It was left as it is.")
    if "not a database" in text or "malformed" in text:
        return _corrupt(path, text)
    return (f"history store {path} cannot be written ({text}): is its disk full? Nothing of this run was written; "
            "the store was left as it was. Free space, or point --sglang-history at another place.")
