"""The startup record: what one server's startup was, made once where readiness is decided.

One frozen record per startup, whatever its outcome (ready, failed, interrupted) and origin (launched here,
attached to with --sglang-url, reused from an earlier run, launched on an ssh host or across SLURM nodes, or
joined: launched by another pytest-xdist worker of the run). The handle, the terminal summary, the JSON report, junitxml
and the reuse store all read this one type; nothing copies its fields into another record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

Origin = Literal["launched", "attached", "reused", "ssh", "slurm", "joined"]
Outcome = Literal["ready", "failed", "interrupted"]


@dataclass(frozen=True)
class StartupRecord:
    profile: str
    kind: str  # "sglang", "vllm", "generic": whose rules applied
    origin: Origin
    outcome: Outcome
    host: str
    port: int
    model: str | None = None
    startup_seconds: float | None = None  # launch to ready; None when this run did not start it (attached)
    elapsed: float | None = None  # launch to the end of the wait, whatever its outcome
    phases: Mapping[str, float] = field(default_factory=dict)  # phase -> seconds since launch; "ready" last
    last_phase: str | None = None  # the phase the server was in when the wait ended (its words)
    log_path: Path | None = None
    pid: int | None = None
    error: str | None = None  # the whole diagnosis of a failed startup
    cause: str | None = None  # its one root-cause line, for one-line summaries
    died: str | None = None  # a ready server that died during the session: why, in one line

    @property
    def ready(self) -> bool:
        return self.outcome == "ready"

    @property
    def reason(self) -> str:
        """Why a startup did not end ready, in one line: its root cause, else its error's headline (a timeout, a
        stall, an unreachable URL have no root-cause line)."""
        headline = ((self.error or "").splitlines() or [""])[0].replace(f"[sglang {self.profile}] ", "")
        return self.cause or headline or self.outcome

    def dying(self, why: str, log_path: Path | None = None) -> StartupRecord:
        """This record, of a server that was ready and has died during the session (``log_path``: the log that
        tells, where it is not the record's own: a fleet member's)."""
        return replace(self, died=why, log_path=log_path or self.log_path)

    def reused(self) -> StartupRecord:
        """This record, as seen by a later run that attaches to the kept server."""
        return replace(self, origin="reused")

    def joined(self) -> StartupRecord:
        """This record, as another xdist worker of the run sees the server one worker launched."""
        return replace(self, origin="joined")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phases"] = dict(self.phases)
        data["log_path"] = str(self.log_path) if self.log_path else None
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StartupRecord:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        log_path = known.get("log_path")
        known["log_path"] = Path(log_path) if log_path else None
        known["phases"] = dict(known.get("phases") or {})
        return cls(**known)

    def summary(self) -> str:
        """One line for the terminal summary: what happened to this profile's server."""
        name = self.profile
        if self.outcome == "interrupted":
            where = f" (last phase: {self.last_phase})" if self.last_phase else ""
            return (f"{name}: INTERRUPTED during startup after {self.elapsed or 0.0:.1f} s{where}; the server's "
                    f"process tree was killed" + (f" (log: {self.log_path})" if self.log_path else ""))
        if self.outcome == "failed":
            return f"{name}: FAILED TO START: {self.reason}" + (f" (log: {self.log_path})" if self.log_path else "")
        if self.died is not None:
            started = f"ready in {self.startup_seconds:.1f} s, " if self.startup_seconds is not None else ""
            return f"{name}: {started}then DIED during the session: {self.died}" + (
                f" (log: {self.log_path})" if self.log_path else "")
        if self.origin == "attached":
            return f"{name}: attached to a running server at http://{self.host}:{self.port} (startup not measured)"
        if self.origin in ("reused", "joined"):
            whose = "reused the kept server" if self.origin == "reused" else "joined another xdist worker's server"
            return (f"{name}: {whose}, pid {self.pid} on port {self.port} (it started in "
                    f"{self.startup_seconds or 0.0:.1f} s)")
        steps = []
        previous_name, previous_at = "launch", 0.0
        for phase, at in sorted(self.phases.items(), key=lambda kv: kv[1]):
            steps.append(f"{previous_name} {at - previous_at:.1f}s")
            previous_name, previous_at = phase, at
        where = {"ssh": " over ssh", "slurm": " across SLURM nodes"}.get(self.origin, "")
        return f"{name}: ready{where} in {self.startup_seconds or 0.0:.1f} s  [" + " | ".join(steps) + "]"
