"""The one comparison engine: a candidate judged against a reference, direction-aware; the only place that
decides "regressed".

:func:`judge` serves both kinds of comparison. A baseline check (checks.py) judges this run's figure
against its stored baseline with a *tolerance*: how much worse it may be. A profile comparison
(:func:`compare_profiles`, behind ``sglang_results.compare``) judges one profile's figure against another's
with a *margin*: how much better it must be.

Sessions: a baseline that keeps the medians of its recording sessions (store.py, version 3) and has at least
SESSIONS_NEEDED of them is judged by :func:`judge_sessions` instead: how much whole sessions differ, not how
much one session's rounds do (on a real host sessions differ far more, docs/gpu.md). The new session's median
regresses when even an unchanged session at the tolerance's edge would fall that low with chance at most
``1 - confidence``: the one-sided prediction bound of the past sessions' medians (log scale, Student's t,
stats.SessionSpread), shifted by the tolerance. With fewer sessions :func:`judge` applies and the check says
that the session noise is not yet known.

Either side is one figure or the samples of several rounds (``sglang_bench(rounds=N)``, a baseline recorded
from them). With at least two samples a side, a baseline check fails only when the change of the medians is
beyond the tolerance AND significant in the metric's bad direction: the one-sided Mann-Whitney U test at
``1 - confidence`` (exact for small samples, stats.py), with the bootstrap interval of the change in the
message. With one sample on either side, or too few rounds for the test to reach significance (2 vs 2), the
tolerance alone decides, and the message says so. A side whose rounds spread more than ``max_cv_pct`` (CV, in
percent) is ``not-judged``: "too noisy to judge". A ``3sigma`` tolerance is three standard deviations of the
reference's samples; with one reference sample it cannot be judged either. Profile comparisons (margins)
compare the medians; with rounds on both sides the message gives the ratio of the medians with its bootstrap
interval and the rank-sum p-value ("eagle3 is 0.54x baseline (95% CI 0.52-0.56, 5 rounds vs 5, p=0.004)"),
while the margin alone still decides.

An A/B comparison (:func:`compare_ab`, behind the ``sglang_ab`` fixture) judges a second profile against a
first measured in the same job. Interleaved (both servers alive, rounds A B B A ...): the paired ratios
second/first of each pair, judged by the exact Wilcoxon signed-rank test of their logarithms, with the
Hodges-Lehmann interval that goes with it (stats.py); the ratio shown is the median of the paired ratios.
Significance there is two-sided at ``confidence`` (the one-sided p-value at most half of ``1 - confidence``,
so that a change is significant exactly when its interval leaves 1 out): on a GPU host whose rounds spread
25 %, a one-sided 5 % test let identical servers "regress" (benchmarks/RESULTS-ab.md). 6 pairs can reach it.
Bracketed (first, second, first again): the second side's rounds against both first-side runs by the rank-sum
test, the drift between the two first-side runs beside it; a drift past the tolerance is not judged.

Instance noise: two instances of one server on one host need not run at one speed (on the H200 one held
4650 tok/s for a whole job while its twin jumped 4700-6800, docs/gpu.md), and that difference persists for
tens of seconds, so the paired test, which assumes independent pairs, calls it a change. An A/B check given
the log ratios of at least AA_RUNS_NEEDED recorded A/A runs (store.py ``instance_noise``: two profiles of
one server, same workload, same machine) judges the A/B's ratio by :func:`judge_instance_noise` instead: as
:func:`judge_sessions` does for sessions, it regresses when even an unchanged pair of instances at the
tolerance's edge would give a ratio that low with chance at most ``1 - confidence``: the one-sided
prediction bound of the A/A ratios (stats.SessionSpread), shifted by the tolerance. With fewer the paired
rule stays and the message says what to record.

One sign convention everywhere: ``change_pct`` is the change of the figure itself (of the medians),
``(current - reference) / |reference| * 100``: a startup 47 % slower is +47.4, a throughput 6 % lower is
-6.0. The status word says whether that is better or worse (``regressed``, ``improved``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_sglang.baseline.directions import Direction, Tolerance, direction, fmt_value
from pytest_sglang.baseline.stats import (
    BOOTSTRAP_RESAMPLES,
    Alternative,
    SessionSpread,
    bootstrap_change_ci,
    hodges_lehmann_ci,
    min_p,
    rank_sum_p,
    signed_rank_min_p,
    signed_rank_p,
)
from pytest_sglang.errors import BaselineError

if TYPE_CHECKING:
    from pytest_sglang.bench.metrics import BenchResult

Status = Literal["ok", "regressed", "improved", "not-judged"]
Method = Literal["tolerance", "mann-whitney", "sessions", "signed-rank", "instance-noise"]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_MAX_CV_PCT = 10.0  # rounds spread more than this (CV): too noisy to judge
SESSIONS_NEEDED = 5  # past recording sessions before their spread, not the rounds', judges a baseline check
AA_RUNS_NEEDED = 5  # recorded A/A runs before their spread, not the pairs', judges an A/B check


def change_pct(current: float, reference: float) -> float:
    """The figure's own change in percent of the reference; from a reference of 0, +/-inf (0.0 if equal)."""
    delta = current - reference
    if reference:
        return delta / abs(reference) * 100.0
    return 0.0 if delta == 0 else math.copysign(math.inf, delta)


@dataclass(frozen=True)
class Judgement:
    """One candidate judged against a reference (each one figure or the samples of rounds)."""

    metric: str
    current: float  # the median of the candidate's samples
    reference: float  # the median of the reference's samples
    tolerance: Tolerance
    direction: Direction
    status: Status  # regressed: worse than allowed (and significant, with rounds); not-judged: too noisy
    change_pct: float  # the figure's own change: (current - reference) / |reference| * 100
    message: str
    current_n: int = 1
    reference_n: int = 1
    method: Method = "tolerance"  # mann-whitney: rounds on both sides, significance tested
    p_value: float | None = None  # one-sided, in the direction of the observed change
    ci_pct: tuple[float, float] | None = None  # bootstrap interval of change_pct, at ``confidence``
    confidence: float = DEFAULT_CONFIDENCE
    current_cv_pct: float | None = None
    reference_cv_pct: float | None = None
    allowed: float | None = None  # the tolerance in the metric's unit (None: could not be computed)
    reason: str | None = None  # why not judged, or why the tolerance alone decided

    @property
    def failed(self) -> bool:
        return self.status == "regressed"

    @property
    def gain_pct(self) -> float:
        """``change_pct`` signed so that positive is better (a throughput up, a latency down)."""
        return self.change_pct if self.direction == "higher" else -self.change_pct


def _samples(value: float | Sequence[float]) -> list[float]:
    values = [float(value)] if isinstance(value, (int, float)) else [float(v) for v in value]
    if not values:
        raise BaselineError("a comparison needs at least one value on each side")
    return values


def _cv_pct(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / abs(mean) * 100.0 if mean else None


def _rounds(n: int) -> str:
    return f"{n} round{'s' if n != 1 else ''}"


def _p(p: float) -> str:
    return "p<0.001" if p < 0.001 else f"p={p:.3f}"


def judge(
    metric: str,
    current: float | Sequence[float],
    reference: float | Sequence[float],
    tolerance: Tolerance,
    *,
    margin: bool = False,
    current_label: str = "",
    reference_label: str = "baseline",
    context: str = "",
    confidence: float = DEFAULT_CONFIDENCE,
    max_cv_pct: float | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> Judgement:
    """Judge ``current`` against ``reference`` for ``metric`` (BaselineError if its direction is unknown).

    Each side is a figure or the samples of rounds. ``margin=False``: ``tolerance`` is how much worse than the
    reference the candidate may be; past it (and, with rounds on both sides, significantly worse at
    ``confidence``) the status is ``regressed``, better by more than it (and significantly) ``improved``,
    else ``ok``; ``not-judged`` when a side's CV exceeds ``max_cv_pct`` or a ``sigma`` tolerance has no
    reference spread. ``margin=True``: ``tolerance`` is how much better the median must be ("0%": at least as
    good); short of that it is ``regressed``, else ``ok``. ``current_label`` and ``reference_label`` name the
    two figures in the message (``eagle3`` vs ``base``, or the figure vs ``baseline``); ``context`` says where
    the reference comes from. ``resamples``: bootstrap resamples for the interval (0: no interval; the
    decision never depends on it).
    """
    d = direction(metric)
    cur, ref = _samples(current), _samples(reference)
    cur_med, ref_med = statistics.median(cur), statistics.median(ref)
    n, m = len(cur), len(ref)
    cur_cv, ref_cv = _cv_pct(cur), _cv_pct(ref)
    pct = change_pct(cur_med, ref_med)

    def made(status: Status, message: str, *, method: Method = "tolerance", p_value: float | None = None,
             ci_pct: tuple[float, float] | None = None, allowed: float | None = None,
             reason: str | None = None) -> Judgement:
        return Judgement(metric, cur_med, ref_med, tolerance, d, status, pct, message, n, m, method, p_value,
                         ci_pct, confidence, cur_cv, ref_cv, allowed, reason)

    shown = f"{pct:+.1f}%"
    size = f"{abs(pct):.1f}%" if math.isfinite(pct) else "from 0"
    versus = (f"{current_label + ' ' if current_label else ''}{fmt_value(metric, cur_med)} vs {reference_label} "
              f"{fmt_value(metric, ref_med)}")
    where = f" (tolerance {tolerance}{'; ' + context if context else ''})"
    gain = (cur_med - ref_med) if d == "higher" else (ref_med - cur_med)  # positive: current is better

    if tolerance.sigma and m < 2:
        reason = (f"not judged: a {tolerance} tolerance needs the baseline's spread, and it has {_rounds(m)}; "
                  "record it with sglang_bench(rounds=N), N >= 2")
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", reason=reason)
    bound = tolerance.allowed(ref_med, statistics.stdev(ref) if m > 1 else None)

    if margin:
        status: Status = "regressed" if gain < bound else "ok"
        message = f"{metric}: {versus} ({shown}, {d} is better)"
        p_margin: float | None = None
        ci_margin: tuple[float, float] | None = None
        if n >= 2 and m >= 2:  # rounds on both sides: the ratio's interval and its significance beside it
            observed: Alternative = "less" if cur_med < ref_med else "greater"
            p_margin = rank_sum_p(cur, ref, observed)
            ci_margin = bootstrap_change_ci(cur, ref, confidence, resamples=resamples) if resamples > 0 else None
            interval = (f"{confidence:.0%} CI {1 + ci_margin[0] / 100:.2f}-{1 + ci_margin[1] / 100:.2f}, "
                        if ci_margin else "")
            ratio = cur_med / ref_med if ref_med else math.inf
            message = (f"{metric}: {current_label or 'this'} is {ratio:.2f}x {reference_label} ({interval}"
                       f"{_rounds(n)} vs {m}, {_p(p_margin)}): {versus} ({shown}, {d} is better)")
        if status == "regressed":
            message += f"; needed a margin of {tolerance}"
        return made(status, message, method="mann-whitney" if p_margin is not None else "tolerance",
                    p_value=p_margin, ci_pct=ci_margin, allowed=bound)

    noisy = [(cv, side, k) for cv, side, k in ((cur_cv, "this run", n), (ref_cv, "the baseline", m))
             if cv is not None and max_cv_pct is not None and cv > max_cv_pct]
    if noisy:
        cv, side, k = max(noisy)
        reason = f"too noisy to judge: CV {cv:.0f}% over {side}'s {_rounds(k)} (limit {max_cv_pct:g}%)"
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", allowed=bound, reason=reason)

    alpha = 1.0 - confidence
    if n >= 2 and m >= 2 and min_p(n, m) <= alpha:
        worse: Alternative = "less" if d == "higher" else "greater"
        better: Alternative = "greater" if d == "higher" else "less"
        p_worse, p_better = rank_sum_p(cur, ref, worse), rank_sum_p(cur, ref, better)
        ci = bootstrap_change_ci(cur, ref, confidence, resamples=resamples) if resamples > 0 else None
        if gain < -bound and p_worse <= alpha:
            status = "regressed"
        elif gain > bound and p_better <= alpha:
            status = "improved"
        else:
            status = "ok"
        p = p_worse if gain < 0 else p_better
        if ci is None:
            interval = ""
        elif status == "ok":
            interval = f"{confidence:.0%} CI {ci[0]:+.1f} to {ci[1]:+.1f}%; "
        else:  # the interval of the size, in the word's direction
            lo, hi = sorted(abs(v) if (v < 0) == (pct < 0) else -abs(v) for v in ci)
            interval = f"{confidence:.0%} CI {lo:.1f} to {hi:.1f}%; "
        stats = f"({interval}{_rounds(n)} vs {m}; {_p(p)})"
        if status != "ok":
            message = f"{metric} {status} {size} {stats}: {versus}{where}"
        elif abs(gain) > bound:
            message = f"{metric} {shown} is past the tolerance but not significant {stats}: {versus}{where}"
        else:
            message = f"{metric} {shown} within tolerance {stats}: {versus}{where}"
        return made(status, message, method="mann-whitney", p_value=p, ci_pct=ci, allowed=bound)

    if n == m == 1:
        reason = "one sample a side: judged by the tolerance alone"
    elif n < 2 or m < 2:
        reason = f"{_rounds(n)} vs {m}: judged by the tolerance alone"
    else:
        reason = (f"{_rounds(n)} vs {m} cannot reach p<={alpha:g}: judged by the tolerance alone "
                  "(3 rounds a side can)")
    if gain < -bound:
        status = "regressed"
    elif gain > bound:
        status = "improved"
    else:
        status = "ok"
    head = f"{metric} {shown if math.isfinite(pct) else size} within tolerance" if status == "ok" else \
        f"{metric} {status} {size}"
    message = f"{head} ({reason}): {versus}{where}"
    return made(status, message, allowed=bound, reason=reason)


def judge_sessions(
    metric: str,
    current: float | Sequence[float],
    sessions: Sequence[float],
    tolerance: Tolerance,
    *,
    context: str = "",
    confidence: float = DEFAULT_CONFIDENCE,
    max_cv_pct: float | None = None,
) -> Judgement:
    """Judge this session (a figure, or its rounds' median) against past sessions' medians (at least two,
    positive): their geometric mean is the reference, their spread the noise; a ``sigma`` tolerance is in
    standard deviations of the session medians. ``not-judged`` when this session's rounds spread more than
    ``max_cv_pct``."""
    d = direction(metric)
    cur = _samples(current)
    cur_med, n, cur_cv = statistics.median(cur), len(cur), _cv_pct(cur)
    spread = SessionSpread.of(sessions)
    ref = spread.center
    pct = change_pct(cur_med, ref)
    bound = tolerance.allowed(ref, statistics.stdev(sessions))
    noise = f"session noise: CV {spread.cv_pct:.1f}% over {spread.n} past sessions"

    def made(status: Status, message: str, *, p_value: float | None = None, ci_pct: tuple[float, float] | None = None,
             reason: str | None = None) -> Judgement:
        return Judgement(metric, cur_med, ref, tolerance, d, status, pct, message, n, spread.n, "sessions", p_value,
                         ci_pct, confidence, cur_cv, spread.cv_pct, bound, reason)

    shown = f"{pct:+.1f}%"
    versus = f"{fmt_value(metric, cur_med)} vs baseline {fmt_value(metric, ref)} (sessions' geometric mean)"
    where = f" (tolerance {tolerance}{'; ' + context if context else ''})"
    if max_cv_pct is not None and cur_cv is not None and cur_cv > max_cv_pct:
        reason = f"too noisy to judge: CV {cur_cv:.0f}% over this run's {_rounds(n)} (limit {max_cv_pct:g}%)"
        return made("not-judged", f"{metric} {reason}: {versus}, {shown}{where}", reason=reason)
    worse_edge, better_edge = ((ref - bound) / ref, (ref + bound) / ref) if d == "higher" else \
        ((ref + bound) / ref, (ref - bound) / ref)
    if d == "higher":
        p_worse, p_better = spread.p_below(cur_med, worse_edge), spread.p_above(cur_med, better_edge)
    else:
        p_worse, p_better = spread.p_above(cur_med, worse_edge), spread.p_below(cur_med, better_edge)
    alpha = 1.0 - confidence
    status: Status = "regressed" if p_worse <= alpha else "improved" if p_better <= alpha else "ok"
    low, high = spread.bounds(confidence)
    interval = (change_pct(low, ref), change_pct(high, ref))
    gain = (cur_med - ref) if d == "higher" else (ref - cur_med)
    p = p_worse if gain < 0 else p_better
    stats = (f"({noise}; an unchanged session falls within {interval[0]:+.1f} to {interval[1]:+.1f}% at "
             f"{confidence:.0%} each side; {_p(p)} past the tolerance)")
    head = f"{status} {abs(pct):.1f}% beyond the tolerance and" if status != "ok" else \
        f"{shown} within the tolerance plus"
    message = f"{metric} {head} the session noise {stats}: {versus}{where}"
    return made(status, message, p_value=p, ci_pct=interval)


def metric_value(result: Any, metric: str) -> float | None:
    """``result.metric`` or ``result[metric]``: a BenchResult, a server handle, or a mapping (None if absent;
    a mapping's list of samples gives their median); BaselineError if it is not a number."""
    if isinstance(result, Mapping):
        value = result.get(metric)
        if isinstance(value, (list, tuple)):
            value = statistics.median(value) if value else None
    else:
        value = getattr(result, metric, None)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise BaselineError(f"{metric} of {type(result).__name__} is {value!r}, not a number") from None


def metric_samples(result: Any, metric: str) -> list[float] | None:
    """The per-round values of ``metric``: a BenchResult's rounds (``result.samples``), a mapping's list, or
    the one figure; None if absent."""
    if isinstance(result, Mapping) and isinstance(result.get(metric), (list, tuple)):
        return [float(v) for v in result[metric]] or None
    rounds = getattr(result, "rounds", None)
    sampler = getattr(result, "samples", None)
    if isinstance(rounds, list) and len(rounds) > 1 and callable(sampler):
        values = sampler(metric)
        return [float(v) for v in values] or None
    value = metric_value(result, metric)
    return None if value is None else [value]


# --------------------------------------------------------------------------------------------------------
# Profile comparisons


@dataclass
class ProfileComparison:
    """Whether profile ``better`` beat profile ``other`` on ``test`` by each metric's margin."""

    better: str
    other: str
    test: str
    judgements: list[Judgement] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # in the order the margins were given

    @property
    def failed(self) -> bool:
        return bool(self.failures)

    @property
    def changes(self) -> dict[str, float]:
        """metric -> the figure's own change, ``better`` vs ``other``, in % (``better``'s TTFT 25 % lower: -25)."""
        return {j.metric: j.change_pct for j in self.judgements}

    @property
    def gains(self) -> dict[str, float]:
        """metric -> the change signed so that positive means ``better`` is better (a lower TTFT: +25)."""
        return {j.metric: j.gain_pct for j in self.judgements}

    @property
    def message(self) -> str:
        if self.failed:
            return f"{self.better} does not beat {self.other} on {self.test}:\n  " + "\n  ".join(self.failures)
        return f"{self.better} beats {self.other} on {self.test}: " + "; ".join(j.message for j in self.judgements)


def compare_profiles(better: str, a: BenchResult, other: str, b: BenchResult, test: str,
                     margins: Mapping[str, str | float]) -> ProfileComparison:
    """Judge result ``a`` (profile ``better``) against ``b`` (profile ``other``) with each metric's margin
    ("10%" relative to ``b`` or an absolute amount; "0%": at least as good; none given: output_throughput
    "0%"). Raises nothing: a metric that cannot be compared (no value, unknown metric, malformed margin) is a
    failure named in the message."""
    outcome = ProfileComparison(better, other, test)
    for metric, raw in (margins or {"output_throughput": "0%"}).items():
        try:
            direction(metric)
            tol = Tolerance.parse(metric, raw)
            va, vb = metric_value(a, metric), metric_value(b, metric)
            if va is None or vb is None or math.isnan(va) or math.isnan(vb):
                outcome.failures.append(f"{metric}: {better}={va}, {other}={vb}: cannot compare")
                continue
            sa, sb = metric_samples(a, metric) or [va], metric_samples(b, metric) or [vb]
            j = judge(metric, sa, sb, tol, margin=True, current_label=better, reference_label=other)
        except BaselineError as exc:
            outcome.failures.append(f"{metric}: {exc}")
            continue
        outcome.judgements.append(j)
        if j.failed:
            outcome.failures.append(j.message)
    return outcome


AB_METRICS = ("output_throughput", "input_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
              "median_itl_ms", "median_tpot_ms", "median_e2e_latency_ms")


@dataclass(frozen=True)
class ABJudgement:
    """One metric of an A/B comparison: the second profile against the first."""

    metric: str
    ratio: float  # interleaved: the median of the paired ratios second/first; bracketed: of the medians
    ci: tuple[float, float] | None  # the ratio's interval at ``confidence``
    p_value: float | None  # one-sided, in the direction of the observed change
    pairs: int  # interleaved: pairs of rounds; bracketed: the second side's rounds
    status: Status
    message: str
    tolerance: Tolerance | None = None
    direction: Direction = "higher"
    method: Method = "signed-rank"
    confidence: float = DEFAULT_CONFIDENCE
    spread_cv_pct: float | None = None  # of the paired ratios (interleaved)
    drift_pct: float | None = None  # bracketed: the first side's change from its run before to its run after
    reason: str | None = None  # why not judged
    aa_runs: int = 0  # recorded A/A runs of this workload and machine (their noise judges at AA_RUNS_NEEDED)
    instance_noise_cv_pct: float | None = None  # CV of those A/A runs' ratios, where they judged

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "ratio": self.ratio, "ci": list(self.ci) if self.ci else None,
                "p_value": self.p_value, "pairs": self.pairs, "status": self.status, "method": self.method,
                "tolerance": str(self.tolerance) if self.tolerance else None, "direction": self.direction,
                "confidence": self.confidence, "spread_cv_pct": self.spread_cv_pct, "drift_pct": self.drift_pct,
                "message": self.message, "reason": self.reason, "aa_runs": self.aa_runs,
                "instance_noise_cv_pct": self.instance_noise_cv_pct}


def _bound_pct(metric: str, tolerance: Tolerance, first_median: float) -> float:
    if tolerance.sigma:
        raise BaselineError(f"an A/B check of {metric} takes a tolerance like '5%' or an amount in its unit, "
                            f"not {tolerance}: both sides are measured now, there is no baseline spread")
    if not first_median:
        raise BaselineError(f"an A/B check of {metric} needs a first-side figure other than 0")
    return tolerance.allowed(first_median) / abs(first_median) * 100.0


def _positive(metric: str, label: str, values: Sequence[float]) -> list[float]:
    values = [float(v) for v in values]
    if not values or any(not v > 0 for v in values):
        raise BaselineError(f"an A/B comparison of {metric} needs positive figures on each side; {label} has "
                            f"{', '.join(f'{v:g}' for v in values) or 'none'}")
    return values


def _ab_message(metric: str, second: str, first: str, ratio: float, ci: tuple[float, float] | None,
                confidence: float, sample: str, p: float | None, tolerance: Tolerance | None,
                extra: str = "") -> str:
    interval = f"{confidence:.0%} CI {ci[0]:.2f}-{ci[1]:.2f}, " if ci else ""
    stats = f"{interval}{sample}" + (f", {_p(p)}" if p is not None else "")
    tol = f"; tolerance {tolerance}" if tolerance else ""
    return f"{second} {metric} {ratio:.2f}x {first} ({stats}{extra}{tol})"


def _status_of(gain_pct: float, bound_pct: float, p_worse: float, p_better: float, alpha: float) -> Status:
    if gain_pct < -bound_pct and p_worse <= alpha:
        return "regressed"
    if gain_pct > bound_pct and p_better <= alpha:
        return "improved"
    return "ok"


def judge_paired(metric: str, first: Sequence[float], second: Sequence[float], tolerance: Tolerance | None, *,
                 first_label: str = "A", second_label: str = "B", confidence: float = DEFAULT_CONFIDENCE,
                 max_cv_pct: float | None = DEFAULT_MAX_CV_PCT) -> ABJudgement:
    """Interleaved rounds, ``first[i]`` paired with ``second[i]``: the median of the ratios second/first, its
    Hodges-Lehmann interval and the signed-rank p-value. With a ``tolerance`` the status says whether the second
    side is worse than that (and significantly: ``regressed``), better (``improved``) or ``ok``; ``not-judged``
    with too few pairs for significance or ratios spread more than ``max_cv_pct``. Without one it is ``ok``."""
    d = direction(metric)
    if len(first) != len(second):
        raise BaselineError(f"an A/B comparison of {metric} pairs rounds: {len(first)} vs {len(second)}")
    a = _positive(metric, first_label, first)
    b = _positive(metric, second_label, second)
    ratios = [y / x for x, y in zip(a, b, strict=True)]
    logs = [math.log(r) for r in ratios]
    n = len(ratios)
    ratio = statistics.median(ratios)
    interval = hodges_lehmann_ci(logs, confidence)
    ci = (math.exp(interval[0]), math.exp(interval[2])) if interval else None
    cv = _cv_pct(ratios)
    worse: Alternative = "less" if d == "higher" else "greater"
    better: Alternative = "greater" if d == "higher" else "less"
    p_worse, p_better = signed_rank_p(logs, worse), signed_rank_p(logs, better)
    gain = (ratio - 1.0) * 100.0 if d == "higher" else (1.0 - ratio) * 100.0
    p = p_worse if gain < 0 else p_better
    sample = f"{n} pair{'s' if n != 1 else ''}"
    message = _ab_message(metric, second_label, first_label, ratio, ci, confidence, sample, p, tolerance,
                          f", spread {cv:.1f}%" if cv is not None else "")

    def made(status: Status, reason: str | None = None) -> ABJudgement:
        text = f"{metric} {reason}: {message}" if reason else message
        return ABJudgement(metric, ratio, ci, p, n, status, text, tolerance, d, "signed-rank", confidence, cv,
                           reason=reason)

    if tolerance is None:
        return made("ok")
    bound = _bound_pct(metric, tolerance, statistics.median(a))
    tail = (1.0 - confidence) / 2  # two-sided: significant exactly when the interval leaves 1 out
    if signed_rank_min_p(n) > tail:
        need = next(k for k in range(1, 64) if signed_rank_min_p(k) <= tail)
        return made("not-judged", f"not judged: {sample} cannot reach significance at {confidence:.0%} "
                                  f"(rounds={need} can)")
    if cv is not None and max_cv_pct is not None and cv > max_cv_pct:
        return made("not-judged", f"too noisy to judge: the paired ratios spread CV {cv:.0f}% over {sample} "
                                  f"(limit {max_cv_pct:g}%)")
    return made(_status_of(gain, bound, p_worse, p_better, tail))


def judge_bracketed(metric: str, before: Sequence[float], second: Sequence[float], after: Sequence[float],
                    tolerance: Tolerance | None, *, first_label: str = "A", second_label: str = "B",
                    confidence: float = DEFAULT_CONFIDENCE, max_cv_pct: float | None = DEFAULT_MAX_CV_PCT,
                    resamples: int = BOOTSTRAP_RESAMPLES) -> ABJudgement:
    """First side, second side, first side again (one server alive at a time): the second side's rounds against
    both first-side runs (the rank-sum test and the bootstrap interval of the change of the medians, as
    :func:`judge`), and the drift of the first side between its two runs; a drift beyond the tolerance is
    ``not-judged``: the machine changed under the comparison."""
    d = direction(metric)
    ref = _positive(metric, first_label, [*before, *after])
    cur = _positive(metric, second_label, second)
    drift = change_pct(statistics.median(after), statistics.median(before))
    j = judge(metric, cur, ref, tolerance or Tolerance(0.0, True), current_label=second_label,
              reference_label=first_label, confidence=confidence, max_cv_pct=max_cv_pct, resamples=resamples)
    ratio = j.current / j.reference
    ci = (1 + j.ci_pct[0] / 100.0, 1 + j.ci_pct[1] / 100.0) if j.ci_pct else None
    sample = f"{len(cur)} vs {len(before)}+{len(after)} rounds"
    message = _ab_message(metric, second_label, first_label, ratio, ci, confidence, sample, j.p_value, tolerance,
                          f"; {first_label} drifted {drift:+.1f}% from before to after")

    def made(status: Status, reason: str | None = None) -> ABJudgement:
        text = f"{metric} {reason}: {message}" if reason else message
        return ABJudgement(metric, ratio, ci, j.p_value, len(cur), status, text, tolerance, d, j.method,
                           confidence, drift_pct=drift, reason=reason)

    if tolerance is None:
        return made("ok")
    bound = _bound_pct(metric, tolerance, statistics.median(ref))
    if abs(drift) > bound:
        return made("not-judged", f"not judged: the machine drifted {abs(drift):.1f}% during the comparison "
                                  f"({first_label} before vs after; tolerance {tolerance})")
    if j.status == "not-judged":
        return made("not-judged", j.reason)
    if j.method == "tolerance":
        return made("not-judged", f"not judged: {j.reason}")
    return made(j.status)


def judge_instance_noise(paired: ABJudgement, noise: Sequence[float], first_median: float) -> ABJudgement:
    """``paired`` (a judged A/B metric) judged again by the instance noise: ``noise`` is the log ratios of
    recorded A/A runs (at least two); the A/B's ratio regresses when an unchanged pair of instances at the
    tolerance's edge falls that low with chance at most ``1 - confidence`` (improved likewise)."""
    if paired.tolerance is None:
        raise BaselineError(f"judging {paired.metric} by the instance noise needs a tolerance")
    spread = SessionSpread.of([math.exp(v) for v in noise])
    bound = _bound_pct(paired.metric, paired.tolerance, first_median) / 100.0
    higher = paired.direction == "higher"
    worse_edge, better_edge = (1.0 - bound, 1.0 + bound) if higher else (1.0 + bound, 1.0 - bound)
    if higher:
        p_worse, p_better = spread.p_below(paired.ratio, worse_edge), spread.p_above(paired.ratio, better_edge)
    else:
        p_worse, p_better = spread.p_above(paired.ratio, worse_edge), spread.p_below(paired.ratio, better_edge)
    alpha = 1.0 - paired.confidence
    status: Status = "regressed" if p_worse <= alpha else "improved" if p_better <= alpha else "ok"
    low, high = spread.bounds(paired.confidence)
    p = p_worse if (paired.ratio < 1.0) == higher else p_better
    clause = (f"instance noise: CV {spread.cv_pct:.1f}% over {spread.n} A/A runs, an unchanged pair "
              f"{low:.2f}-{high:.2f}x, {_p(p)} past the tolerance")
    return replace(paired, status=status, p_value=p, method="instance-noise", message=_noted(paired, clause),
                   aa_runs=spread.n, instance_noise_cv_pct=spread.cv_pct)


def _noted(judged: ABJudgement, clause: str) -> str:
    """The message with ``clause`` beside the statistics, before the tolerance that closes them."""
    head, sep, tail = judged.message.rpartition("; tolerance ")
    return f"{head}; {clause}{sep}{tail}" if sep else f"{judged.message} ({clause})"


@dataclass
class ABComparison:
    """Every metric of one A/B ``check()``, and what the test should make of it."""

    first: str
    second: str
    judgements: list[ABJudgement] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # metrics that could not be compared, and why
    noise_hint: str | None = None  # how to record the A/A runs a metric lacked (instance noise not yet known)

    @property
    def regressions(self) -> list[ABJudgement]:
        return [j for j in self.judgements if j.status == "regressed"]

    @property
    def not_judged(self) -> list[ABJudgement]:
        return [j for j in self.judgements if j.status == "not-judged"]

    @property
    def failed(self) -> bool:
        return bool(self.regressions or self.errors)

    @property
    def gate(self) -> str:
        if self.regressions or self.errors:
            return "regressed"
        return "not-judged" if self.not_judged else "passed"

    @property
    def gate_reason(self) -> str | None:
        if self.gate == "regressed":
            return "; ".join([j.message for j in self.regressions] + self.errors)
        if self.gate == "not-judged":
            return "; ".join(j.message for j in self.not_judged)
        return None

    def failure_message(self) -> str:
        head = f"{self.second} regressed against {self.first}:"
        hint = [f"instance noise not yet known: {self.noise_hint}"] if self.noise_hint else []
        return "\n  ".join([head, *(f"{j.message} regressed" for j in self.regressions), *self.errors, *hint])

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "second": self.second, "checks": [j.to_dict() for j in self.judgements],
                "errors": list(self.errors), "gate": self.gate, "gate_reason": self.gate_reason,
                "noise_hint": self.noise_hint}


def compare_ab(first: str, second: str, samples: Mapping[str, tuple[Sequence[float], ...]],
               tolerances: Mapping[str, str | float], *, bracketed: bool = False,
               confidence: float = DEFAULT_CONFIDENCE, max_cv_pct: float | None = DEFAULT_MAX_CV_PCT,
               instance_noise: Mapping[str, Sequence[float]] | None = None, noise_hint: str = ""
               ) -> ABComparison:
    """Judge profile ``second`` against ``first`` on each metric of ``tolerances``. ``samples[metric]`` is
    ``(first_rounds, second_rounds)`` interleaved, ``(before, second_rounds, after)`` bracketed. A metric that
    cannot be compared (unknown, malformed tolerance, not measured) is an error named in the message.
    ``instance_noise``: metric -> the log ratios of recorded A/A runs (None: not looked up); with at least
    AA_RUNS_NEEDED of a metric they judge it (:func:`judge_instance_noise`), with fewer the message says so and
    ``noise_hint`` says how to record them."""
    outcome = ABComparison(first, second)
    for metric, raw in tolerances.items():
        try:
            direction(metric)
            tol = Tolerance.parse(metric, raw)
            if metric not in samples:
                raise BaselineError(f"{metric} was not measured in this A/B run")
            judged = ab_judgement(metric, first, second, samples[metric], tol, bracketed=bracketed,
                                  confidence=confidence, max_cv_pct=max_cv_pct)
            if instance_noise is not None:
                runs = list(instance_noise.get(metric, ()))
                if len(runs) < AA_RUNS_NEEDED:
                    clause = f"instance noise not yet known ({len(runs)} of {AA_RUNS_NEEDED} A/A runs)"
                    judged = replace(judged, message=_noted(judged, clause), aa_runs=len(runs))
                    outcome.noise_hint = noise_hint or None
                elif judged.status != "not-judged":
                    judged = judge_instance_noise(judged, runs, statistics.median(samples[metric][0]))
            outcome.judgements.append(judged)
        except BaselineError as exc:
            outcome.errors.append(f"{metric}: {exc}")
    return outcome


def ab_judgement(metric: str, first: str, second: str, sides: tuple[Sequence[float], ...],
                 tolerance: Tolerance | None, *, bracketed: bool, confidence: float = DEFAULT_CONFIDENCE,
                 max_cv_pct: float | None = DEFAULT_MAX_CV_PCT) -> ABJudgement:
    """One metric, interleaved (``sides`` = first, second) or bracketed (before, second, after)."""
    labels = {"first_label": first, "second_label": second, "confidence": confidence, "max_cv_pct": max_cv_pct}
    if bracketed:
        before, cur, after = sides
        return judge_bracketed(metric, before, cur, after, tolerance, **labels)  # type: ignore[arg-type]
    a, b = sides
    return judge_paired(metric, a, b, tolerance, **labels)  # type: ignore[arg-type]
