"""The simulator's host drift: one speed factor per pytest run shared by its servers (session_drift), a slow
wander within the run, both from the run's seed; measured on real simulator processes and real pytest runs."""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Callable

import pytest
from helpers import profile_toml
from simtools import Sim, sse_events

from pytest_sglang.sim.config import KnobError, load_knobs
from pytest_sglang.sim.drift import RUN_ENV, SEED_ENV, RunError, SimRun, Wander, session_factor

PACE = 100.0
FACTOR_LINE = re.compile(r"sim host speed: session factor (\d+\.\d+)")


def measured_pace(sim: Sim, tokens: int = 30) -> float:
    """Tokens per second between a streamed request's first and last token."""
    with sim.post("/generate", {"text": "q", "sampling_params": {"max_new_tokens": tokens}, "stream": True},
                  stream=True) as r:
        times = [t for t, d in sse_events(r) if d != "[DONE]"]
    return (len(times) - 1) / (times[-1] - times[0])


def run_env(seed: str, started: float | None = None) -> dict[str, str]:
    return {RUN_ENV: SimRun(seed, time.time() if started is None else started).to_env()}


@pytest.mark.parametrize("knob", ["session_drift", "wander"])
@pytest.mark.parametrize("bad", ["-0.1", '"0.1"', "true", "NaN", "Infinity"])
def test_drift_knobs_must_be_finite_numbers_at_least_zero(knob: str, bad: str) -> None:
    with pytest.raises(KnobError, match=knob):
        load_knobs(f'{{"{knob}": {bad}}}')


def test_drift_knobs_are_taken_as_given() -> None:
    knobs = load_knobs('{"session_drift": 0.3, "wander": 0.05, "jitter": 0.02}')
    assert (knobs.session_drift, knobs.wander, knobs.jitter) == (0.3, 0.05, 0.02)
    assert (load_knobs().session_drift, load_knobs().wander) == (0.0, 0.0)


def test_the_session_factor_is_lognormal_with_the_knobs_cv_and_fixed_by_the_seed() -> None:
    factors = [session_factor(str(seed), 0.15) for seed in range(4000)]
    assert statistics.median(factors) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(factors) / statistics.fmean(factors) == pytest.approx(0.15, abs=0.01)
    assert session_factor("7", 0.15) == session_factor("7", 0.15) != session_factor("8", 0.15)
    assert session_factor("7", 0.0) == 1.0


def test_wander_walks_smoothly_with_the_knobs_spread_per_minute_and_is_fixed_by_the_seed() -> None:
    after_a_minute = [math.log(Wander(str(seed), 0.05, 0.0).factor(60.0)) for seed in range(3000)]
    assert statistics.stdev(after_a_minute) == pytest.approx(0.05, rel=0.06)
    walk = Wander("w", 0.05, 1000.0)
    path = [walk.factor(1000.0 + 0.5 * i) for i in range(1200)]  # ten minutes, every half second
    assert path[0] == 1.0 and max(path) / min(path) > 1.03
    assert max(abs(math.log(b / a)) for a, b in zip(path, path[1:], strict=False)) < 0.01  # no jumps
    again = Wander("w", 0.05, 1000.0)
    assert [again.factor(1000.0 + 0.5 * i) for i in range(0, 1200, 7)] == path[::7]
    assert Wander("w", 0.0, 0.0).factor(1e6) == 1.0


def test_a_run_comes_from_the_plugin_or_is_drawn_from_the_seed_variable() -> None:
    run = SimRun("s1", 123.5)
    assert SimRun.from_env({RUN_ENV: run.to_env()}) == run
    assert SimRun.from_env({SEED_ENV: "42"}).seed == "42"
    assert SimRun.from_env({}).seed != SimRun.from_env({}).seed
    with pytest.raises(RunError, match=f"{RUN_ENV} must be a JSON object with a seed"):
        SimRun.from_env({RUN_ENV: '{"seed": 1}'})


def test_a_runs_factor_sets_the_pace_and_another_seed_gives_another(launch: Callable[..., Sim]) -> None:
    knobs = {"startup_seconds": 0.2, "decode_tok_s": PACE, "session_drift": 0.3}
    fast, slow = "e", "f"  # seeds whose factors at CV 0.3 are 1.57 and 0.72
    sims = {seed: launch(knobs, env=run_env(seed)) for seed in (fast, slow)}
    for seed, sim in sims.items():
        sim.wait_ready()
        assert f"session factor {session_factor(seed, 0.3):.4f}" in sim.text()
        # 120 tokens, a second or two: a loaded client's lag of tens of ms at either end stays a few %
        assert measured_pace(sim, tokens=120) == pytest.approx(PACE * session_factor(seed, 0.3), rel=0.1)


def test_wander_moves_the_pace_within_a_run(launch: Callable[..., Sim]) -> None:
    # Seed "c" with wander 3 per minute: the walk falls about 2x between 4 s and 8 s into the run; the run is
    # dated 3 s back so that its fall comes soon after the simulator is ready.
    knobs = {"startup_seconds": 0.2, "decode_tok_s": PACE, "wander": 3.0}
    started = time.time() - 3.0
    sim = launch(knobs, env=run_env("c", started))
    sim.wait_ready()
    walk = Wander("c", 3.0, started)
    seen = []
    for wait in (0.0, 3.0):
        time.sleep(wait)
        expected = PACE * walk.factor()
        seen.append((expected, measured_pace(sim)))
    (first, first_measured), (second, second_measured) = seen
    assert first / second > 1.3, seen
    assert first_measured == pytest.approx(first, rel=0.12) and second_measured == pytest.approx(second, rel=0.12)


PRINT_FACTOR = """
import json, os, re
def test_factor(sglang_server):
    line = re.search(r"session factor (\\S+)", open(sglang_server.log_path).read()).group(1)
    with open(os.environ["SEEN"], "a") as fh:
        fh.write(json.dumps([sglang_server.profile, float(line)]) + "\\n")
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_the_plugin_hands_every_server_of_a_run_one_factor(pytester: pytest.Pytester, mark: str, workers: list[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = pytester.path / "seen.jsonl"
    monkeypatch.setenv("SEEN", str(seen))
    sim = "startup_seconds = 0.3, session_drift = 0.3"
    pytester.makefile(".toml", pyproject=profile_toml("a", mark, sim=sim) + profile_toml("b", mark, sim=sim))
    pytester.makepyfile(test_factor=PRINT_FACTOR)

    def factors(*seed: str) -> dict[str, float]:
        seen.unlink(missing_ok=True)
        if seed:
            monkeypatch.setenv(SEED_ENV, seed[0])
        else:
            monkeypatch.delenv(SEED_ENV, raising=False)
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *workers, "--sglang-profile=a,b",
                                               "--sglang-sim", timeout=200)
        result.assert_outcomes(passed=2)
        return dict(json.loads(line) for line in seen.read_text().splitlines())

    seeded = factors("17")
    assert seeded == {"a": round(session_factor("17", 0.3), 4), "b": round(session_factor("17", 0.3), 4)}
    if not workers:
        drawn = factors()
        assert drawn["a"] == drawn["b"] != seeded["a"]
