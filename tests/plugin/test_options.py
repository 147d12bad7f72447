"""Options as pytest's conventions have them: a bad value is a usage error at the start, saying what to do; the
ini options beside the command-line ones share their help texts, and the command line wins."""

from __future__ import annotations

import json

import pytest
from helpers import profile_toml

PLAIN_TEST = "def test_plain():\n    assert True\n"
SERVER_TEST = "def test_server(sglang_server):\n    assert sglang_server.base_url\n"


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def _project(pytester: pytest.Pytester, profiles: str = "", ini: str = "", tests: str = SERVER_TEST) -> None:
    pytester.makefile(".toml", pyproject=f"[tool.pytest.ini_options]\n{ini}\n{profiles}")
    pytester.makepyfile(test_user=tests)


@pytest.mark.parametrize(("args", "message"), [
    (["--sglang-startup-timeout=0"], "*--sglang-startup-timeout=0 is not a number of seconds above 0: pass e.g. "
                                     "--sglang-startup-timeout=600*"),
    (["--sglang-startup-timeout=-1"], "*--sglang-startup-timeout=-1 is not a number of seconds above 0*"),
    (["--sglang-profile="], "*--sglang-profile was given but names no profile (an unset CI variable*"),
    (["--sglang-profile=, ,"], "*--sglang-profile was given but names no profile*"),
    (["--sglang-url=notaurl"], "*--sglang-url='notaurl' is not an http(s) URL such as http://127.0.0.1:30000*"),
    (["--sglang-url=http://127.0.0.1:30000/v1"], "*has a path (/v1): give the server's root, "
                                                 "--sglang-url=http://127.0.0.1:30000;*"),
    (["--sglang-sim"], "*--sglang-sim runs a profile's server on the simulator, but no profiles are defined: add "
                       "[[]tool.pytest_sglang.profiles.NAME[]]*"),
], ids=["timeout-0", "timeout-negative", "empty-profile", "only-commas", "not-a-url", "url-path", "sim-no-profiles"])
def test_a_bad_option_is_a_usage_error_at_the_start(pytester: pytest.Pytester, args: list[str],
                                                    message: str) -> None:
    _project(pytester)
    result = _run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    result.stdout.no_fnmatch_line("*test_server*")


def test_sim_without_a_selected_profile_names_the_defined_ones(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, profile_toml("a", mark) + profile_toml("b", mark))
    result = _run(pytester, "--sglang-sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*but no --sglang-profile was given: pass --sglang-profile=NAME (defined: a, b)*"])


@pytest.mark.parametrize(("name", "value", "message"), [
    ("PYTEST_SGLANG_RELEASE_TIMEOUT", "soon", "*PYTEST_SGLANG_RELEASE_TIMEOUT='soon' is not a number of seconds "
                                              "above 0, e.g. 120: set it to that, or unset it*"),
    ("PYTEST_SGLANG_SSH_HEARTBEAT_TIMEOUT", "0", "*PYTEST_SGLANG_SSH_HEARTBEAT_TIMEOUT='0' is not a number of "
                                                 "seconds above 0*"),
    ("PYTEST_SGLANG_GPU_QUERY", "cuda", "*PYTEST_SGLANG_GPU_QUERY='cuda' is not one of nvml, nvidia-smi, off*"),
], ids=["release-timeout", "heartbeat-timeout", "gpu-query"])
def test_a_bad_environment_knob_is_a_usage_error_at_the_start(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch, name: str,
                                                              value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    _project(pytester, tests=PLAIN_TEST)
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


def test_ini_options_share_the_command_line_help(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--help")
    text = " ".join(result.stdout.str().split())
    for ini in ("sglang_profile", "sglang_baseline", "sglang_report", "sglang_log_dir", "sglang_max_cv",
                "sglang_confidence"):
        assert f"{ini} (string):" in text, f"{ini} is not an ini option"
    assert text.count("Server profile to run the server tests against") == 2
    assert text.count("rounds spread more than this (CV, e.g. 15%, or off)") == 2


def test_ini_profile_and_log_dir_apply_and_the_command_line_wins(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, profile_toml("a", mark) + profile_toml("b", mark),
             ini='sglang_profile = "a"\nsglang_log_dir = "ini-logs"')
    from_ini = _run(pytester, "--sglang-show", "--sglang-sim")
    assert from_ini.ret == 0
    from_ini.stdout.fnmatch_lines(["*1 selected profile(s)*", "profile a", f"  log * {pytester.path}/ini-logs/a.log"])
    from_ini.stdout.no_fnmatch_line("profile b")
    given = _run(pytester, "--sglang-show", "--sglang-sim", "--sglang-profile=b", "--sglang-log-dir=cli-logs")
    given.stdout.fnmatch_lines(["profile b", f"  log * {pytester.path}/cli-logs/b.log"])
    given.stdout.no_fnmatch_line("profile a")


def test_ini_report_and_baseline_apply_and_the_command_line_wins(pytester: pytest.Pytester) -> None:
    baseline_probe = """
def test_baseline_file(request):
    plugin = request.config.pluginmanager.get_plugin("sglang-session")
    print("BASELINE", plugin.harness.measure.checker.store.path)
"""
    _project(pytester, ini='sglang_report = "out/ini.json"\nsglang_baseline = "perf/ini-baselines.json"',
             tests=baseline_probe)
    from_ini = _run(pytester, "-s")
    from_ini.assert_outcomes(passed=1)
    from_ini.stdout.fnmatch_lines([f"*BASELINE {pytester.path}/perf/ini-baselines.json"])
    assert json.loads((pytester.path / "out" / "ini.json").read_text())["profiles"] == {}
    given = _run(pytester, "-s", "--sglang-report=cli.json", "--sglang-baseline=cli-baselines.json")
    given.stdout.fnmatch_lines([f"*BASELINE {pytester.path}/cli-baselines.json"])
    assert (pytester.path / "cli.json").exists()
    assert (pytester.path / "out" / "ini.json").stat().st_mtime <= (pytester.path / "cli.json").stat().st_mtime


def test_ini_gate_defaults_are_checked_like_the_options(pytester: pytest.Pytester) -> None:
    _project(pytester, ini='sglang_max_cv = "lots"', tests=PLAIN_TEST)
    result = _run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*ini option sglang_max_cv: *lots*"])
    assert _run(pytester, "--sglang-max-cv=20%").ret == 0, "the command line wins over the ini file"
