"""Logs are private (folders 0700, files 0600), old auto-created log folders are pruned, every excerpt the
plugin prints or reports is redacted."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import dead_pid, profile_toml

from pytest_sglang.errors import (
    Diagnosis,
    PortInUseError,
    ServerStartupError,
    redact,
    register_arg_secrets,
    register_secret,
)
from pytest_sglang.launch.logdir import KEEP_LOG_DIRS, auto_log_dir, open_log, private_dir, prune_log_dirs
from pytest_sglang.launch.process import ServerProcess

pytestmark = pytest.mark.timeout(120)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "state"
    monkeypatch.setenv("PYTEST_SGLANG_STATE_DIR", str(folder))
    return folder


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.usefixtures("loose_umask")
def test_a_server_log_and_its_new_folders_are_private(tmp_path: Path) -> None:
    log = tmp_path / "new" / "nested" / "p.log"
    server = ServerProcess([sys.executable, "-c", "print('server_args=ServerArgs(api_key=\"x\")')"],
                           env=dict(os.environ), log_path=log, reap_on_parent_death=False)
    server.popen.wait(timeout=30)
    server.stop(grace=1)
    assert _mode(log) == 0o600
    assert _mode(log.parent) == 0o700 and _mode(log.parent.parent) == 0o700


@pytest.mark.usefixtures("loose_umask")
def test_a_reused_log_file_becomes_private_and_a_users_folder_keeps_its_mode(tmp_path: Path) -> None:
    folder = tmp_path / "ci-artifacts"
    folder.mkdir(mode=0o755)
    log = folder / "p.log"
    log.write_text("an earlier run\n")
    log.chmod(0o644)
    with open_log(log) as fh:
        fh.write(b"new\n")
    assert _mode(log) == 0o600 and log.read_text() == "new\n"
    assert _mode(folder) == 0o755, "a folder the user named and made is theirs"


@pytest.mark.usefixtures("loose_umask")
def test_the_auto_log_folder_is_private_under_a_private_state_folder(state: Path) -> None:
    folder = auto_log_dir()
    assert folder.parent == state / "logs"
    assert [_mode(p) for p in (state, state / "logs", folder)] == [0o700, 0o700, 0o700]
    (state / "logs").chmod(0o755)  # loosened by hand: the plugin's own folder is made private again
    auto_log_dir()
    assert _mode(state / "logs") == 0o700


def test_a_planted_state_folder_is_refused(tmp_path: Path, state: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    state.symlink_to(elsewhere)  # someone made our folder a link to theirs
    with pytest.raises(Exception, match="is not a folder of this user's"):
        auto_log_dir()


def test_old_log_folders_are_pruned_to_the_newest_few(state: Path) -> None:
    logs = private_dir(state / "logs")
    dead = dead_pid()
    names = [f"202601{day:02d}-120000-{dead}" for day in range(1, 16)]
    for name in names:
        (logs / name).mkdir()
        (logs / name / "p.log").write_text("old\n")
    live = logs / f"20251231-120000-{os.getpid()}"  # a run that is still going (this one)
    live.mkdir()
    kept = logs / f"20251230-120000-{dead}"  # a server kept by --sglang-reuse still writes here
    kept.mkdir()
    (state / "kept" / "abc").mkdir(parents=True)
    (state / "kept" / "abc" / "p.json").write_text(json.dumps({"record": {"log_path": str(kept / "p.log")}}))
    other = logs / "notes"  # not a run folder of ours
    other.mkdir()

    new = auto_log_dir()
    left = sorted(p.name for p in logs.iterdir())
    assert left == sorted([kept.name, live.name, *names[-(KEEP_LOG_DIRS - 1):], new.name, "notes"])
    assert prune_log_dirs(logs, keep=KEEP_LOG_DIRS) == []


def test_a_log_dir_the_user_names_is_never_pruned(pytester: pytest.Pytester, mark: str, state: Path) -> None:
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + profile_toml("p", mark))
    pytester.makepyfile(test_user="def test_ready(sglang_server):\n    pass\n")
    logs = pytester.path / "logs"
    for day in range(1, 13):
        (logs / f"202601{day:02d}-120000-{dead_pid()}").mkdir(parents=True)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-profile=p", "--sglang-sim",
                                           f"--sglang-log-dir={logs}", timeout=90)
    result.assert_outcomes(passed=1)
    assert len([p for p in logs.iterdir() if p.is_dir()]) == 12
    assert _mode(logs / "p.log") == 0o600


SECRET = "sk-excerpt-secret-42"


def test_excerpts_are_redacted_in_errors_and_the_report(pytester: pytest.Pytester, mark: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulator logs `server_args=ServerArgs(... api_key='...')` and dies: the log holds the key (it is
    0600), the terminal, the JSON report and its HTML page do not."""
    monkeypatch.setenv("COLUMNS", "400")
    toml = profile_toml("p", mark, f'args = ["--api-key", "{SECRET}"]\nstartup_timeout = 3',
                        'startup_seconds = 2.0, fault = "hang"')
    pytester.makefile(".toml", pyproject="[tool.pytest.ini_options]\n" + toml)
    pytester.makepyfile(test_user="def test_ready(sglang_server):\n    pass\n")
    logs = pytester.path / "logs"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rE", "--sglang-profile=p", "--sglang-sim",
                                           f"--sglang-log-dir={logs}", "--sglang-report=report.json", timeout=90)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*server_args=ServerArgs(*api_key='***'*"])
    assert SECRET in (logs / "p.log").read_text(), "the log itself is the full record"
    assert _mode(logs / "p.log") == 0o600
    for text in (result.stdout.str(), result.stderr.str(), (pytester.path / "report.json").read_text(),
                 (pytester.path / "report.html").read_text()):
        assert SECRET not in text


def test_redaction_covers_what_servers_print_and_every_plugin_error() -> None:
    assert redact("server_args=ServerArgs(model_path='/m', api_key='abcdef', hf_token='hf_xyz', "
                  "tokenizer_path='/t', max_total_num_tokens=8)") == (
        "server_args=ServerArgs(model_path='/m', api_key='***', hf_token='***', tokenizer_path='/t', "
        "max_total_num_tokens=8)")
    assert redact('curl -H "Authorization: Bearer sk-1234567"') == 'curl -H "Authorization: Bearer ***"'
    register_arg_secrets(["--port", "1", "--admin-api-key", "admin-key-77", "--hf-token=hf_token_88"])
    assert redact("admin-key-77 hf_token_88 1") == "*** *** 1"
    register_secret("holder-secret-99")
    busy = PortInUseError("Port 1 is busy; held by pid 5 (python -m sglang.launch_server --api-key holder-secret-99)")
    assert "holder-secret-99" not in str(busy)
    died = ServerStartupError("server exited", profile="p", log_path=None,
                              diagnosis=Diagnosis(last_lines=["key holder-secret-99"], died_first="x holder-secret-99"))
    assert "holder-secret-99" not in str(died) and "holder-secret-99" not in (died.cause or "")
