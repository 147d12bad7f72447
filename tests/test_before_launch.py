"""What can be told before a 10-minute GPU startup is told before it: a baseline file that cannot be read, or
written under --sglang-update-baseline; options that contradict each other; an ini option's mistake blamed on
the ini option; and a run whose server tests would all skip."""

from __future__ import annotations

import os
import stat

import pytest
from helpers import profile_toml

SERVER_TEST = "def test_server(sglang_server):\n    assert sglang_server.base_url\n"


def _project(pytester: pytest.Pytester, mark: str, ini: str = "") -> None:
    pytester.makefile(".toml", pyproject=f"[tool.pytest.ini_options]\n{ini}\n" + profile_toml("p", mark))
    pytester.makepyfile(test_user=SERVER_TEST)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def _refused(result: pytest.RunResult, message: str) -> None:
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "launching" not in result.stdout.str(), "no server may launch before the mistake is told"


def test_a_broken_baseline_file_stops_the_run_before_any_server_launches(pytester: pytest.Pytester,
                                                                         mark: str) -> None:
    _project(pytester, mark)
    broken = pytester.path / ".sglang-baselines.json"
    broken.write_text('{"format": "pytest-sglang-baselines", "version": 3, "baselines": {')
    before = broken.read_bytes()
    _refused(_run(pytester, "--sglang-profile=p", "--sglang-sim"),
             f"*baseline file {broken} is broken: invalid JSON at line 1*--sglang-update-baseline*")
    assert broken.read_bytes() == before


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_read_only_baseline_with_update_stops_the_run_before_any_server_launches(
        pytester: pytest.Pytester, mark: str, what: str) -> None:
    _project(pytester, mark)
    folder = pytester.path / "baselines"
    folder.mkdir()
    target = folder / "b.json"
    if what == "file":
        target.write_text('{"format": "pytest-sglang-baselines", "version": 3, "baselines": {}}\n')
        target.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        message = f"*baseline file {target} is read-only, so --sglang-update-baseline could not record*"
    else:
        folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
        message = f"*baseline file {target} cannot be written: its folder {folder} is read-only*"
    try:
        _refused(_run(pytester, "--sglang-profile=p", "--sglang-sim", f"--sglang-baseline={target}",
                      "--sglang-update-baseline"), message)
        assert os.listdir(folder) == (["b.json"] if what == "file" else [])
        # without --sglang-update-baseline nothing is written, so a read-only baseline is fine
        assert _run(pytester, "--sglang-profile=p", "--sglang-sim", f"--sglang-baseline={target}").ret == 0
    finally:
        folder.chmod(stat.S_IRWXU)
        if target.exists():
            target.chmod(stat.S_IRUSR | stat.S_IWUSR)


@pytest.mark.parametrize(("args", "message"), [
    (["--sglang-url=http://127.0.0.1:9", "--sglang-sim", "--sglang-profile=p"],
     "*--sglang-url attaches to the server running at http://127.0.0.1:9, --sglang-sim launches the simulator*"),
    (["--sglang-show", "--sglang-stop"], "*--sglang-show prints the profiles without launching, --sglang-stop*"),
    (["--sglang-update-baseline", "--sglang-baseline-strict"],
     "*--sglang-update-baseline records figures instead of comparing them, so --sglang-baseline-strict*"),
    (["--sglang-update-baseline", "--sglang-not-judged=fail"],
     "*--sglang-update-baseline records figures instead of comparing them, so --sglang-not-judged=fail*"),
], ids=["url-and-sim", "show-and-stop", "update-and-strict", "update-and-not-judged-fail"])
def test_contradicting_options_are_a_usage_error(pytester: pytest.Pytester, mark: str, args: list[str],
                                                 message: str) -> None:
    _project(pytester, mark)
    _refused(_run(pytester, *args), message)


def test_an_ini_mistake_is_blamed_on_the_ini_option(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, mark, ini='sglang_profile = "nope"')
    _refused(_run(pytester), "*Unknown profile 'nope' (from ini option sglang_profile)*")
    _project(pytester, mark, ini='sglang_confidence = "100%"')
    _refused(_run(pytester), "*ini option sglang_confidence: confidence must be at least 50% and below 100%*")
    help_text = _run(pytester, "--help").stdout.str()
    assert "at least 50% and below 100%" in " ".join(help_text.split())


def test_a_run_whose_server_tests_would_all_skip_says_so_or_stops(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, mark)
    result = _run(pytester)
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*[[]sglang[]] 1 server test(s) skipped: no --sglang-profile or --sglang-url was "
                                 "given (ini sglang_require_profile = true makes that an error)*"])
    _project(pytester, mark, ini="sglang_require_profile = true")
    _refused(_run(pytester), "*1 test(s) need a server, but no --sglang-profile (or --sglang-url) was given*")
    assert _run(pytester, "--sglang-profile=p", "--sglang-sim").ret == 0


FIVE_MISTAKES = """
[tool.pytest_sglang.profiles.a]
modle = "m"
startup_timeout = -1
[tool.pytest_sglang.profiles.b]
extends = "nope"
stall_timout = 5
[tool.pytest_sglang.profiles.c]
port = 70000
"""


def test_every_profile_mistake_is_told_in_one_run_and_an_unselected_one_blocks_nothing(
        pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=FIVE_MISTAKES + profile_toml("good", mark))
    pytester.makepyfile(test_user=SERVER_TEST)
    result = _run(pytester, "--sglang-profile=a", "--sglang-sim")
    _refused(result, "*pyproject.toml: 5 mistakes in 3 profiles:*")
    text = " ".join(result.stderr.str().split())
    for needle in ("profile 'a', key 'modle': unknown key. Did you mean 'model'?", "key 'startup_timeout'",
                   "extends unknown profile 'nope'", "profile 'b', key 'stall_timout': unknown key",
                   "profile 'c', key 'port'"):
        assert needle in text
    fine = _run(pytester, "--sglang-profile=good", "--sglang-sim")
    fine.assert_outcomes(passed=1)
    fine.stdout.fnmatch_lines(["*warning: profile 'a' is broken and was not selected, so this run goes on without "
                               "it: *unknown key*"])


def test_under_the_simulator_what_the_real_launch_would_miss_is_said(pytester: pytest.Pytester, mark: str) -> None:
    """The simulator uses no model or interpreter; a user developing on it hears of a missing one now."""
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, body='python = "/no/such/venv/bin/python"'))
    pytester.makepyfile(test_user=SERVER_TEST)
    result = _run(pytester, "--sglang-profile=p", "--sglang-sim")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*warning: without --sglang-sim this launch would fail: *python /no/such/venv/bin/"
                                 "python does not exist*"])
    shown = _run(pytester, "--sglang-profile=p", "--sglang-sim", "--sglang-show")
    shown.stdout.fnmatch_lines(["*warning*without --sglang-sim: *python /no/such/venv/bin/python does not exist*"])
