"""Every real sample log, replayed by a real process through the plugin, as a user's pytest run sees it.

Each `NN_name.log` in the samples directory with its `.json` sidecar becomes one or more cases: a user project
whose profile's `command` runs `python -m pytest_sglang.sim.replay LOG --port {port} --then MODE`, run with
`pytester.runpytest_subprocess`. The sidecar's `outcome` says what must happen:

* ready    -> `--then serve`: the inner test gets the fixture after the ready line and /health answers 200;
* hang     -> `--then hang` with a short startup_timeout: the error names the timeout, the last phase and the
              last log lines;
* crash    -> `--then kill` (SGLang's sigquit path: the tree SIGKILLs itself) and `--then hang` (the traceback
              is logged, the process stays alive): the error carries the sidecar's expected substring; the
              alive case fails fast (no startup-timeout wait, the timeout is set to 120 s);
* argparse -> `--then exit:2`: the substring and "exit code 2".

In every case the "Root cause" part never shows a benign "Ignore import error" line, and no process carrying
the case's TEST_MARK survives (the `mark` fixture).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import SAMPLES

from pytest_sglang.config.kinds import KINDS

pytestmark = pytest.mark.timeout(120)

ALIVE_CRASH_TIMEOUT = 120  # high on purpose: the alive-traceback path must not wait it out
HANG_TIMEOUT = 2
DEFAULT_TIMEOUT = 60
LINES_PER_SECOND = 5000  # the samples are short; replay them fast


@dataclass(frozen=True)
class Case:
    log: Path
    sidecar: dict
    kind: str  # "sglang" or "vllm"
    then: str  # replayer's --then

    @property
    def outcome(self) -> str:
        return str(self.sidecar["outcome"])

    @property
    def expected(self) -> str | None:
        return self.sidecar.get("expected_error_message_substring")

    @property
    def startup_timeout(self) -> int:
        if self.outcome == "hang":
            return HANG_TIMEOUT
        if self.then == "hang":
            return ALIVE_CRASH_TIMEOUT
        return DEFAULT_TIMEOUT

    @property
    def id(self) -> str:
        return f"{self.log.stem}-{self.then.replace(':', '')}"


def _kind(log: Path, sidecar: dict) -> str:
    """vLLM samples say so in their file name, outcome or source (e.g. "vllm-project/vllm#14095")."""
    text = " ".join([log.name, str(sidecar.get("outcome", "")), str(sidecar.get("source", ""))]).lower()
    return "vllm" if "vllm" in text else "sglang"


THEN_BY_OUTCOME = {"ready": ["serve"], "hang": ["hang"], "crash": ["kill", "hang"], "argparse": ["exit:2"]}


def _cases() -> list[Case]:
    root = SAMPLES
    cases = []
    for log in sorted(root.glob("*.log")):
        sidecar_path = log.with_suffix(".json")
        if not sidecar_path.is_file():
            continue
        sidecar = json.loads(sidecar_path.read_text())
        for then in THEN_BY_OUTCOME.get(sidecar.get("outcome"), []):
            cases.append(Case(log.resolve(), sidecar, _kind(log, sidecar), then))
    return cases


CASES = _cases()

READY_TEST = """
import re
import requests

def test_ready(sglang_server):
    assert requests.get(sglang_server.url("/health"), timeout=5).status_code == 200
    assert re.search(READY_PATTERN, sglang_server.log_path.read_text(errors="replace"))
    assert sglang_server.phases["ready"] == sglang_server.startup_seconds > 0
"""


def _project(pytester: pytest.Pytester, case: Case, mark: str) -> None:
    command = ["{python}", "-m", "pytest_sglang.sim.replay", str(case.log), "--port", "{port}",
               "--then", case.then, "--lines-per-second", str(LINES_PER_SECOND)]
    # JSON strings and arrays are valid TOML basic strings and arrays.
    toml = (
        "[tool.pytest.ini_options]\n"
        "[tool.pytest_sglang.profiles.replay]\n"
        f"kind = {json.dumps(case.kind)}\n"
        f"command = {json.dumps(command)}\n"
        f"startup_timeout = {case.startup_timeout}\n"
        "shutdown_grace = 2\n"
        f'env = {{ TEST_MARK = "{mark}" }}\n'
    )
    pytester.makefile(".toml", pyproject=toml)
    ready_pattern = KINDS[case.kind].ready_pattern
    pytester.makepyfile(test_user=f"READY_PATTERN = {ready_pattern!r}\n" + READY_TEST)


def _run(pytester: pytest.Pytester) -> tuple[pytest.RunResult, float]:
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "--sglang-profile=replay", timeout=100)
    return result, time.monotonic() - started


def _root_cause_part(out: str) -> str:
    """The "Root cause from the server log:" sections of every error shown (up to each "Full log:")."""
    parts = re.findall(r"Root cause from the server log:\n(.*?)(?:Full log:|\Z)", out, flags=re.S)
    return "\n".join(parts)


def _last_phase_label(case: Case) -> str | None:
    """The label of the startup phase whose first marker line comes last in the log (the kind's own rules)."""
    rules = KINDS[case.kind].phases
    seen: dict[str, tuple[int, str]] = {}
    text = case.log.read_text(errors="replace")
    for n, line in enumerate(re.split(r"\r\n|\r|\n", text)):
        for rule in rules:
            if rule.name not in seen and rule.pattern.search(line):
                seen[rule.name] = (n, rule.label)
    return max(seen.values())[1] if seen else None


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_sample_replayed_through_the_plugin(pytester: pytest.Pytester, mark: str, case: Case) -> None:
    _project(pytester, case, mark)
    result, took = _run(pytester)
    out = result.stdout.str()
    where = f"{case.log.name} --then {case.then} ({took:.1f} s)\n{out}"

    assert "Ignore import error" not in _root_cause_part(out), where

    if case.outcome == "ready":
        result.assert_outcomes(passed=1)
        return

    result.assert_outcomes(errors=1)
    assert out.count("launching: log") == 1, where
    assert "Full log: " in out and "replay.log" in out, where

    if case.outcome == "hang":
        assert f"server was not ready within its startup timeout of {HANG_TIMEOUT} s" in out, where
        label = _last_phase_label(case)
        if label is not None:
            assert f"last phase: {label}" in out, where
        assert "Last " in out and " log lines:" in out, where
        last_line = case.log.read_text(errors="replace").strip().splitlines()[-1].strip()
        assert last_line in out, where
        assert "Root cause from the server log:" not in out, where  # a hang has no culprit line to show
        return

    assert case.expected, f"{case.log.name}: sidecar has no expected_error_message_substring"
    assert case.expected in _root_cause_part(out), where
    assert "Root cause from the server log:" in out, where

    if case.then == "kill":
        assert "server exited during startup" in out, where
        assert "killed by SIGKILL" in out, where
    elif case.then == "hang":
        assert "server crashed during startup (its process was still alive" in out, where
        assert "startup timeout" not in out, where  # failed fast, did not wait the 120 s out
        assert took < ALIVE_CRASH_TIMEOUT, where
    elif case.then == "exit:2":
        assert "server exited during startup" in out, where
        assert "exit code 2" in out, where
        assert "command-line parser rejecting a flag" in out, where


def test_every_sample_is_covered() -> None:
    """A new sample with an unknown outcome must not be silently skipped."""
    root = SAMPLES
    logs = sorted(p for p in root.glob("*.log") if p.with_suffix(".json").is_file())
    assert logs, f"no samples in {root}"
    covered = {c.log.name for c in CASES}
    for log in logs:
        outcome = json.loads(log.with_suffix(".json").read_text()).get("outcome")
        assert outcome in THEN_BY_OUTCOME, f"{log.name}: unknown outcome {outcome!r}"
        assert log.name in covered
