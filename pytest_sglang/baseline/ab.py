"""A/B runs: two profiles' rounds of one workload, in an order that lets the host's drift cancel.

Interleaved (both servers alive): a warmup of each, then ``rounds`` pairs in the balanced order A B, B A,
A B, ... so that neither side always runs first. Bracketed (one alive at a time): the first profile's rounds,
the second's, the first's again. :class:`ABResult` holds each side's rounds and, through the one comparison
engine (baseline/engine/), the ratio of each metric with its interval and p-value; ``judge`` compares with
tolerances, ``check`` also reports and fails (the fixture supplies what a check does in a test).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_sglang.baseline.checks import GATE_OPTIONS, gate_of, gate_options
from pytest_sglang.baseline.engine import (
    AB_METRICS,
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_CV_PCT,
    ABComparison,
    ab_judgement,
    compare_ab,
)
from pytest_sglang.errors import BaselineError, BenchmarkError

if TYPE_CHECKING:
    from pytest_sglang.bench.metrics import BenchResult

RunRound = Callable[[str, int], "BenchResult"]  # (profile, warmup requests) -> one round's result


def balanced_order(first: str, second: str, pairs: int) -> list[str]:
    """A B B A A B ...: each pair's order alternates, so a trend within the job hits both sides alike."""
    order: list[str] = []
    for i in range(pairs):
        order += [first, second] if i % 2 == 0 else [second, first]
    return order


@dataclass
class ABResult:
    """The ``sglang_ab`` fixture's result: ``ratio[metric]`` (second over first), ``ci[metric]`` (low, high),
    ``p_value[metric]``, ``pairs``, ``rounds[profile]``, ``check(metric="5%", ...)``."""

    first: str
    second: str
    rounds: dict[str, list[BenchResult]]
    order: list[str]  # the profile of each measured round, in the order they ran
    together: bool = True
    before: int = 0  # bracketed: how many of the first profile's rounds ran before the second's
    confidence: float = DEFAULT_CONFIDENCE
    max_cv_pct: float | None = DEFAULT_MAX_CV_PCT
    comparisons: list[ABComparison] = field(default_factory=list)
    on_check: Callable[[ABComparison], None] | None = None  # what check() does with its outcome (the fixture)
    same_server: bool = False  # an A/A run: both profiles launch the same server (launch/plan.py's fingerprint)
    instance_noise: dict[str, list[float]] | None = None  # metric -> recorded A/A runs' log ratios (store.py)
    noise_hint: str = ""  # how to record those A/A runs, for a check that has too few
    ratio: dict[str, float] = field(init=False)
    ci: dict[str, tuple[float, float] | None] = field(init=False)
    p_value: dict[str, float | None] = field(init=False)

    def __post_init__(self) -> None:
        self.ratio, self.ci, self.p_value = {}, {}, {}
        for metric in AB_METRICS:
            sides = self.samples(metric)
            if sides is None:
                continue
            try:
                j = ab_judgement(metric, self.first, self.second, sides, None, bracketed=not self.together,
                                 confidence=self.confidence)
            except BaselineError:  # a figure of 0 (no ITL with one output token): no ratio for it
                continue
            self.ratio[metric], self.ci[metric], self.p_value[metric] = j.ratio, j.ci, j.p_value

    @property
    def pairs(self) -> int:
        """Interleaved: the pairs of rounds; bracketed: the second profile's rounds."""
        return len(self.rounds[self.second])

    @property
    def drift_pct(self) -> float | None:
        """Bracketed: how much the first profile's throughput moved between its two runs, in percent."""
        if self.together:
            return None
        sides = self.samples("output_throughput")
        return None if sides is None else _median_change(sides[2], sides[0])

    def samples(self, metric: str) -> tuple[list[float], ...] | None:
        """Each side's per-round values: (first, second) interleaved, (before, second, after) bracketed."""
        a = [getattr(r, metric, None) for r in self.rounds[self.first]]
        b = [getattr(r, metric, None) for r in self.rounds[self.second]]
        values = [*a, *b]
        if not values or any(not isinstance(v, (int, float)) or math.isnan(v) for v in values):
            return None
        fa, fb = [float(v) for v in a], [float(v) for v in b]  # type: ignore[arg-type]
        return (fa, fb) if self.together else (fa[:self.before], fb, fa[self.before:])

    def judge(self, **tolerances: str | float) -> ABComparison:
        """Judge the second profile against the first with each metric's tolerance ("5%": how much worse it
        may be); ``confidence`` and ``max_cv`` set the gate as in sglang_baseline.check."""
        confidence, max_cv = self.confidence, self.max_cv_pct  # the session's (--sglang-confidence, --sglang-max-cv)
        try:
            if "confidence" in tolerances:
                confidence = gate_options({"confidence": tolerances["confidence"]})[0]
            if "max_cv" in tolerances:
                max_cv = gate_options({"max_cv": tolerances["max_cv"]})[1]
        except BaselineError as exc:
            return ABComparison(self.first, self.second, errors=[str(exc)])
        metrics = {k: v for k, v in tolerances.items() if k not in GATE_OPTIONS} or {"output_throughput": "5%"}
        samples = {m: s for m in metrics if (s := self.samples(m)) is not None}
        return compare_ab(self.first, self.second, samples, metrics, bracketed=not self.together,
                          confidence=confidence, max_cv_pct=max_cv, instance_noise=self.instance_noise,
                          noise_hint=self.noise_hint,
                          unmeasured={m: why for m in metrics if m not in samples and (why := self.unmeasured(m))})

    def unmeasured(self, metric: str) -> str | None:
        """Why a telemetry figure is None in these rounds (the first round that says), else None."""
        for rounds in self.rounds.values():
            for one in rounds:
                says = getattr(one, "unmeasured", None)  # a BenchResult; a test's stand-in may not say
                if callable(says) and (why := says(metric)):
                    return str(why)
        return None

    def check(self, **tolerances: str | float) -> ABComparison:
        """``judge``, recorded for the report; in a test, fails it on a regression (``"not judged"`` warns)."""
        outcome = self.judge(**tolerances)
        self.comparisons.append(outcome)
        if self.on_check is not None:
            self.on_check(outcome)
        return outcome

    def to_dict(self) -> dict[str, Any]:
        gate, reason = gate_of(None, self.comparisons)
        return {"first": self.first, "second": self.second, "together": self.together, "pairs": self.pairs,
                "order": list(self.order), "ratio": dict(self.ratio),
                "ci": {m: list(c) if c else None for m, c in self.ci.items()}, "p_value": dict(self.p_value),
                "confidence": self.confidence, "drift_pct": self.drift_pct, "same_server": self.same_server,
                "rounds": {p: [r.output_throughput for r in rs] for p, rs in self.rounds.items()},
                "server_cache_hit_rate": {p: [getattr(r, "server_cache_hit_rate", None) for r in rs]
                                          for p, rs in self.rounds.items()},
                "checks": [c.to_dict() for c in self.comparisons],
                "gate": gate, "gate_reason": reason}


def _median_change(after: list[float], before: list[float]) -> float | None:
    from statistics import median

    from pytest_sglang.baseline.engine import change_pct

    return change_pct(median(after), median(before)) if after and before else None


def run_interleaved(first: str, second: str, run_round: RunRound, *, rounds: int, warmup: int,
                    pair_started: Callable[[], None] | None = None, **gate: Any) -> ABResult:
    """A warmup round of each (``warmup`` requests), then ``rounds`` pairs in the balanced order.
    ``pair_started`` is called before the warmup pair and each measured pair: the runner aligns both servers'
    prompt sets there (cache.PromptSets.align), so the two rounds of a pair send the same prompts."""
    _need_rounds(rounds)
    if warmup > 0:
        if pair_started is not None:
            pair_started()
        for profile in (first, second):
            run_round(profile, warmup)
    measured: dict[str, list[BenchResult]] = {first: [], second: []}
    order = balanced_order(first, second, rounds)
    for i, profile in enumerate(order):
        if i % 2 == 0 and pair_started is not None:
            pair_started()
        measured[profile].append(run_round(profile, 0))
    return ABResult(first, second, measured, order, **gate)


def run_bracketed(first: str, second: str, run_round: RunRound, *, rounds: int, warmup: int,
                  switch: Callable[[str], None], **gate: Any) -> ABResult:
    """The first profile's rounds, the second's, the first's again, ``switch(profile)`` making that profile's
    server the live one before each run; each run starts with its warmup."""
    _need_rounds(rounds)
    half = max(1, math.ceil(rounds / 2))
    measured: dict[str, list[BenchResult]] = {first: [], second: []}
    order: list[str] = []
    for profile, count in ((first, half), (second, rounds), (first, half)):
        switch(profile)
        for i in range(count):
            measured[profile].append(run_round(profile, warmup if i == 0 else 0))
            order.append(profile)
    return ABResult(first, second, measured, order, together=False, before=half, **gate)


def _need_rounds(rounds: int) -> None:
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise BenchmarkError(f"sglang_ab(rounds=...) must be a whole number of pairs >= 1, got {rounds!r}; "
                             "5 or more can reach significance at 95 %, 6 or more give an interval")


def workload_of(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The benchmark arguments of one round: ``rounds`` and ``warmup`` belong to the A/B schedule."""
    return {k: v for k, v in kwargs.items() if k not in ("rounds", "warmup")}


def aa_log_ratios(result: ABResult) -> dict[str, float]:
    """An A/A run's contribution to the instance noise: each metric's log ratio second/first."""
    return {m: math.log(r) for m, r in result.ratio.items() if r > 0}


def noise_hint(first: str, workload: str) -> str:
    """What to run so that this A/B's checks learn the host's instance noise."""
    twin = f"{first}-twin"
    return (f"record A/A runs on this machine: a profile {twin!r} with extends = {first!r} (the same server), a "
            f"test marked @pytest.mark.sglang_ab({first!r}, {twin!r}) calling sglang_ab with the same arguments "
            f"({workload}), run with --sglang-profile={first},{twin} --sglang-update-baseline, e.g. nightly")
