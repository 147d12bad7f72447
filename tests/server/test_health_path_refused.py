"""A server that is up and answers its health path with a client error (a wrong health_path, a missing key)
fails after stall_timeout, saying what it answered, instead of waiting out startup_timeout: its own access log
lines for the probe keep its log moving, so no stall would ever fire."""

from __future__ import annotations

import sys

import pytest

PROFILE = """
[tool.pytest_sglang.profiles.web]
kind = "generic"
command = [{python!r}, "-u", "-m", "http.server", "--bind", "127.0.0.1", "{{port}}"]
health_path = "/healthz"
stall_timeout = 2
startup_timeout = 600
env = {{ TEST_MARK = "{mark}" }}
"""


def test_a_health_path_that_answers_404_fails_after_the_stall_timeout(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=PROFILE.format(python=sys.executable, mark=mark))
    pytester.makepyfile(test_web="def test_up(sglang_server):\n    assert sglang_server.base_url\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=web", timeout=120)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([
        "*GET /healthz answered 404 for * s while the server ran: is health_path right? (stall_timeout 2 s)*",
        "*Try: set the profile's health_path to a path that answers 200 once the server is ready*"])
    assert "startup timeout of 600 s" not in result.stdout.str()
