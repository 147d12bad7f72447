"""The baseline check: this run's figures against the stored baseline of its profile, test and machine.

:func:`compare` judges each metric of a result with its tolerance through the one comparison engine
(engine/: rounds against the baseline's rounds, significance before failure) and returns a
:class:`Comparison` (one :class:`Check` per metric, notes, and whether the test fails), or records the
figures (every round's) instead under ``update``. :class:`BaselineChecker` is the session-level check the
``sglang_baseline`` fixture calls: one store, one mode, one machine per server version.

Infrastructure outcomes are not regressions: a run with failed requests or a client-bound run (the load
generator was the bottleneck) is not judged, nor is a telemetry figure that was not measured (no GPU, no
/metrics: the result's ``unmeasured(metric)`` says why), and neither is a comparison too noisy to judge (CV over the
limit) or a ``3sigma`` tolerance without the baseline's spread. Such a check passes with a warning
(:class:`NotJudgedWarning`) unless strict. :func:`gate_of` sums a benchmark's outcome up for CI:
``passed``, ``regressed``, ``not-judged`` (with the reason), ``recorded``, or None when nothing was checked.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, Protocol

from pytest_sglang.baseline.directions import Tolerance, direction, fmt_value
from pytest_sglang.baseline.engine import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_CV_PCT,
    SESSIONS_NEEDED,
    Judgement,
    judge,
    judge_sessions,
    metric_samples,
    metric_value,
)
from pytest_sglang.baseline.engine.series import PastRun, judge_series
from pytest_sglang.baseline.gate import Gate, combine
from pytest_sglang.baseline.outcome import Check, CheckStatus, Comparison
from pytest_sglang.baseline.store import BaselineStore, Entry
from pytest_sglang.bench.result import BenchResult
from pytest_sglang.errors import BaselineError
from pytest_sglang.machine.facts import Machine, detect_machine

# check() keywords that are settings of the gate, not metrics
GATE_OPTIONS = ("max_cv", "confidence")
NO_BASELINE_NOTE = "no baseline for "  # how the note of a check with nothing to compare with begins


class NotJudgedWarning(UserWarning):
    """A baseline check that could not judge (too noisy, client-bound, failed requests): it passed, unjudged."""


def _context(profile: str, entry: Entry) -> str:
    when = entry.recorded_at[:10] if entry.recorded_at else "at an unknown date"
    at = f" at {entry.commit}" if entry.commit else ""
    return f"profile {profile}, {entry.machine}, recorded {when}{at}"


def _as_list(value: float | Sequence[float] | None) -> list[float] | None:
    if value is None:
        return None
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    return [v for v in values if not math.isnan(v)] or None


def compare_one(metric: str, current: float | Sequence[float] | None, baseline: float | Sequence[float] | None,
                tolerance: Tolerance, *, profile: str, entry: Entry | None, confidence: float = DEFAULT_CONFIDENCE,
                max_cv_pct: float | None = DEFAULT_MAX_CV_PCT, unjudged: str | None = None,
                sessions: Sequence[float] = ()) -> Check:
    """One metric (a figure or its rounds) against its baseline (likewise): ``no-baseline`` and ``missing``
    here, ``not-judged`` for ``unjudged`` (an infrastructure reason, or why the figure was not measured), the
    rest by the engine: against the spread of the baseline's recording ``sessions`` (their medians) once it has
    SESSIONS_NEEDED, else against its rounds, saying that the session noise is not yet known."""
    d = direction(metric)
    cur, base = _as_list(current), _as_list(baseline)
    if cur is None and unjudged:
        return Check(metric, None, metric_value({metric: base}, metric) if base else None, tolerance, d,
                     "not-judged", message=f"{metric} not judged: {unjudged}", rounds=0,
                     baseline_rounds=len(base or []), reason=unjudged)
    if base is None or entry is None:
        measured = fmt_value(metric, metric_value({metric: cur}, metric) or 0.0) if cur else "n/a"
        return Check(metric, metric_value({metric: cur}, metric) if cur else None, None, tolerance, d,
                     "no-baseline", message=f"{metric}: no baseline yet ({measured} measured)",
                     rounds=len(cur or []), reason="no baseline")
    base_median = metric_value({metric: base}, metric)
    if cur is None:
        return Check(metric, None, base_median, tolerance, d, "missing",
                     message=f"{metric} regressed: this run has no value for it vs baseline "
                             f"{fmt_value(metric, base_median or 0.0)} ({_context(profile, entry)})",
                     rounds=0, baseline_rounds=len(base))
    if len(sessions) >= SESSIONS_NEEDED and min(sessions) > 0:
        j = judge_sessions(metric, cur, sessions, tolerance, context=_context(profile, entry),
                           confidence=confidence, max_cv_pct=max_cv_pct)
    else:
        unknown = f"session noise not yet known ({len(sessions)} of {SESSIONS_NEEDED} sessions)"
        j = judge(metric, cur, base, tolerance, context=f"{_context(profile, entry)}; {unknown}",
                  confidence=confidence, max_cv_pct=max_cv_pct)
    status: CheckStatus = j.status
    message, reason = j.message, j.reason
    if unjudged and status != "not-judged":
        status, reason = "not-judged", unjudged
        message = f"{metric} not judged: {unjudged} ({j.message})"
    hint = "; record it with --sglang-update-baseline" if status == "improved" else ""
    return Check(metric, j.current, j.reference, tolerance, d, status, j.change_pct, message + hint,
                 rounds=j.current_n, baseline_rounds=j.reference_n, method=j.method, p_value=j.p_value,
                 ci_pct=j.ci_pct, cv_pct=j.current_cv_pct, baseline_cv_pct=j.reference_cv_pct, reason=reason,
                 sessions=len(sessions), detectable_pct=j.detectable_pct,
                 unconfirmed=j.unconfirmed and status == "ok")


def with_history(check: Check, judged: Judgement | None) -> Check:
    """A metric's check with its series' verdict joined: a step that regressed fails the check (a run after a
    step is regressed whatever its baseline says, and with no baseline at all); otherwise the baseline's verdict
    stands and the history is said beside it."""
    if judged is None:
        return check
    if judged.status == "regressed" and check.status not in ("regressed", "missing"):
        before = f" (baseline: {check.message})" if check.status != "no-baseline" else ""
        return replace(check, status="regressed", message=f"{judged.message}{before}", method="history",
                       p_value=judged.p_value, change_pct=judged.change_pct,
                       detectable_pct=judged.history_detectable_pct)
    return replace(check, history=judged.message)


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def infrastructure_problem(result: Any) -> str | None:
    """Why ``result``'s figures say nothing about the server: failed requests, or a client-bound run."""
    if isinstance(result, BenchResult):
        health = result.health
        return _problem(result.failed, result.attempted, health.client_bound, health.client_bound_reason,
                        health.client_busy)
    # a server handle or a test's stand-in: whatever it has of these
    failed = getattr(result, "failed", 0) or 0
    attempted = getattr(result, "attempted", None)
    if isinstance(failed, (int, float)) and failed > 0 and not isinstance(attempted, int):
        attempted = int(failed + (getattr(result, "completed", 0) or 0))
    return _problem(failed, attempted, getattr(result, "client_bound", False),
                    getattr(result, "client_bound_reason", None), getattr(result, "client_busy", None))


def _problem(failed: Any, attempted: Any, client_bound: Any, reason: Any, busy: Any) -> str | None:
    if isinstance(failed, (int, float)) and failed > 0:
        return f"{int(failed)} of {attempted} requests failed"
    if client_bound:
        if isinstance(reason, str) and reason:
            return reason  # bench/selfcheck.py: the busy share or the event loop's lag, with the figures
        share = f" {busy:.0%} of the time" if isinstance(busy, (int, float)) else ""
        return (f"client-bound: the load generator's event loop was busy{share}, so the figures measure the "
                "client, not the server")
    return None


def compare(
    result: Any,
    tolerances: Mapping[str, str | float | int],
    *,
    store: BaselineStore,
    profile: str,
    test_id: str,
    machine: Machine,
    update: bool = False,
    strict: bool = False,
    commit: str | None = None,
    also_record: Iterable[str] = (),
    confidence: float = DEFAULT_CONFIDENCE,
    max_cv_pct: float | None = DEFAULT_MAX_CV_PCT,
    fail_not_judged: bool = False,
    history: Callable[[str], Sequence[PastRun]] | None = None,
) -> Comparison:
    """Compare ``result``'s figures (its rounds, where it has several) with the stored baseline, or record
    them, with ``update``. ``history``: metric -> the past runs of this benchmark's series (--sglang-history),
    whose rule (engine/series.py) joins the baseline's."""
    parsed = {m: Tolerance.parse(m, t) for m, t in tolerances.items()}
    for metric in parsed:
        direction(metric)
    samples = {m: metric_samples(result, m) for m in parsed}
    problem = infrastructure_problem(result)
    if update:
        return _record(result, samples, also_record, store=store, profile=profile, test_id=test_id,
                       machine=machine, commit=commit, problem=problem)
    entry = store.lookup(profile, test_id, machine)
    comp = Comparison(profile, test_id, machine, entry)
    unmeasured = getattr(result, "unmeasured", None)
    for metric, tol in parsed.items():
        why_none = unmeasured(metric) if callable(unmeasured) and not samples[metric] else None
        check = compare_one(metric, samples[metric], entry.samples_of(metric) if entry else None, tol,
                            profile=profile, entry=entry, confidence=confidence, max_cv_pct=max_cv_pct,
                            unjudged=why_none or problem, sessions=entry.sessions_of(metric) if entry else ())
        if history is not None and check.current is not None and not (why_none or problem):
            judged = judge_series(metric, history(metric), check.current, tol, confidence=confidence,
                                  accepted_until=_epoch(entry.recorded_at) if entry else None)
            check = with_history(check, judged)
        _add(comp, check, fail=strict or fail_not_judged, option="--sglang-baseline-strict" if strict else
             "--sglang-not-judged=fail")
    _no_baseline(comp, store, strict=strict)
    return comp


def _record(result: Any, samples: Mapping[str, list[float] | None], also_record: Iterable[str], *,
            store: BaselineStore, profile: str, test_id: str, machine: Machine, commit: str | None,
            problem: str | None) -> Comparison:
    """``--sglang-update-baseline``: the figures (every round's) recorded instead of compared."""
    to_record = dict(samples)
    for extra in also_record:
        if extra not in to_record:
            to_record[extra] = metric_samples(result, extra)
    recorded = store.record(profile, test_id, machine, {k: v for k, v in to_record.items() if v}, commit=commit)
    comp = Comparison(profile, test_id, machine, recorded, recorded=True)
    shown = ", ".join(f"{k}={fmt_value(k, recorded.metrics[k])}" + (f" ({len(v)} rounds)" if len(v) > 1 else "")
                      for k, v in to_record.items() if v)
    comp.notes.append(f"recorded baseline for {profile} / {test_id} on {machine.key}: {shown}")
    if problem:
        comp.warnings.append(f"recorded although {problem}: re-record this baseline on a healthy run")
    return comp


def _add(comp: Comparison, check: Check, *, fail: bool, option: str) -> None:
    comp.checks.append(check)
    if check.status == "improved" or (check.status == "ok" and check.unconfirmed):
        comp.notes.append(check.message)
    if check.status == "not-judged":
        if fail:
            comp.errors.append(f"{check.message} ({option} makes this a failure)")
        else:
            comp.warnings.append(check.message)


def _no_baseline(comp: Comparison, store: BaselineStore, *, strict: bool) -> None:
    missing = [c for c in comp.checks if c.status == "no-baseline"]
    if not missing:
        return
    where = f"{comp.profile} / {comp.test_id} on {comp.machine.key}"
    others = [k for k in store.other_keys(comp.profile, comp.test_id) if k != comp.machine.key]
    hint = f" (the file has this test on: {'; '.join(others)})" if others else ""
    names = ", ".join(c.metric for c in missing)
    text = (f"{NO_BASELINE_NOTE}{names} of {where} in {store.path}{hint}; "
            "run with --sglang-update-baseline to record one")
    if strict:
        comp.errors.append(f"{text} (--sglang-baseline-strict makes this a failure)")
    else:
        comp.notes.append(text)


class Gated(Protocol):
    """An outcome with a gate: a baseline :class:`Comparison`, or an A/B check's (engine/ab.py)."""

    @property
    def gate(self) -> Gate: ...

    @property
    def gate_reason(self) -> str | None: ...


def gate_of(result: Any, comparisons: Sequence[Gated]) -> tuple[Gate | None, str | None]:
    """What one benchmark means for a CI gate, and why: failed requests are ``not-judged`` whatever was
    checked; otherwise a regression in any comparison is ``regressed``, a check that could not judge (or had
    no baseline) ``not-judged``, a recording ``recorded``, all judged ``passed``; None: nothing was checked.
    ``result`` None: only the comparisons count (an A/B run's checks)."""
    failed = getattr(result, "failed", 0) or 0
    if failed:
        return "not-judged", infrastructure_problem(result)
    return combine((c.gate, c.gate_reason) for c in comparisons)


# --------------------------------------------------------------------------------------------------------
# Session-level checker (what the sglang_baseline fixture calls)


def _percent(name: str, raw: Any) -> float:
    if isinstance(raw, bool):
        raise BaselineError(f"{name} must be a percentage like '10%' or 10, got {raw!r}")
    text = str(raw).strip().rstrip("%").strip()
    try:
        value = float(text)
    except ValueError:
        raise BaselineError(f"{name} must be a percentage like '10%' or 10, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise BaselineError(f"{name} must be a positive percentage, got {raw!r}")
    return value


def gate_options(options: Mapping[str, Any]) -> tuple[float, float | None]:
    """``confidence`` (0.95, "95%") and ``max_cv`` ("10%", 10; None or "off": no limit) of a check() call."""
    confidence = DEFAULT_CONFIDENCE
    if "confidence" in options:
        raw = options["confidence"]
        value = _percent("confidence", raw)
        confidence = value / 100.0 if value > 1 or str(raw).strip().endswith("%") else value
        if not 0.5 <= confidence < 1:
            raise BaselineError(f"confidence must be at least 50% and below 100% (e.g. 95% or 99.9%), got {raw!r}")
    max_cv: float | None = DEFAULT_MAX_CV_PCT
    if "max_cv" in options:
        raw = options["max_cv"]
        max_cv = None if raw is None or str(raw).strip().lower() == "off" else _percent("max_cv", raw)
    return confidence, max_cv


def _point_key(test_id: str, result: Any) -> str:
    """A sweep point's own baseline key: ``test_id@concurrency=4``."""
    point = getattr(result, "sweep", None)
    if isinstance(point, Mapping) and point.get("param") is not None:
        return f"{test_id}@{point['param']}={point['value']:g}"
    return test_id


class BaselineChecker:
    """One per session: the store, the mode (compare, update, strict) and the machine per server version."""

    def __init__(self, store: BaselineStore, *, update: bool = False, strict: bool = False,
                 commit: str | None = None, gate_defaults: Mapping[str, str | float] | None = None,
                 fail_not_judged: bool = False) -> None:
        self.store = store
        self.update = update
        self.strict = strict
        self.fail_not_judged = fail_not_judged  # --sglang-not-judged=fail
        self.commit = commit
        self.gate_defaults = dict(gate_defaults or {})  # max_cv, confidence for checks that set none
        self._machines: dict[str | None, Machine] = {}

    def machine(self, server: str | None) -> Machine:
        if server not in self._machines:
            self._machines[server] = detect_machine(server)
        return self._machines[server]

    def check(self, result: Any, tolerances: Mapping[str, str | float | int], *, profile: str, test_id: str,
              server: str | None, machine: Machine | None = None,
              history: Callable[[str], Sequence[PastRun]] | None = None) -> Comparison:
        """Compare (or record) ``result``. With no tolerances: ``output_throughput="5%"`` for a benchmark
        result, ``startup_seconds="20%"`` for a server handle. ``machine``: where the server ran when that is
        not this machine (an ssh host; the handle's ``machine()``). ``max_cv`` and ``confidence`` among the
        tolerances set the gate (default: 10 % and 95 %). A check that could not judge warns
        (NotJudgedWarning) and passes, unless strict."""
        confidence, max_cv = gate_options({**self.gate_defaults,
                                           **{k: v for k, v in tolerances.items() if k in GATE_OPTIONS}})
        tolerances = {k: v for k, v in tolerances.items() if k not in GATE_OPTIONS}
        if not tolerances:
            if metric_value(result, "output_throughput") is not None:
                tolerances = {"output_throughput": "5%"}
            elif metric_value(result, "startup_seconds") is not None:
                tolerances = {"startup_seconds": "20%"}
            else:
                raise BaselineError("check() needs tolerances, e.g. check(r, output_throughput='5%')")
        also = ["output_throughput"] if metric_value(result, "output_throughput") is not None else []
        comp = compare(result, tolerances, store=self.store, profile=profile, test_id=_point_key(test_id, result),
                       machine=machine or self.machine(server), update=self.update, strict=self.strict,
                       commit=self.commit, also_record=also, confidence=confidence, max_cv_pct=max_cv,
                       fail_not_judged=self.fail_not_judged, history=history)
        for text in comp.warnings:
            warnings.warn(NotJudgedWarning(text), stacklevel=2)
        return comp
