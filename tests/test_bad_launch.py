"""A launch that cannot start: a missing interpreter or command binary is one error before launch, and any
startup failure, whatever raised it, is recorded so that the summary, the report and the gate say so."""

from __future__ import annotations

import json
import stat

import pytest
from helpers import marked_processes

pytestmark = pytest.mark.timeout(120)

PROFILES = """
[tool.pytest_sglang.profiles.py]
python = "/opt/nope/bin/python3"
env = { TEST_MARK = "%(mark)s" }

[tool.pytest_sglang.profiles.cmd]
command = ["/opt/nope/bin/server", "--port", "{port}"]
env = { TEST_MARK = "%(mark)s" }

[tool.pytest_sglang.profiles.bare]
command = ["no-such-server-on-path", "--port", "{port}"]
env = { TEST_MARK = "%(mark)s" }

[tool.pytest_sglang.profiles.noexec]
python = "./not-a-program"
env = { TEST_MARK = "%(mark)s" }
"""

TWO_TESTS = "def test_one(sglang_server):\n    pass\n\ndef test_two(sglang_server):\n    pass\n"


def _project(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=PROFILES % {"mark": mark})
    pytester.makepyfile(test_user=TWO_TESTS)
    program = pytester.path / "not-a-program"  # there and executable, but no program the kernel can run
    program.write_text("this is not a program\n")
    program.chmod(program.stat().st_mode | stat.S_IXUSR)


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=90)


def _report(pytester: pytest.Pytester) -> dict[str, object]:
    data = json.loads((pytester.path / "report.json").read_text())
    assert isinstance(data, dict)
    return data


def test_a_missing_binary_is_one_error_before_launch_and_the_report_says_the_server_could_not_start(
        pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, mark)
    result = _run(pytester, "--sglang-profile=py,cmd,bare", "--sglang-report=report.json")
    result.assert_outcomes(errors=6)
    out = result.stdout.str()
    assert "Traceback" not in out and "subprocess.py" not in out, out
    result.stdout.fnmatch_lines([
        "*profile 'py': python /opt/nope/bin/python3 does not exist. Point `python` at the interpreter*",
        "*the server for this profile failed to start*: *profile 'py': python /opt/nope/bin/python3 does not exist*",
    ], consecutive=False)
    result.stdout.fnmatch_lines(["*profile 'cmd': command /opt/nope/bin/server does not exist*"])
    result.stdout.fnmatch_lines(["*profile 'bare': command no-such-server-on-path is not on PATH*"])
    result.stdout.fnmatch_lines(["*sglang servers*", "py: FAILED TO START: *python /opt/nope/bin/python3 does not*"])
    report = _report(pytester)
    profiles = report["profiles"]
    assert isinstance(profiles, dict) and sorted(profiles) == ["bare", "cmd", "py"]
    assert {p["outcome"] for p in profiles.values()} == {"failed"}
    gate = report["gate"]
    assert isinstance(gate, dict) and gate["status"] == "not-judged"
    assert sorted(e["profile"] for e in gate["not_judged"]) == ["bare", "cmd", "py"]
    assert all(e["reason"].startswith("the server could not start: ") for e in gate["not_judged"])
    assert not marked_processes(mark)


def test_show_flags_a_missing_binary(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, mark)
    result = _run(pytester, "--sglang-show", "--sglang-profile=py,cmd")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "profile py", "  command * /opt/nope/bin/python3 -m sglang.launch_server *",
        "  problem * python /opt/nope/bin/python3 does not exist*",
        "profile cmd", "  problem * command /opt/nope/bin/server does not exist*",
    ])


def test_a_program_that_cannot_be_run_is_a_startup_failure_not_a_traceback(pytester: pytest.Pytester,
                                                                            mark: str) -> None:
    _project(pytester, mark)
    result = _run(pytester, "--sglang-profile=noexec", "--sglang-report=report.json")
    result.assert_outcomes(errors=2)
    assert "Traceback" not in result.stdout.str()
    result.stdout.fnmatch_lines(["[[]sglang noexec] could not run ./not-a-program: Exec format error*",
                                 "Command: ./not-a-program -m sglang.launch_server *"])
    result.stdout.fnmatch_lines(["noexec: FAILED TO START: could not run ./not-a-program: Exec format error"])
    assert _report(pytester)["profiles"]["noexec"]["outcome"] == "failed"  # type: ignore[index]
    assert not marked_processes(mark)


def test_any_exception_during_startup_is_recorded_as_a_failed_start(pytester: pytest.Pytester, mark: str) -> None:
    _project(pytester, mark)
    pytester.makeconftest("""
import pytest_sglang.launch.plan as plan

def broken(*args, **kwargs):
    raise RuntimeError("planning broke")

plan.plan_launch = broken
""")
    result = _run(pytester, "--sglang-profile=py", "--sglang-report=report.json")
    result.assert_outcomes(errors=2)
    out = result.stdout.str()
    assert out.count("RuntimeError: planning broke") >= 2
    assert out.count("raise RuntimeError") == 1, "the traceback once; the second test says it in one line"
    result.stdout.fnmatch_lines(["py: FAILED TO START: RuntimeError: planning broke"])
    gate = _report(pytester)["gate"]
    assert isinstance(gate, dict)
    assert gate["not_judged"][0]["reason"] == "the server could not start: RuntimeError: planning broke"
