"""How fast the simulated host is right now: one speed factor per pytest run, one per server instance, and a
slow wander within the run.

A real GPU host differs from session to session (docs/gpu.md measured fresh sessions of one server up to 2x
apart) and drifts within one. Two knobs reproduce that on top of ``decode_tok_s``:

- ``session_drift`` (a CV): one lognormal factor per pytest run, median 1, its log's standard deviation
  ``sqrt(ln(1 + cv^2))``, so the factors of many runs have about that CV.
- ``wander`` (per minute): a random walk on log speed in wall-clock time, from the run's start, its
  standard deviation ``wander`` after one minute and ``wander * sqrt(t)`` after t minutes; knots every
  WANDER_STEP_S seconds, linear between them, so the speed moves smoothly, never in jumps.

Both come from the run's seed and clock, the PYTEST_SGLANG_SIM_RUN variable (a JSON ``{"seed", "started"}``)
that the plugin draws once per pytest run (under pytest-xdist the controller draws it for every worker) and
hands to every simulator it launches: so all servers of one run share one factor and read one walk at the
same wall-clock moment (the two servers of an A/B job drift together, as two servers on one host do), while
runs differ. PYTEST_SGLANG_SIM_SEED, when set, is the seed: the same seed, the same factor and walk. A
simulator started without the variable (by hand) draws its own run. ``jitter`` (engine.py) stays per round.

``instance_drift`` (a CV) is what the H200 showed beside that (docs/gpu.md): two instances of one server on
one host each settle at a speed of their own and keep it. One lognormal factor per server instance, drawn from
the run's seed and the instance's name (PYTEST_SGLANG_SIM_INSTANCE, the profile name the plugin hands over):
the two servers of an A/A job then differ, reproducibly under one seed, while a within-job test sees only the
rounds' jitter and takes the difference for a change.
"""

from __future__ import annotations

import json
import math
import os
import random
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

RUN_ENV = "PYTEST_SGLANG_SIM_RUN"
SEED_ENV = "PYTEST_SGLANG_SIM_SEED"
INSTANCE_ENV = "PYTEST_SGLANG_SIM_INSTANCE"
WANDER_STEP_S = 5.0


class RunError(ValueError):
    pass


@dataclass(frozen=True)
class SimRun:
    """One pytest run as the simulators see it: the seed of its drift and its start (wall clock, seconds)."""

    seed: str
    started: float

    @classmethod
    def draw(cls, env: Mapping[str, str] = os.environ) -> SimRun:
        return cls(seed=env.get(SEED_ENV) or secrets.token_hex(8), started=time.time())

    def to_env(self) -> str:
        return json.dumps({"seed": self.seed, "started": self.started})

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> SimRun:
        """The run the plugin handed over, else (a simulator started by hand) a run of this process's own."""
        raw = env.get(RUN_ENV)
        if not raw:
            return cls.draw(env)
        try:
            data = json.loads(raw)
            return cls(seed=str(data["seed"]), started=float(data["started"]))
        except (ValueError, TypeError, KeyError) as exc:
            raise RunError(f"{RUN_ENV} must be a JSON object with a seed and a start time (the plugin sets it; "
                           f"unset it to run the simulator by hand), got {raw!r}: {exc}") from None


def lognormal_factor(stream: str, cv: float) -> float:
    """A speed multiplier: lognormal, median 1, that CV; the same stream gives the same factor."""
    if not cv:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(random.Random(stream).gauss(0.0, sigma))


def session_factor(seed: str, cv: float) -> float:
    """The run's speed multiplier, shared by every server of the run."""
    return lognormal_factor(f"{seed}:session_drift", cv)


def instance_factor(seed: str, instance: str, cv: float) -> float:
    """One server instance's own speed multiplier within the run."""
    return lognormal_factor(f"{seed}:instance_drift:{instance}", cv)


class Wander:
    """The run's random walk on log speed, read at wall-clock times; thread-safe (requests call it at once)."""

    def __init__(self, seed: str, per_minute: float, started: float) -> None:
        self.per_minute = per_minute
        self.started = started
        self._step_sigma = per_minute * math.sqrt(WANDER_STEP_S / 60.0)
        self._rng = random.Random(f"{seed}:wander")
        self._knots = [0.0]
        self._lock = threading.Lock()

    def factor(self, now: float | None = None) -> float:
        if not self.per_minute:
            return 1.0
        at = max(0.0, (time.time() if now is None else now) - self.started) / WANDER_STEP_S
        k = int(at)
        with self._lock:
            while len(self._knots) <= k + 1:
                self._knots.append(self._knots[-1] + self._rng.gauss(0.0, self._step_sigma))
            lo, hi = self._knots[k], self._knots[k + 1]
        return math.exp(lo + (at - k) * (hi - lo))


class HostSpeed:
    """One server's speed multiplier at a moment: the run's factor times the instance's times the wander there."""

    def __init__(self, run: SimRun, session_drift: float, wander: float, instance_drift: float = 0.0,
                 instance: str | None = None) -> None:
        self.run = run
        self.session = session_factor(run.seed, session_drift)
        self.instance = instance_factor(run.seed, instance or secrets.token_hex(8), instance_drift)
        self.wander = Wander(run.seed, wander, run.started)

    def factor(self, now: float | None = None) -> float:
        return self.session * self.instance * self.wander.factor(now)

    @property
    def drifts(self) -> bool:
        return self.session != 1.0 or self.instance != 1.0 or bool(self.wander.per_minute)
