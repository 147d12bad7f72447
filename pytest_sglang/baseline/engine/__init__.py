"""The one comparison engine: a candidate judged against a reference, direction-aware; the only place that
decides "regressed".

:func:`judge` serves both kinds of comparison. A baseline check (checks.py) judges this run's figure
against its stored baseline with a *tolerance*: how much worse it may be. A profile comparison
(:func:`compare_profiles`, behind ``sglang_results.compare``) judges one profile's figure against another's
with a *margin*: how much better it must be. An A/B comparison (:func:`compare_ab`, behind the ``sglang_ab``
fixture) judges a second profile against a first measured in the same job.

One module per rule, each module's docstring says what it decides and why:

* ``verdict``: what the rules share: statuses, defaults, ``change_pct``, and how a change beyond the tolerance
  and its significance make a status;
* ``judgement``: the records the rules return (``Judgement``, ``ABJudgement``) and their shared wording;
* ``rounds``: ``judge``, a figure or the samples of rounds against a reference (Mann-Whitney, or the
  tolerance alone);
* ``sessions``: ``judge_sessions``, a session against past sessions' medians (SESSIONS_NEEDED of them);
* ``paired``: ``judge_paired``, interleaved A/B rounds (signed-rank test of the paired ratios);
* ``bracketed``: ``judge_bracketed``, first side, second, first again (with the drift between);
* ``instance_noise``: ``judge_instance_noise``, an A/B ratio against recorded A/A runs (AA_RUNS_NEEDED);
* ``ab``: ``compare_ab``, every metric of an A/B check, each by the rule its run calls for;
* ``profiles``: ``compare_profiles``, one profile against another by margins;
* ``figures``: ``metric_value`` and ``metric_samples``, a metric read from a result or a mapping.

One sign convention everywhere: ``change_pct`` is the change of the figure itself (of the medians),
``(current - reference) / |reference| * 100``: a startup 47 % slower is +47.4, a throughput 6 % lower is
-6.0. The status word says whether that is better or worse (``regressed``, ``improved``).
"""

from __future__ import annotations

from pytest_sglang.baseline.engine.ab import AB_METRICS, ABComparison, ab_judgement, compare_ab
from pytest_sglang.baseline.engine.bracketed import judge_bracketed
from pytest_sglang.baseline.engine.figures import metric_samples, metric_value
from pytest_sglang.baseline.engine.instance_noise import AA_RUNS_NEEDED, judge_instance_noise
from pytest_sglang.baseline.engine.judgement import ABJudgement, Judgement
from pytest_sglang.baseline.engine.paired import judge_paired
from pytest_sglang.baseline.engine.profiles import ProfileComparison, compare_profiles
from pytest_sglang.baseline.engine.rounds import judge
from pytest_sglang.baseline.engine.sessions import SESSIONS_NEEDED, judge_sessions
from pytest_sglang.baseline.engine.verdict import DEFAULT_CONFIDENCE, DEFAULT_MAX_CV_PCT, Method, Status, change_pct

__all__ = [
    "AA_RUNS_NEEDED",
    "AB_METRICS",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_MAX_CV_PCT",
    "SESSIONS_NEEDED",
    "ABComparison",
    "ABJudgement",
    "Judgement",
    "Method",
    "ProfileComparison",
    "Status",
    "ab_judgement",
    "change_pct",
    "compare_ab",
    "compare_profiles",
    "judge",
    "judge_bracketed",
    "judge_instance_noise",
    "judge_paired",
    "judge_sessions",
    "metric_samples",
    "metric_value",
]
