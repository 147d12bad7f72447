"""An A/B ``check()``: every metric of two profiles measured in one job, each judged by the rule its run
calls for (paired, bracketed, or the instance noise once the machine has enough A/A runs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_sglang.baseline.directions import Tolerance, direction
from pytest_sglang.baseline.engine.bracketed import judge_bracketed
from pytest_sglang.baseline.engine.instance_noise import AA_RUNS_NEEDED, judge_instance_noise
from pytest_sglang.baseline.engine.judgement import ABJudgement, noted
from pytest_sglang.baseline.engine.paired import judge_paired
from pytest_sglang.baseline.engine.power import catch_text
from pytest_sglang.baseline.engine.verdict import DEFAULT_CONFIDENCE, DEFAULT_MAX_CV_PCT
from pytest_sglang.baseline.gate import Gate
from pytest_sglang.errors import BaselineError

AB_METRICS = ("output_throughput", "input_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms",
              "median_itl_ms", "median_tpot_ms", "median_e2e_latency_ms")


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
    def gate(self) -> Gate:
        """As a baseline check's: a check that could not be made (``errors``, e.g. a bad tolerance) fails the
        test, and gates as not judged, never as a regression it did not measure."""
        if self.regressions:
            return "regressed"
        return "not-judged" if self.not_judged or self.errors else "passed"

    @property
    def gate_reason(self) -> str | None:
        if self.gate == "regressed":
            return "; ".join(j.message for j in self.regressions)
        if self.gate == "not-judged":
            return "; ".join([j.message for j in self.not_judged] + self.errors)
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
               instance_noise: Mapping[str, Sequence[float]] | None = None, noise_hint: str = "",
               unmeasured: Mapping[str, str] | None = None) -> ABComparison:
    """Judge profile ``second`` against ``first`` on each metric of ``tolerances``. ``samples[metric]`` is
    ``(first_rounds, second_rounds)`` interleaved, ``(before, second_rounds, after)`` bracketed. A metric that
    cannot be compared (unknown, malformed tolerance, not measured) is an error named in the message.
    ``instance_noise``: metric -> the log ratios of recorded A/A runs (None: not looked up); with at least
    AA_RUNS_NEEDED of a metric they judge it (:func:`judge_instance_noise`), with fewer the message says so and
    ``noise_hint`` says how to record them. ``unmeasured``: metric -> why a figure is None on this machine (no
    GPU to ask, no /metrics): such a metric is not judged, with that reason, rather than an error."""
    outcome = ABComparison(first, second)
    for metric, raw in tolerances.items():
        try:
            direction(metric)
            tol = Tolerance.parse(metric, raw)
            if metric not in samples and unmeasured and metric in unmeasured:
                outcome.judgements.append(not_measured(metric, first, second, tol, unmeasured[metric]))
                continue
            if metric not in samples:
                raise BaselineError(f"{metric} was not measured in this A/B run")
            judged = ab_judgement(metric, first, second, samples[metric], tol, bracketed=bracketed,
                                  confidence=confidence, max_cv_pct=max_cv_pct)
            if instance_noise is not None:
                runs = list(instance_noise.get(metric, ()))
                if len(runs) < AA_RUNS_NEEDED:
                    clause = f"instance noise not yet known ({len(runs)} of {AA_RUNS_NEEDED} A/A runs)"
                    judged = replace(judged, message=noted(judged, clause), aa_runs=len(runs))
                    outcome.noise_hint = noise_hint or None
                else:  # the recorded A/A runs decide, whatever the pairs' spread said (instance_noise.py)
                    judged = judge_instance_noise(judged, runs, statistics.median(samples[metric][0]))
            if judged.method != "instance-noise" and judged.detectable_pct is not None:
                sample = f"{judged.pairs} {'pairs' if not bracketed else 'rounds'}"
                judged = replace(judged, message=noted(judged, catch_text(judged.detectable_pct, sample)))
            outcome.judgements.append(judged)
        except BaselineError as exc:
            outcome.errors.append(f"{metric}: {exc}")
    return outcome


def not_measured(metric: str, first: str, second: str, tolerance: Tolerance, why: str) -> ABJudgement:
    """A metric with no figure on either side: no ratio (NaN, null in the report), not judged, and why."""
    return ABJudgement(metric, math.nan, None, None, 0, "not-judged",
                       f"{second} {metric} vs {first} not judged: {why}", tolerance, direction(metric),
                       reason=why)


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
