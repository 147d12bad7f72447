"""Instance noise: how much two instances of one server differ, learnt from recorded A/A runs, judging A/B
checks (engine.py), kept in the baseline file (store.py), drawn by the simulator (instance_drift), and a real
A/A recording run followed by a check through pytest on the simulator."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from helpers import profile_toml

from pytest_sglang.baseline.engine import AA_RUNS_NEEDED, compare_ab
from pytest_sglang.baseline.store import SESSIONS_KEPT, BaselineStore, validate, workload_key
from pytest_sglang.config import load_profiles
from pytest_sglang.errors import BaselineError
from pytest_sglang.launch.plan import plan_launch
from pytest_sglang.machine.facts import Machine
from pytest_sglang.sim.config import KnobError, load_knobs
from pytest_sglang.sim.drift import instance_factor

# Log ratios of A/A runs on a host like the H200's: two instances of one server up to ~25 % apart.
H200_AA = (1.101, 0.792, 1.238, 1.120, 0.903, 0.904, 0.995, 1.024)  # docs/gpu.md: 8 A-vs-A ratios
NOISE = [math.log(r) for r in H200_AA]
FIRST = [100.0, 102.0, 99.0, 101.0, 100.5, 98.5, 100.0, 101.5]


def tight(ratio: float) -> tuple[list[float], list[float]]:
    """Eight pairs whose ratio is ``ratio`` within 0.5 %: within the job, beyond doubt."""
    return FIRST, [a * ratio * (1 + (0.005 if i % 2 else -0.004)) for i, a in enumerate(FIRST)]


def check(ratio: float, noise: list[float] | None, hint: str = "record A/A runs with ...") -> object:
    return compare_ab("main", "cand", {"output_throughput": tight(ratio)}, {"output_throughput": "5%"},
                      instance_noise=None if noise is None else {"output_throughput": noise}, noise_hint=hint)


def test_within_the_instance_noise_passes_what_the_paired_rule_calls_a_regression() -> None:
    paired = check(0.85, None)
    assert paired.gate == "regressed"  # type: ignore[attr-defined]
    calibrated = check(0.85, NOISE)
    (j,) = calibrated.judgements  # type: ignore[attr-defined]
    assert calibrated.gate == "passed" and j.method == "instance-noise" and j.aa_runs == len(NOISE)  # type: ignore[attr-defined]
    cv = statistics.stdev(H200_AA) / statistics.fmean(H200_AA) * 100
    assert f"instance noise: CV {cv:.1f}% over 8 A/A runs, an unchanged pair " in j.message
    assert "past the tolerance; catches about " in j.message and "% at 80% power (8 A/A runs)" in j.message
    assert " runs of history find a step of about " in j.message and j.message.endswith("; tolerance 5%)")
    assert j.detectable_pct is not None and j.detectable_pct > 5.0  # the tolerance plus the noise's reach
    assert j.history_detectable_pct is not None and 0 < j.history_detectable_pct < j.detectable_pct


def test_beyond_the_instance_noise_and_the_tolerance_regresses() -> None:
    outcome = check(0.5, NOISE)
    (j,) = outcome.judgements  # type: ignore[attr-defined]
    assert outcome.gate == "regressed" and j.method == "instance-noise" and j.p_value < 0.05  # type: ignore[attr-defined]
    assert "cand output_throughput 0.50x main" in outcome.failure_message()  # type: ignore[attr-defined]


def test_with_fewer_than_five_a_a_runs_the_paired_rule_stays_and_says_what_to_record() -> None:
    outcome = check(0.85, NOISE[:AA_RUNS_NEEDED - 1], hint="record A/A runs: run X")
    (j,) = outcome.judgements  # type: ignore[attr-defined]
    assert outcome.gate == "regressed" and j.method == "signed-rank"  # type: ignore[attr-defined]
    assert "instance noise not yet known (4 of 5 A/A runs); catches about 5% at 80% power (8 pairs); " \
           "tolerance 5%)" in j.message
    assert outcome.failure_message().endswith("instance noise not yet known: record A/A runs: run X")  # type: ignore[attr-defined]
    assert outcome.to_dict()["noise_hint"] == "record A/A runs: run X"  # type: ignore[attr-defined]


def test_the_store_keeps_the_last_a_a_runs_beside_the_baselines(tmp_path: Path) -> None:
    store = BaselineStore(tmp_path / "b.json")
    machine = Machine(name="cpu", driver=None, server="sglang 0.5")
    store.record("main", "t::x", machine, {"output_throughput": [10.0, 11.0]})
    key = workload_key({"rounds": 6, "num_requests": 8})
    assert key == "num_requests=8 rounds=6"
    for i in range(SESSIONS_KEPT + 3):
        store.record_instance_noise(machine, key, {"output_throughput": i / 100, "median_itl_ms": math.nan})
    data = json.loads(store.path.read_text())
    validate(data)
    kept = BaselineStore(store.path).instance_noise(machine, key)
    assert kept == {"output_throughput": [i / 100 for i in range(3, SESSIONS_KEPT + 3)]}
    assert BaselineStore(store.path).lookup("main", "t::x", machine).sessions_of("output_throughput") == [10.5]
    data["instance_noise"][machine.key][key]["output_throughput"] = ["x"]
    with pytest.raises(BaselineError, match=r"instance_noise\[.*\]\.num_requests=8 rounds=6\.output_throughput"):
        validate(data)


def test_two_profiles_of_one_server_share_the_server_fingerprint(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        "[tool.pytest_sglang.profiles.main]\nmodel = 'm'\nargs = ['--tp', '1']\n"
        "[tool.pytest_sglang.profiles.twin]\nmodel = 'm'\nargs = ['--tp', '1']\nport = 31999\n"
        "[tool.pytest_sglang.profiles.placed]\nmodel = 'm'\nargs = ['--tp', '1']\ngpus = [1]\ncpus = '0'\n"
        "[tool.pytest_sglang.profiles.capped]\nmodel = 'm'\nargs = ['--tp', '1', '--max-running-requests', '12']\n")
    profiles = load_profiles(tmp_path, None).profiles
    plans = {n: plan_launch(profiles[n], sim=True, log_dir=tmp_path) for n in ("main", "twin", "placed", "capped")}
    assert plans["main"].server_fingerprint == plans["twin"].server_fingerprint
    # Where an instance runs (its GPUs, its cores) does not make it another server; it does make another reuse.
    assert plans["main"].server_fingerprint == plans["placed"].server_fingerprint
    assert plans["main"].fingerprint != plans["placed"].fingerprint
    assert plans["main"].fingerprint != plans["twin"].fingerprint  # a fixed port is part of the reuse fingerprint
    assert plans["main"].server_fingerprint != plans["capped"].server_fingerprint
    assert plans["twin"].env["PYTEST_SGLANG_SIM_INSTANCE"] == "twin"


def test_instance_drift_draws_one_seeded_factor_per_instance() -> None:
    assert instance_factor("7", "main", 0.2) == instance_factor("7", "main", 0.2)
    factors = [instance_factor(str(seed), name, 0.2) for seed in range(200) for name in ("main", "twin")]
    logs = [math.log(f) for f in factors]
    assert len(set(factors)) == len(factors)
    assert abs(sum(logs) / len(logs)) < 0.05 and 0.15 < (sum(v * v for v in logs) / len(logs)) ** 0.5 < 0.25
    assert instance_factor("7", "main", 0.0) == 1.0
    with pytest.raises(KnobError, match="instance_drift must be >= 0"):
        load_knobs('{"instance_drift": -0.1}')


AA_TESTS = '''
import pytest

@pytest.mark.sglang_ab("main", "twin")
def test_aa(sglang_ab):
    r = sglang_ab(num_requests=8, concurrency=8, input_len=16, output_len=24, rounds=6)
    print("SAME_SERVER", r.same_server)
    print("AA", r.check(output_throughput="5%", max_cv="off").judgements[0].message)

@pytest.mark.sglang_ab("main", "slow")
def test_slow(sglang_ab):
    sglang_ab(num_requests=8, concurrency=8, input_len=16, output_len=24, rounds=6).check(
        output_throughput="5%", max_cv="off")
'''


def test_an_a_a_recording_run_appends_and_a_check_uses_it(pytester: pytest.Pytester, mark: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    knobs = "startup_seconds = 0.2, ttft_ms = 5, instance_drift = 0.15, jitter = 0.01"
    pytester.makefile(".toml", pyproject="".join([
        profile_toml("main", mark, sim=f"decode_tok_s = 400, {knobs}"),
        profile_toml("twin", mark, sim=f"decode_tok_s = 400, {knobs}"),
        profile_toml("slow", mark, sim=f"decode_tok_s = 150, {knobs}")]))
    pytester.makepyfile(test_ab=AA_TESTS)
    base = ["-p", "no:cacheprovider", "--sglang-sim", "-s", "--sglang-profile=main,twin,slow"]
    monkeypatch.setenv("PYTEST_SGLANG_SIM_SEED", "11")  # both runs: the same two instances' factors
    recorded = pytester.runpytest_subprocess(*base, "--sglang-update-baseline", "-k", "test_aa", timeout=120)
    recorded.assert_outcomes(passed=1)
    recorded.stdout.fnmatch_lines(["SAME_SERVER True"])
    path = pytester.path / ".sglang-baselines.json"
    data = json.loads(path.read_text())
    ((machine, workloads),) = data["instance_noise"].items()
    key = "concurrency=8 input_len=16 num_requests=8 output_len=24 rounds=6"
    first = workloads[key]["output_throughput"]
    assert len(first) == 1 and math.isfinite(first[0])
    # Four earlier nights of A/A runs on this machine, one of each sign: the noise is known from here on.
    workloads[key] = {m: [v[0], 0.12, -0.1, 0.08, -0.14] for m, v in workloads[key].items()}
    path.write_text(json.dumps(data))
    checked = pytester.runpytest_subprocess(*base, timeout=120)
    checked.assert_outcomes(passed=1, failed=1)
    checked.stdout.fnmatch_lines([
        "AA twin output_throughput *x main (*instance noise: CV *% over 5 A/A runs, an unchanged pair *; "
        "tolerance 5%)*",
        "*slow output_throughput 0.[2-5]?x main (*instance noise: CV *% over 5 A/A runs*; tolerance 5%) regressed*"])
    assert len(json.loads(path.read_text())["instance_noise"][machine][key]["output_throughput"]) == 5
