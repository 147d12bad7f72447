"""The command-line options, the ini options beside some of them (one help text each, defined once, here) and
the one Settings object (pytest_sglang.harness.settings) read from them: the command line wins over
[tool.pytest.ini_options]."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_sglang.harness.settings import NOT_JUDGED_CHOICES, Settings

# Options a project may also set in its ini file (e.g. [tool.pytest.ini_options] sglang_profile = "base"); each
# ini name is the option's dest. Path values in the ini file are relative to that file.
INI_OPTIONS = ("sglang_profile", "sglang_baseline", "sglang_report", "sglang_log_dir", "sglang_max_cv",
               "sglang_confidence", "sglang_not_judged", "sglang_history")
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


def settings_of(config: pytest.Config) -> Settings:
    """The session's Settings: each option from the command line, else the ini file."""
    opt = config.getoption
    given = _option_or_ini(config, "sglang_profile")
    raw = [n.strip() for value in given for n in value.split(",") if n.strip()]
    config_path, baseline = opt("sglang_config"), _option_or_ini(config, "sglang_baseline")
    return Settings(
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

