"""The Harness without pytest: a script launches a profile's server, benchmarks it, checks it against its baseline
and writes the report, as the plugin does; a regression is a CheckFailedError, and nothing is left running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import REPO, profile_toml, reap_marked

from pytest_sglang import Harness
from pytest_sglang.errors import CheckFailedError, ProfileError, UsageProblem

WORKLOAD = {"num_requests": 12, "concurrency": 4, "input_len": 16, "output_len": 24, "rounds": 3, "warmup": 1}


def _project(tmp_path: Path, mark: str, decode_tok_s: int) -> None:
    (tmp_path / "pyproject.toml").write_text(
        profile_toml("base", mark, sim=f"startup_seconds = 0.3, decode_tok_s = {decode_tok_s}"))


def _session(tmp_path: Path, **options: object) -> Harness:
    return Harness(rootdir=tmp_path, profiles=["base"], sim=True, baseline_path=tmp_path / "baselines.json",
                   log_dir_option=str(tmp_path / "logs"), **options)


def test_importing_the_harness_imports_no_pytest() -> None:
    code = ("import sys\nfrom pytest_sglang import Harness\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pytest', '_pytest', 'pluggy')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_script_records_then_a_slower_server_fails_its_check(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    _project(tmp_path, mark, decode_tok_s=400)
    try:
        with _session(tmp_path, update_baseline=True) as harness:
            harness.start()
            with harness.server("base") as server:
                assert server.startup_seconds is not None and server.startup_seconds > 0
                result = harness.bench(server, **WORKLOAD)
                harness.check(result, output_throughput="5%")
            harness.finish()
        assert "output_throughput" in (tmp_path / "baselines.json").read_text()  # recorded, not judged

        _project(tmp_path, mark, decode_tok_s=100)
        with _session(tmp_path, report_path=str(tmp_path / "report.json")) as harness:
            with harness.server("base") as server:
                slower = harness.bench(server, **WORKLOAD)
                with pytest.raises(CheckFailedError, match="output_throughput"):
                    harness.check(slower, output_throughput="5%")
            finished = harness.finish()
        assert slower.output_throughput < result.output_throughput / 2
        assert any("report.json" in line for line in finished.written), finished.written
        report = json.loads((tmp_path / "report.json").read_text())
        assert report["profiles"]["base"]["benchmarks"][0]["gate"] == "regressed"
    finally:
        assert reap_marked(mark) == [], "the harness left a server running"


def test_mistakes_are_typed_errors_before_anything_launches(tmp_path: Path) -> None:
    _project(tmp_path, uuid.uuid4().hex, decode_tok_s=400)
    with pytest.raises(UsageProblem, match="no-such"):
        Harness(rootdir=tmp_path, profiles=["no-such"], sim=True).start()
    with pytest.raises(UsageProblem, match="startup-timeout"):
        Harness(rootdir=tmp_path, profiles=["base"], startup_timeout=-1).start()
    with pytest.raises(ProfileError, match="no-such"):
        Harness(rootdir=tmp_path, sim=True).open_server("no-such")
    with pytest.raises(TypeError):
        Harness(Harness(rootdir=tmp_path).settings, sim=True)


def test_the_readme_script_runs_as_written(tmp_path: Path) -> None:
    """The README's ten lines, run in examples/ (the profiles of the README's third command), by plain Python."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## From a script or a notebook"):]
    code = section[section.index("```python\n") + 10:section.index("\n```", section.index("```python"))]
    assert len(code.splitlines()) <= 12, code
    check = "\nimport sys\nassert 'pytest' not in sys.modules and '_pytest' not in sys.modules\nprint('NO PYTEST')\n"
    out = subprocess.run([sys.executable, "-c", code + check], cwd=REPO / "examples", capture_output=True, text=True,
                         timeout=240, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NO PYTEST" in out.stdout
    startup, tok_s = out.stdout.split()[:2]
    assert float(startup) > 0 and float(tok_s) > 0, out.stdout
