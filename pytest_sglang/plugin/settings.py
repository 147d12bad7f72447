"""The command-line options, the ini options beside some of them (one help text each, defined once, here) and
the one Settings object read from them: the command line wins over [tool.pytest.ini_options]."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Options a project may also set in its ini file (e.g. [tool.pytest.ini_options] sglang_profile = "base"); each
# ini name is the option's dest. Path values in the ini file are relative to that file.
INI_OPTIONS = ("sglang_profile", "sglang_baseline", "sglang_report", "sglang_log_dir", "sglang_max_cv",
               "sglang_confidence", "sglang_not_judged", "sglang_history")
NOT_JUDGED_CHOICES = ("warn", "fail")
INI_PATHS = ("sglang_baseline", "sglang_report", "sglang_log_dir", "sglang_history")

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
    ("--sglang-not-judged", dict(
        default=None, choices=NOT_JUDGED_CHOICES,
        help="What a check that could not judge does to its test (A/B, baseline): warn (default: it passes "
             "with a NotJudgedWarning and shows as NOT JUDGED in the summary, the report and junit's sglang_gate, "
             "as a neutral check does not block a pull request) or fail (a strict gate: the test fails with what "
             "would decide it). A certain regression always fails.")),
    ("--sglang-confidence", dict(
        default=None, metavar="PCT",
        help="Default for every baseline check that sets no confidence of its own: how sure a regression "
             "must be before it fails (at least 50%% and below 100%%, e.g. 99.9%%; default 95%%).")),
    ("--sglang-report", dict(
        default=None, metavar="PATH",
        help="Write a JSON report of every profile's startup and benchmark figures to PATH (schema: "
             "docs/report-schema.md), and an HTML page with a tok/s chart next to it (PATH with .html).")),
    ("--sglang-history", dict(
        default=None, metavar="PATH",
        help="Append this run's figures (per profile, test, machine and workload: every round, the commit, the "
             "time, the outcome) to the SQLite run history at PATH, created if missing, and find the steps in "
             "its series (`python -m pytest_sglang.history PATH` prints them). Nothing is written without it.")),
)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("sglang", "LLM inference servers (pytest-sglang)")
    for name, kwargs in OPTIONS:
        group.addoption(name, **kwargs)
        dest = name.lstrip("-").replace("-", "_")
        if dest in INI_OPTIONS:
            parser.addini(dest, help=kwargs["help"].replace("%%", "%"), default="")
    parser.addini("sglang_require_profile", type="bool", default=False,
                  help="Make a run whose server tests would all skip (no --sglang-profile or --sglang-url given) a "
                       "usage error instead of a green run that tested nothing.")


def origin_of(config: pytest.Config, dest: str) -> str:
    """Who gave an option's value, as a message names it: ``--sglang-max-cv`` or ``ini option sglang_max_cv``."""
    if config.getoption(dest) not in (None, []) or dest not in INI_OPTIONS:
        return "--" + dest.replace("_", "-")
    return f"ini option {dest}"


def _option_or_ini(config: pytest.Config, dest: str) -> Any:
    """The command line's value; else the ini file's (a path made absolute from the ini file's folder)."""
    given = config.getoption(dest)
    if given not in (None, []):
        return given
    value = str(config.getini(dest)).strip()
    if not value:
        return given
    if dest in INI_PATHS:
        return str((config.inipath.parent if config.inipath else config.rootpath) / value)
    return [value] if dest == "sglang_profile" else value


def sim_without_profile(defined: list[str]) -> str:
    if defined:
        return ("--sglang-sim runs a profile's server on the simulator, but no --sglang-profile was given: pass "
                f"--sglang-profile=NAME (defined: {', '.join(defined)}).")
    return ("--sglang-sim runs a profile's server on the simulator, but no profiles are defined: add "
            "[tool.pytest_sglang.profiles.NAME] to pyproject.toml in the rootdir (or pass --sglang-config=FILE with "
            "[profiles.NAME] tables), then pass --sglang-profile=NAME.")


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
    fail_not_judged: bool = False  # --sglang-not-judged=fail
    not_judged_option: str | None = None  # as given (the command line's, else the ini file's)
    empty_profile_option: bool = False  # --sglang-profile was given but names nothing (e.g. an unset CI variable)
    history_path: Path | None = None  # --sglang-history: the run history store
    empty_history_option: bool = False  # --sglang-history= was given empty (an unset CI variable)
    origins: dict[str, str] = field(default_factory=dict)  # option dest -> who gave it (origin_of)
    show: bool = False  # --sglang-show
    require_profile: bool = False  # ini sglang_require_profile
    stop: bool = False  # --sglang-stop

    @classmethod
    def from_config(cls, config: pytest.Config) -> Settings:
        opt = config.getoption
        given = _option_or_ini(config, "sglang_profile")
        raw = [n.strip() for value in given for n in value.split(",") if n.strip()]
        config_path, baseline = opt("sglang_config"), _option_or_ini(config, "sglang_baseline")
        return cls(
            rootdir=config.rootpath,
            profiles=tuple(dict.fromkeys(raw)),
            sim=opt("sglang_sim"),
            url=opt("sglang_url"),
            startup_timeout=opt("sglang_startup_timeout"),
            log_dir_option=_option_or_ini(config, "sglang_log_dir"),
            config_path=Path(config_path).resolve() if config_path else None,
            reuse=opt("sglang_reuse"),
            concurrent_profiles=opt("sglang_concurrent_profiles"),
            distributed=getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"),
            baseline_path=Path(baseline).resolve() if baseline else None,
            update_baseline=opt("sglang_update_baseline"),
            baseline_strict=opt("sglang_baseline_strict"),
            report_path=_option_or_ini(config, "sglang_report"),
            history_path=Path(history).resolve() if (history := _option_or_ini(config, "sglang_history")) else None,
            gate_defaults={name: value for name, value in (("max_cv", _option_or_ini(config, "sglang_max_cv")),
                                                           ("confidence", _option_or_ini(config, "sglang_confidence")))
                           if value is not None},
            empty_profile_option=bool(given) and not raw,
            empty_history_option=opt("sglang_history") is not None and not str(opt("sglang_history")).strip(),
            origins={dest: origin_of(config, dest) for dest in INI_OPTIONS},
            show=opt("sglang_show"),
            require_profile=bool(config.getini("sglang_require_profile")),
            stop=opt("sglang_stop"),
            fail_not_judged=_option_or_ini(config, "sglang_not_judged") == "fail",
            not_judged_option=_option_or_ini(config, "sglang_not_judged"),
        )

    def usage_problem(self) -> str | None:
        """An option, or a combination of options, that cannot work, said as what to do instead."""
        if self.empty_profile_option:
            return ("--sglang-profile was given but names no profile (an unset CI variable, e.g. "
                    "--sglang-profile=$PROFILE?): every server test would be skipped and the run pass having tested "
                    "nothing. Pass --sglang-profile=NAME, or leave the option out.")
        if self.empty_history_option:
            return ("--sglang-history was given but names no file (an unset CI variable, e.g. "
                    "--sglang-history=$HISTORY?): this run's figures would be recorded nowhere. Pass "
                    "--sglang-history=PATH, or leave the option out.")
        if self.startup_timeout is not None and not 0 < self.startup_timeout < float("inf"):
            return (f"--sglang-startup-timeout={self.startup_timeout:g} is not a number of seconds above 0: pass "
                    "e.g. --sglang-startup-timeout=600, or leave it out for each profile's startup_timeout.")
        if self.url:
            from pytest_sglang.errors import ProfileError
            from pytest_sglang.server.url import server_root

            try:
                server_root(self.url)
            except ProfileError as exc:
                return str(exc)
        if self.url and len(self.profiles) > 1:
            return (f"--sglang-url names one running server, but {len(self.profiles)} profiles were selected "
                    f"({', '.join(self.profiles)}): every test would run once per profile against that same "
                    "server. Pass at most one --sglang-profile with --sglang-url.")
        if self.url and self.reuse:
            return "--sglang-reuse keeps servers this run launches; with --sglang-url nothing is launched."
        for name, value in self.gate_defaults.items():
            from pytest_sglang.baseline.checks import gate_options
            from pytest_sglang.errors import BaselineError

            try:
                gate_options({name: value})
            except BaselineError as exc:
                return f"{self.origins.get('sglang_' + name, '--sglang-' + name.replace('_', '-'))}: {exc}"
        conflict = self.conflict()
        if conflict:
            return conflict
        if self.not_judged_option is not None and self.not_judged_option not in NOT_JUDGED_CHOICES:
            return (f"sglang_not_judged = {self.not_judged_option!r} is not one of {', '.join(NOT_JUDGED_CHOICES)}: "
                    "set it to warn (a check that could not judge passes with a warning) or fail.")
        if self.distributed and self.reuse:
            return ("--sglang-reuse does not work with pytest-xdist yet: under -n the controller stops the shared "
                    "servers at the end. Drop one of them (a shared server already launches once per run).")
        from pytest_sglang.envknobs import env_knobs
        from pytest_sglang.errors import EnvKnobError

        try:
            env_knobs()
        except EnvKnobError as exc:
            return str(exc)
        return None

    def conflict(self) -> str | None:
        """Two options that cannot both be meant: say which wins nothing and what to pass."""
        if self.url and self.sim:
            return (f"--sglang-url attaches to the server running at {self.url}, --sglang-sim launches the simulator "
                    "instead of a server: pass one of them (the simulator: drop --sglang-url).")
        if self.show and self.stop:
            return ("--sglang-show prints the profiles without launching, --sglang-stop stops kept servers: run them "
                    "one at a time.")
        strict = [name for name, on in (("--sglang-baseline-strict", self.baseline_strict),
                                        (self.origins.get("sglang_not_judged", "--sglang-not-judged") + "=fail",
                                         self.fail_not_judged)) if on]
        if self.update_baseline and strict:
            return (f"--sglang-update-baseline records figures instead of comparing them, so {strict[0]} (which "
                    "fails comparisons that could not judge) would do nothing: drop one of them.")
        return None

    def make_log_dir(self) -> Path:
        """--sglang-log-dir, or a new private folder under the temp dir (old ones pruned: launch/logdir.py)."""
        from pytest_sglang.launch.logdir import auto_log_dir, private_dir

        return private_dir(Path(self.log_dir_option).resolve()) if self.log_dir_option else auto_log_dir()
