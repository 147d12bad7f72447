"""--sglang-history in pytest terms: the store checked at session start (before any server launches), the run
appended once at session finish by the process that holds every result (the only process without xdist, the
controller under it), and what that found for the JSON report's ``history`` section."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_sglang.errors import HistoryError

# Runs of each series a session searches for steps: what bears on this run, in bounded time at the session's end
# (a 500-run series costs about 0.5 s a metric on a 2-core runner, 100 runs about 0.07 s). The CLI searches more.
RECENT_RUNS = 100

if TYPE_CHECKING:
    from pytest_sglang.baseline.engine.series import PastRun
    from pytest_sglang.session import ABEntry


class SessionHistory:
    """The session's side of the run history: inert without --sglang-history."""

    def __init__(self, path: Path | None, *, appends: bool = True) -> None:
        self.path = path
        self.appends = appends and path is not None  # an xdist worker reads it; its controller appends
        self.section: dict[str, Any] | None = None  # the report's history section, once appended
        self.error: str | None = None  # why this run could not be appended
        self._past: dict[tuple[str, str, str, str, str], list[PastRun]] | None = None  # series -> its past runs

    def _timeout(self) -> float:
        from pytest_sglang.envknobs import env_knobs
        from pytest_sglang.history.store import DEFAULT_TIMEOUT

        return env_knobs().history_timeout or DEFAULT_TIMEOUT

    def check(self) -> None:
        """Open the store as the append will (creating a new one): HistoryError for one this run cannot use."""
        if self.path is None or not self.appends:
            return
        from pytest_sglang.history.store import HistoryStore

        HistoryStore.open(self.path, timeout=self._timeout()).close()

    def past_runs(self, result: Any, *, profile: str, test_id: str, machine: str) -> Callable[[str], list[PastRun]]:
        """metric -> the past runs of ``result``'s series (oldest first), for a check's history rule. The store is
        read once: this session's own run is appended only at its end."""
        if self.path is None or not callable(getattr(result, "to_dict", None)):
            return lambda metric: []
        from pytest_sglang.history.collect import bench_key, workload_of

        if self._past is None:
            self._past = self._read()
        past, figures = self._past, result.to_dict()
        test = bench_key({"test_id": test_id, "result": figures})
        workload = workload_of(figures)
        return lambda metric: list(past.get((profile, test, machine, workload, metric), []))

    def _read(self) -> dict[tuple[str, str, str, str, str], list[PastRun]]:
        from pytest_sglang.baseline.engine.series import PastRun
        from pytest_sglang.history.steps import series_of
        from pytest_sglang.history.store import HistoryStore

        if self.path is None or not self.path.exists():
            return {}
        with HistoryStore.open(self.path, write=False, timeout=self._timeout()) as store:
            rows = store.rows(rounds=False)
        return {s.key: [PastRun(p.value, p.commit, p.time) for p in s.points] for s in series_of(rows, None)}

    def append(self, report: dict[str, Any], *, commit: str | None, time: float, exit_status: int,
               machine_of: Callable[[str | None], str], ab: Sequence[ABEntry] = (),
               versions: Mapping[str, str | None] | None = None) -> dict[str, Any] | None:
        """Append this run; return the report's history section (or None, with ``error`` set)."""
        if self.path is None or not self.appends:
            return None
        from pytest_sglang.history.collect import run_of
        from pytest_sglang.history.steps import DEFAULT_METRICS, find_steps
        from pytest_sglang.history.store import HistoryStore

        run, skipped = run_of(report, commit=commit, time=time, exit_status=exit_status, machine_of=machine_of,
                              ab=ab, versions=versions)
        try:
            with HistoryStore.open(self.path, timeout=self._timeout()) as store:
                run_id = store.append(run)
                rows = store.rows(DEFAULT_METRICS, rounds=False)
        except HistoryError as exc:
            self.error = str(exc)
            return None
        mine = {(b.profile, b.test, b.machine, b.workload) for b in run.benchmarks}
        series, steps = find_steps((r for r in rows if (r.profile, r.test, r.machine, r.workload) in mine),
                                   window=RECENT_RUNS)
        self.section = {"path": str(self.path), "run_id": run_id, "commit": commit,
                        "series": [_recent(s.to_dict(points=True)) for s in series],
                        "steps": [s.to_dict() for s in steps], "skipped": skipped}
        return self.section


def _recent(series: dict[str, Any]) -> dict[str, Any]:
    """A series for the report: its last RECENT_RUNS points (``runs`` still counts them all)."""
    series["points"] = series["points"][-RECENT_RUNS:]
    return series
