"""What a new user meets through real pytest runs on the simulator: junit properties, profile comparisons that
skip or fail cleanly, unset ${VAR}s that only matter where needed, a missing server install explained."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET

import pytest
from helpers import profile_toml

pytestmark = pytest.mark.timeout(180)

COMPARE = """
import pytest

def test_throughput(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=4, input_len=8, output_len=16, warmup=0)

@pytest.mark.sglang_compare
def test_compare(sglang_results):
    sglang_results.compare("fast", "slow", "test_throughput", output_throughput="10%")
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=150)


FAST_TOK_S = 20.0  # slow enough that a loaded runner's client keeps up with it


def two_profiles(pytester: pytest.Pytester, mark: str, slow_tok_s: float) -> None:
    toml = (profile_toml("slow", mark, sim=f"startup_seconds = 0.3, decode_tok_s = {slow_tok_s}")
            + profile_toml("fast", mark, sim=f"startup_seconds = 0.3, decode_tok_s = {FAST_TOK_S}"))
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user=COMPARE)


def test_every_test_that_uses_the_server_gets_its_startup_in_junit(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("p", mark))
    pytester.makepyfile(test_user="def test_plain(sglang_server):\n    pass\n")
    xml = pytester.path / "junit.xml"
    run(pytester, "--sglang-profile=p", "--sglang-sim", f"--junitxml={xml}").assert_outcomes(passed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).getroot().iter("property")}
    assert props["sglang_profile"] == "p"
    assert props["sglang_origin"] == "launched"
    assert float(props["sglang_startup_seconds"]) == float(props["sglang_phase_ready"]) > 0
    assert {"sglang_phase_load_weights", "sglang_phase_kv_cache"} <= set(props)


def test_a_comparison_whose_profile_did_not_run_skips_with_the_reason(pytester: pytest.Pytester, mark: str) -> None:
    two_profiles(pytester, mark, slow_tok_s=FAST_TOK_S / 4)
    result = run(pytester, "--sglang-profile=fast", "--sglang-sim", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED *profile 'slow' did not run in this session (selected: fast); pass "
                                 "--sglang-profile=fast,slow to compare it"])
    assert "KeyError" not in result.stdout.str()


def test_a_failing_comparison_fails_with_its_message_only(pytester: pytest.Pytester, mark: str) -> None:
    # "slow" paced twice as fast as "fast": no load can give "fast" its 10 % margin (a simulator is never faster
    # than its pace, and load would have to slow "slow" 2.2x more than "fast"); of equal paces, one run measured
    # on a quieter moment of a loaded runner than the other beat it by 10 %
    two_profiles(pytester, mark, slow_tok_s=FAST_TOK_S * 2)
    result = run(pytester, "--sglang-profile=slow,fast", "--sglang-sim")
    result.assert_outcomes(passed=2, failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(["*fast does not beat slow on test_throughput:*", "*output_throughput: fast *"])
    assert "def compare" not in out and "pytest_sglang" not in out, "the plugin's source must not be dumped"


def test_an_unset_var_blocks_only_the_profile_and_the_keys_a_run_needs(pytester: pytest.Pytester, mark: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_SGLANG_TEST_MODEL_DIR", raising=False)
    toml = (profile_toml("ok", mark)
            + profile_toml("gpu", mark).replace('model = "/models/sim-model"',
                                                'model = "${PYTEST_SGLANG_TEST_MODEL_DIR}/llama"'))
    pytester.makefile(".toml", pyproject=toml)
    pytester.makepyfile(test_user="def test_plain(sglang_server):\n    pass\n")
    # Another profile selected: the unset variable is none of its business.
    run(pytester, "--sglang-profile=ok", "--sglang-sim").assert_outcomes(passed=1)
    # The simulator needs no model.
    run(pytester, "--sglang-profile=gpu", "--sglang-sim").assert_outcomes(passed=1)
    # Plain pytest: the server tests skip, no stack trace.
    plain = run(pytester, "-rs")
    plain.assert_outcomes(skipped=1)
    plain.stdout.fnmatch_lines(["*no server selected: pass --sglang-profile=NAME (known: gpu, ok)*"])
    # A real launch needs the model: a clear error naming file, line, profile, key and variable.
    real = run(pytester, "--sglang-profile=gpu")
    real.assert_outcomes(errors=1)
    real.stdout.fnmatch_lines(["*pyproject.toml:*: profile 'gpu', key 'model': ${PYTEST_SGLANG_TEST_MODEL_DIR} is "
                               "not set in the environment. Export PYTEST_SGLANG_TEST_MODEL_DIR*"])
    assert "Traceback" not in real.stdout.str()


def test_a_server_that_is_not_installed_says_what_to_do(pytester: pytest.Pytester, mark: str) -> None:
    # This interpreter has no sglang (the plugin's test venv never does): exactly the user who forgot --sglang-sim.
    pytester.makefile(".toml", pyproject=profile_toml("p", mark).replace('model = "/models/sim-model"',
                                                                         'model = "org/model"'))
    pytester.makepyfile(test_user="def test_plain(sglang_server):\n    pass\n")
    result = run(pytester, "--sglang-profile=p")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*server exited during startup: ModuleNotFoundError: No module named 'sglang'*",
                                 "*Try: * has no sglang installed: install sglang for it, point the "
                                 "profile's `python` at an interpreter that has it, or pass --sglang-sim*"])
    # The same interpreter however it is spelt: pytest started through a relative path names it with `..` in it.
    named = next(line for line in result.outlines if "Try: " in line).split("Try: ", 1)[1].split(" has no ")[0]
    assert os.path.samefile(named, sys.executable), (named, sys.executable)
