"""Baselines: direction-aware comparison of figures, the baseline file, and the check. Knows nothing about pytest.

One module per job:

* ``directions``: which way is better for each metric (``direction``, by bench/metric_table.py), its unit and
  format, ``Tolerance``;
* ``engine``: the one comparison engine, a module per rule over ``pytest_sglang.stats`` (``judge``: a
  figure or the samples of rounds against a reference, with a tolerance or a margin, significance before
  failure; ``judge_sessions``; the A/B rules behind ``compare_ab``), used by the baseline checks, by profile
  comparisons (``compare_profiles``) and by A/B checks;
* ``ab``: two profiles' rounds of one workload, in an order that lets the host's drift cancel, and their
  verdict (``ABResult``);
* ``store``: the baseline file (``BaselineStore``, ``Entry``, ``validate``), locked and replaced atomically;
* ``checks``: ``compare()`` of a result with its baseline (``Check``, ``Comparison``: ``outcome``), ``gate_of``
  (passed, regressed, not-judged) and the session's ``BaselineChecker``.

``change_pct`` is the change of the figure itself, (current - baseline) / |baseline| * 100, everywhere; the
status word (``regressed``, ``improved``) says whether it is worse or better.
"""

from __future__ import annotations

from pytest_sglang.baseline.checks import (
    BaselineChecker,
    NotJudgedWarning,
    compare,
    compare_one,
    gate_of,
    infrastructure_problem,
)
from pytest_sglang.baseline.directions import Direction, Tolerance, direction, fmt_value, unit
from pytest_sglang.baseline.engine import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MAX_CV_PCT,
    Judgement,
    ProfileComparison,
    change_pct,
    compare_profiles,
    judge,
    metric_samples,
    metric_value,
)
from pytest_sglang.baseline.outcome import Check, Comparison
from pytest_sglang.baseline.store import DEFAULT_FILENAME, FORMAT, VERSION, BaselineStore, Entry, validate
from pytest_sglang.envknobs import MACHINE_ENV
from pytest_sglang.machine.facts import Machine, detect_machine, git_commit

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DEFAULT_FILENAME",
    "DEFAULT_MAX_CV_PCT",
    "FORMAT",
    "MACHINE_ENV",
    "VERSION",
    "BaselineChecker",
    "BaselineStore",
    "Check",
    "Comparison",
    "Direction",
    "Entry",
    "Judgement",
    "Machine",
    "NotJudgedWarning",
    "ProfileComparison",
    "Tolerance",
    "change_pct",
    "compare",
    "compare_one",
    "compare_profiles",
    "detect_machine",
    "direction",
    "fmt_value",
    "gate_of",
    "git_commit",
    "infrastructure_problem",
    "judge",
    "metric_samples",
    "metric_value",
    "unit",
    "validate",
]
