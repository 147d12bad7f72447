"""The command-line options, their help texts (defined once, here) and the one Settings object read from them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

OPTIONS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("--sglang-profile", dict(
        action="append", default=[], metavar="NAME",
        help="Server profile to run the server tests against; repeat or comma-separate for several (one "
             "server alive at a time). Profiles: [tool.pytest_sglang.profiles.NAME] in pyproject.toml.")),
    ("--sglang-sim", dict(
        action="store_true", default=False,
        help="Launch the bundled SGLang simulator instead of the real server, with the same profile, flags "
             "and the profile's `sim` knobs: the whole flow without a GPU.")),
    ("--sglang-url", dict(
        default=None, metavar="URL",
        help="Test a server that is already running at URL (its root, e.g. http://127.0.0.1:30000): its "
             "health is checked, nothing is launched or killed. With one --sglang-profile the profile names it "
             "(and gives its --api-key).")),
    ("--sglang-startup-timeout", dict(
        type=float, default=None, metavar="S",
        help="Seconds to wait for readiness; overrides every profile's startup_timeout (default 1800).")),
    ("--sglang-log-dir", dict(
        default=None, metavar="DIR",
        help="Where server logs are written, one PROFILE.log each; kept after the run and shown on failure "
             "(default: a new folder under the system temp dir).")),
    ("--sglang-config", dict(
        default=None, metavar="PATH",
        help="TOML file of profiles as [profiles.NAME] tables, instead of pyproject.toml's "
             "[tool.pytest_sglang.profiles.NAME].")),
    ("--sglang-reuse", dict(
        action="store_true", default=False,
        help="Keep the server running after the session and attach to it next run while its profile is "
             "unchanged (saves the startup while iterating on tests). Stop kept servers with --sglang-stop.")),
    ("--sglang-stop", dict(
        action="store_true", default=False,
        help="Stop every server that --sglang-reuse kept for this rootdir, then exit without running tests.")),
    ("--sglang-show", dict(
        action="store_true", default=False,
        help="Print each selected profile (all, if none is selected) as it would run: kind, the exact command, "
             "the profile's environment, sim knobs, readiness rules and timeouts, secrets redacted; then exit "
             "without launching anything.")),
    ("--sglang-concurrent-profiles", dict(
        action="store_true", default=False,
        help="Under pytest-xdist, let servers of different profiles run at once (each worker's profile); by "
             "default a worker that needs another profile waits until no worker uses the running one.")),
    ("--sglang-baseline", dict(
        default=None, metavar="PATH",
        help="Baseline file that sglang_baseline.check() compares with (default: .sglang-baselines.json in the "
             "rootdir; commit it). Keyed by profile, test id and machine (GPUs, driver, server version).")),
    ("--sglang-update-baseline", dict(
        action="store_true", default=False,
        help="Record this run's checked figures in the baseline file instead of comparing (safe under "
             "pytest-xdist: a file lock and an atomic rename).")),
    ("--sglang-baseline-strict", dict(
        action="store_true", default=False,
        help="Fail a check that has no baseline for this profile, test and machine (default: pass with a note).")),
    ("--sglang-max-cv", dict(
        default=None, metavar="PCT",
        help="Default for every baseline check that sets no max_cv of its own: rounds spread more than this "
             "(CV, e.g. 15%%, or off) are not judged (default 10%%). A noisy GPU runner raises it here, "
             "not in each test.")),
    ("--sglang-confidence", dict(
        default=None, metavar="PCT",
        help="Default for every baseline check that sets no confidence of its own: how sure a regression "
             "must be before it fails (50%% to 99.9%%, default 95%%).")),
    ("--sglang-report", dict(
        default=None, metavar="PATH",
        help="Write a JSON report of every profile's startup and benchmark figures to PATH (schema: "
             "docs/report-schema.md), and an HTML page with a tok/s chart next to it (PATH with .html).")),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang", "LLM inference servers (pytest-sglang)")
    for name, kwargs in OPTIONS:
        group.addoption(name, **kwargs)


@dataclass(frozen=True)
class Settings:
    """What the command line asked of pytest-sglang, read once."""

    rootdir: Path
    profiles: tuple[str, ...]
    sim: bool
    url: str | None
    startup_timeout: float | None
    log_dir_option: str | None
    config_path: Path | None
    reuse: bool
    concurrent_profiles: bool
    distributed: bool  # this is the controller of a pytest-xdist run
    baseline_path: Path | None
    update_baseline: bool
    baseline_strict: bool
    report_path: str | None
    gate_defaults: dict[str, str]  # --sglang-max-cv, --sglang-confidence: under each check's own

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        opt = config.getoption
        raw = [n.strip() for value in opt("sglang_profile") for n in value.split(",") if n.strip()]
        config_path, baseline = opt("sglang_config"), opt("sglang_baseline")
        return cls(
            rootdir=config.rootpath,
            profiles=tuple(dict.fromkeys(raw)),
            sim=opt("sglang_sim"),
            url=opt("sglang_url"),
            startup_timeout=opt("sglang_startup_timeout"),
            log_dir_option=opt("sglang_log_dir"),
            config_path=Path(config_path).resolve() if config_path else None,
            reuse=opt("sglang_reuse"),
            concurrent_profiles=opt("sglang_concurrent_profiles"),
            distributed=getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"),
            baseline_path=Path(baseline).resolve() if baseline else None,
            update_baseline=opt("sglang_update_baseline"),
            baseline_strict=opt("sglang_baseline_strict"),
            report_path=opt("sglang_report"),
            gate_defaults={name: value for name, value in (("max_cv", opt("sglang_max_cv")),
                                                           ("confidence", opt("sglang_confidence")))
                           if value is not None},
        )

    def usage_problem(self) -> str | None:
        """A combination of options that cannot work, said as what to do instead."""
        if self.url and len(self.profiles) > 1:
            return (f"--sglang-url names one running server, but {len(self.profiles)} profiles were selected "
                    f"({', '.join(self.profiles)}): every test would run once per profile against that same "
                    "server. Pass at most one --sglang-profile with --sglang-url.")
        if self.url and self.reuse:
            return "--sglang-reuse keeps servers this run launches; with --sglang-url nothing is launched."
        if self.gate_defaults:
            from pytest_sglang.baseline.checks import gate_options
            from pytest_sglang.errors import BaselineError

            try:
                gate_options(self.gate_defaults)
            except BaselineError as exc:
                return f"--sglang-max-cv / --sglang-confidence: {exc}"
        if self.distributed and self.reuse:
            return ("--sglang-reuse does not work with pytest-xdist yet: under -n the controller stops the shared "
                    "servers at the end. Drop one of them (a shared server already launches once per run).")
        return None

    def make_log_dir(self) -> Path:
        """--sglang-log-dir, or a new private folder under the temp dir (old ones pruned: launch/logdir.py)."""
        from pytest_sglang.launch.logdir import auto_log_dir, private_dir

        return private_dir(Path(self.log_dir_option).resolve()) if self.log_dir_option else auto_log_dir()
