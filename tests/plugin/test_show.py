"""--sglang-show: each selected profile as it would run, secrets redacted, and nothing launched."""

from __future__ import annotations

import pytest
from helpers import marked_processes

pytestmark = pytest.mark.timeout(120)

PROFILES = """
[tool.pytest_sglang.profiles.base]
model = "${MODEL_DIR:-org/model}"
args = ["--tp", "2", "--api-key", "sk-show-secret-1", "--hf-token=hf_show_secret_2"]
env = { HF_TOKEN = "${SHOWN_TOKEN}", CUDA_VISIBLE_DEVICES = "0,1", TEST_MARK = "%(mark)s" }
sim = { startup_seconds = 0.6, decode_tok_s = 50 }
stall_timeout = 120

[tool.pytest_sglang.profiles.eagle3]
extends = "base"
args = ["--speculative-algorithm", "EAGLE3"]
startup_timeout = 900
ready_pattern = "fired up"

[tool.pytest_sglang.profiles.broken]
model = "/no/such/model-dir"
"""


def _show(pytester: pytest.Pytester, mark: str, *args: str) -> pytest.RunResult:
    pytester.makefile(".toml", pyproject=PROFILES % {"mark": mark})
    pytester.makepyfile(test_user="def test_ready(sglang_server):\n    raise AssertionError('no test may run')\n")
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-show", *args, timeout=60)


def test_show_prints_the_profile_as_it_will_run_and_launches_nothing(
    pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOWN_TOKEN", "hf_env_secret_3")
    monkeypatch.setenv("MODEL_DIR", "org/expanded-model")
    result = _show(pytester, mark, "--sglang-profile=eagle3")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "pytest-sglang --sglang-show: 1 selected profile(s) from *pyproject.toml; nothing is launched",
        "profile eagle3",
        "  kind  * sglang",
        # extends: the parent's args first; ${VAR} expanded; the secret flags' values hidden
        "  command * -m sglang.launch_server --model-path org/expanded-model --host 127.0.0.1 --port * --tp 2 "
        "--api-key *** --hf-token=*** --speculative-algorithm EAGLE3",
        "  listens on * 127.0.0.1:* (the port is an example: a free one is chosen at each launch)",
        "  env * HF_TOKEN=*** CUDA_VISIBLE_DEVICES=0,1 TEST_MARK=*",
        "  sim knobs * startup_seconds=0.6 decode_tok_s=50 (used only with --sglang-sim)",
        "  ready when * a log line matches /fired up/, then GET /* answers 200",
        "  alive while * GET /health answers 200",
        "  timeouts * startup 900 s (the hard cap), stall 120 s without log progress, shutdown grace 30 s",
        "  log * *eagle3.log (NEW-RUN-FOLDER: a new folder for each run)",
    ])
    out = result.stdout.str() + result.stderr.str()
    for secret in ("sk-show-secret-1", "hf_show_secret_2", "hf_env_secret_3"):
        assert secret not in out
    assert "no test may run" not in out and "launching" not in out
    assert not marked_processes(mark)


def test_show_under_sim_shows_the_simulator_command_and_all_profiles_when_none_is_selected(
    pytester: pytest.Pytester, mark: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SHOWN_TOKEN", "hf_env_secret_3")
    result = _show(pytester, mark, "--sglang-sim", "--sglang-log-dir=logs")
    assert result.ret == 0, "the simulator loads no model: the missing model path is no problem here"
    result.stdout.fnmatch_lines([
        "pytest-sglang --sglang-show: 3 defined profile(s) from *pyproject.toml under --sglang-sim; nothing is "
        "launched",
        "profile base", "  command * -m pytest_sglang.sim --model-path org/model *",
        "  sim knobs * startup_seconds=0.6 decode_tok_s=50",
        f"  log * {pytester.path}/logs/base.log",
        "profile eagle3", "profile broken",
    ])
    assert "problem" not in result.stdout.str()
    assert not (pytester.path / "logs").exists(), "showing makes no log folder"


def test_show_names_problems_and_unknown_profiles(pytester: pytest.Pytester, mark: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SHOWN_TOKEN", raising=False)
    result = _show(pytester, mark, "--sglang-profile=base,broken")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "profile base", "  problem * profile 'base', key 'env': ${SHOWN_TOKEN} is not set in the environment*",
        "profile broken", "  command * --model-path /no/such/model-dir *",
        "  problem * model path /no/such/model-dir does not exist*",
    ])
    unknown = _show(pytester, mark, "--sglang-profile=eagel3")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stdout.fnmatch_lines(["pytest-sglang --sglang-show: Unknown profile 'eagel3'*Did you mean 'eagle3'?"])


def test_show_under_url_shows_the_server_it_attaches_to_and_launches_nothing(pytester: pytest.Pytester,
                                                                              mark: str) -> None:
    result = _show(pytester, mark, "--sglang-url=http://127.0.0.1:30000", "--sglang-profile=eagle3")
    assert result.ret == 0
    result.stdout.fnmatch_lines([
        "pytest-sglang --sglang-show: --sglang-url=http://127.0.0.1:30000: nothing is launched or stopped; the "
        "tests use the server there",
        "profile eagle3", "  kind * sglang", "  ready when * GET /health answers 200 within 10 s",
    ])
    assert "command" not in result.stdout.str()
    several = _show(pytester, mark, "--sglang-url=http://127.0.0.1:30000", "--sglang-profile=base,eagle3")
    assert several.ret == pytest.ExitCode.USAGE_ERROR
    several.stdout.fnmatch_lines(["*--sglang-url names one running server, but 2 profiles were selected*"])
