"""What a session asks of pytest-sglang, read once: the Settings a Harness runs by, whoever made them (the plugin
from its options, a script by hand). Knows nothing about pytest."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

NOT_JUDGED_CHOICES = ("warn", "fail")


def sim_without_profile(defined: list[str]) -> str:
    if defined:
        return ("--sglang-sim runs a profile's server on the simulator, but no --sglang-profile was given: pass "
                f"--sglang-profile=NAME (defined: {', '.join(defined)}).")
    return ("--sglang-sim runs a profile's server on the simulator, but no profiles are defined: add "
            "[tool.pytest_sglang.profiles.NAME] to pyproject.toml in the rootdir (or pass --sglang-config=FILE with "
            "[profiles.NAME] tables), then pass --sglang-profile=NAME.")


@dataclass(frozen=True)
class Settings:
    """What a session asked of pytest-sglang: the plugin's options, or a script's keywords (each has the
    default a bare ``pytest`` run gets)."""

    rootdir: Path = field(default_factory=Path.cwd)
    profiles: tuple[str, ...] = ()
    sim: bool = False
    url: str | None = None
    startup_timeout: float | None = None
    log_dir_option: str | None = None
    config_path: Path | None = None
    reuse: bool = False
    concurrent_profiles: bool = False
    distributed: bool = False  # this is the controller of a pytest-xdist run
    baseline_path: Path | None = None
    update_baseline: bool = False
    baseline_strict: bool = False
    report_path: str | None = None
    gate_defaults: dict[str, str] = field(default_factory=dict)  # --sglang-max-cv, --sglang-confidence
    fail_not_judged: bool = False  # --sglang-not-judged=fail
    not_judged_option: str | None = None  # as given (the command line's, else the ini file's)
    empty_profile_option: bool = False  # --sglang-profile was given but names nothing (e.g. an unset CI variable)
    history_path: Path | None = None  # --sglang-history: the run history store
    empty_history_option: bool = False  # --sglang-history= was given empty (an unset CI variable)
    origins: dict[str, str] = field(default_factory=dict)  # option dest -> who gave it (origin_of)
    show: bool = False  # --sglang-show
    require_profile: bool = False  # ini sglang_require_profile
    stop: bool = False  # --sglang-stop

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
