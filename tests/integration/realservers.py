"""Helpers for the real-server tests: server venvs, the tiny model, profiles, inner pytest runs, leftovers.

Real SGLang and vLLM servers on the CPU, launched by the plugin inside an inner pytest run.

Each server lives in its own venv, made by `.ci/install-servers.sh DEST`; the tests find them through
PYTEST_SGLANG_SGLANG_PYTHON and PYTEST_SGLANG_VLLM_PYTHON (and, for the fleets of test_real_fleet.py,
PYTEST_SGLANG_ROUTER_PYTHON: sglang-router's venv, and PYTEST_SGLANG_PD_EXTRAS: the folder with mooncake and
msgpack for prefill/decode members). Unset, the tests skip, except under CI=true, where they fail: CI never
silently skips the real servers.

How the servers run: an inner `python -m pytest` in a temp project whose profiles TOML points `python` at the
server venv (see `InnerProject`). The outer tests read the inner run's junit XML, its --sglang-report JSON and
the server log, so they see exactly what a user's CI would see, failures included.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers import reap_marked  # tests/ is on sys.path: tests/conftest.py sits there

HERE = Path(__file__).resolve().parent
STUB_DIR = HERE / "sgl_kernel_stub"
TINY_MODEL = HERE / "tiny_model.py"
PYTHON_VARS = {"sglang": "PYTEST_SGLANG_SGLANG_PYTHON", "vllm": "PYTEST_SGLANG_VLLM_PYTHON",
               "router": "PYTEST_SGLANG_ROUTER_PYTHON"}
PD_EXTRAS_VAR = "PYTEST_SGLANG_PD_EXTRAS"

# Flags that work on these 2-core CPU machines (shared/reference/sglang-cpu.md, vllm-cpu.md).
SERVER_ARGS = {
    "sglang": ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph",
               "--max-total-tokens", "4096", "--dtype", "bfloat16"],
    "vllm": ["--dtype", "float32", "--max-model-len", "512"],
}
READY_LINE = {"sglang": "The server is fired up and ready to roll!", "vllm": "Application startup complete."}
STARTUP_TIMEOUT = 900  # vLLM's first start compiles the model: ~100 s on a quiet machine, more on a busy one


def server_python(kind: str) -> str:
    """The python of the `kind` venv (sglang, vllm, router); unset: skip, or fail under CI=true."""
    return _installed(PYTHON_VARS[kind], f"DEST/{kind}/bin/python", f"the real {kind} server", Path.is_file)


def pd_extras() -> str:
    """The folder prefill/decode members need on PYTHONPATH (mooncake's transfer engine, msgpack)."""
    return _installed(PD_EXTRAS_VAR, "DEST/pd-extras", "a real prefill/decode pair", Path.is_dir)


def _installed(var: str, where: str, what: str, exists: Callable[[Path], bool]) -> str:
    value = os.environ.get(var)
    ci = os.environ.get("CI", "").lower() == "true"
    if not value:
        msg = f"{var} is not set: run `.ci/install-servers.sh DEST` and export {var}={where} to run {what}"
        if ci:
            pytest.fail(f"CI=true but {msg}", pytrace=False)
        pytest.skip(msg)
    if not exists(Path(value)):
        pytest.fail(f"{var}={value} does not exist: run `.ci/install-servers.sh DEST` first", pytrace=False)
    return value


class TinyModels:
    """The tiny model's variants, each made once per session (about 5 s with a server venv's python)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[str, Path] = {}

    def get(self, variant: str, python: str) -> Path:
        if variant not in self._made:
            out = self.root / variant
            proc = subprocess.run([python, str(TINY_MODEL), str(out), "--variant", variant],
                                  capture_output=True, text=True, timeout=300)
            if proc.returncode != 0:
                pytest.fail(f"making the tiny model ({variant}) failed:\n{proc.stdout}\n{proc.stderr}",
                            pytrace=False)
            self._made[variant] = out
        return self._made[variant]


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # strings, lists of strings and numbers read the same in TOML


def profile_toml(name: str, kind: str, *, python: str, model: Path, mark: str, extra_args: Sequence[str] = (),
                 startup_timeout: float = STARTUP_TIMEOUT, stub_dir: Path = STUB_DIR,
                 extra_env: dict[str, str] | None = None, keys: dict[str, object] | None = None) -> str:
    """One profile table; `keys` adds more (a fleet's `replicas`, `router`, `prefill`, `decode`)."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TEST_MARK": mark, "PYTHONPATH": ""}
    if kind == "sglang":
        env.update(SGLANG_USE_CPU_ENGINE="1", PYTHONPATH=str(stub_dir))
    else:
        env.update(VLLM_CPU_KVCACHE_SPACE="1")
    env.update(extra_env or {})
    table = {
        "kind": kind, "python": python, "model": str(model), "args": [*SERVER_ARGS[kind], *extra_args],
        "startup_timeout": startup_timeout, **(keys or {}),
    }
    lines = [f"[profiles.{name}]"] + [f"{k} = {_toml(v)}" for k, v in table.items()] + [f"env = {_toml(env)}"]
    return "\n".join(lines) + "\n"


def reap(mark: str, timeout: float = 20.0) -> list[str]:
    """Wait for the marked processes to go; kill and name the ones still there after `timeout`."""
    return reap_marked(mark, timeout)


@dataclass
class Outcome:
    nodeid: str  # "test_inner.py::test_x[profile]"
    outcome: str  # passed, failed, error, skipped
    message: str
    seconds: float


@dataclass
class InnerRun:
    returncode: int
    stdout: str
    wall_seconds: float
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # by test name without the parameter
    report: dict | None = None

    def outcome(self, name: str) -> Outcome:
        assert name in self.outcomes, f"inner test {name} did not run; inner output:\n{self.stdout[-6000:]}"
        return self.outcomes[name]

    def explain(self) -> str:
        bad = [f"{o.nodeid}: {o.outcome}\n{o.message}" for o in self.outcomes.values()
               if o.outcome not in ("passed", "skipped")]
        return "\n\n".join(bad) + f"\n\n--- inner output (tail) ---\n{self.stdout[-8000:]}"


class InnerProject:
    """A temp project with a profiles TOML and inner test files, run with `python -m pytest`."""

    def __init__(self, path: Path, mark: str) -> None:
        self.path = path
        self.mark = mark
        self.log_dir = path / "server-logs"
        (path / "pytest.ini").write_text("[pytest]\ntimeout = 1800\n")

    def write(self, name: str, text: str) -> Path:
        target = self.path / name
        target.write_text(text)
        return target

    def run(self, *args: str, tag: str, timeout: float = 1500, env: dict[str, str] | None = None) -> InnerRun:
        junit = self.path / f"junit-{tag}.xml"
        report = self.path / f"report-{tag}.json"
        cmd = [sys.executable, "-m", "pytest", "-rA", "-v", f"--junitxml={junit}",
               f"--sglang-report={report}", f"--sglang-log-dir={self.log_dir}",
               "--sglang-config=profiles.toml", *args]
        run_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") or k in PYTHON_VARS.values()}
        run_env.update(env or {})
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=self.path, env=run_env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)
        run = InnerRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0)
        if junit.exists():
            run.outcomes = parse_junit(junit)
        if report.exists():
            run.report = json.loads(report.read_text())
        return run


def parse_junit(path: Path) -> dict[str, Outcome]:
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "")
        base = name.split("[", 1)[0]
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
        outcomes[base] = Outcome(f"{case.get('classname')}::{name}", outcome, message,
                                 float(case.get("time") or 0.0))
    return outcomes
