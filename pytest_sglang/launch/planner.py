"""How one session plans its launches: the simulator or the real server, one log folder for all of them (made at
the first launch, never for a run that launches nothing), one startup timeout over every profile's, and one
simulator drift for the run. The server sources are handed a Planner, so nothing below the harness calls back up
into it; what each plan's fingerprint was is kept for the A/A test that two profiles run the same server."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_sglang.config import Profile
    from pytest_sglang.launch.fleet import FleetPlan
    from pytest_sglang.launch.plan import LaunchPlan


@dataclass
class Planner:
    sim: bool
    sim_run: str
    startup_timeout: float | None = None  # --sglang-startup-timeout: over every profile's own
    log_dir_option: str | None = None  # --sglang-log-dir; else a new private folder under the temp dir
    fingerprints: dict[str, str] = field(default_factory=dict)  # profile -> its last plan's server fingerprint
    _log_dir: Path | None = field(default=None, repr=False)

    def log_dir(self) -> Path:
        """The run's log folder (old automatic ones pruned: launch/logdir.py)."""
        if self._log_dir is None:
            from pytest_sglang.launch.logdir import auto_log_dir, private_dir

            self._log_dir = (private_dir(Path(self.log_dir_option).resolve()) if self.log_dir_option
                             else auto_log_dir())
        return self._log_dir

    def plan(self, profile: Profile) -> LaunchPlan:
        from pytest_sglang.launch.plan import plan_launch

        plan = plan_launch(profile, sim=self.sim, log_dir=self.log_dir(), startup_timeout=self.startup_timeout,
                           sim_run=self.sim_run)
        self.fingerprints[profile.name] = plan.server_fingerprint
        return plan

    def plan_fleet(self, profile: Profile) -> FleetPlan:
        from pytest_sglang.launch.fleet import plan_fleet

        plan = plan_fleet(profile, sim=self.sim, log_dir=self.log_dir(), startup_timeout=self.startup_timeout,
                          sim_run=self.sim_run)
        self.fingerprints[profile.name] = plan.fingerprint
        return plan
