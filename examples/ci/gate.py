#!/usr/bin/env python3
"""The CI verdict of pytest-sglang runs: block on regressions and real test failures, warn on infrastructure.

    python gate.py [--infra-exit N] [--format auto|github|plain] DIR [DIR ...]

Each DIR is one pytest run's artifact folder, as run-gpu-ci.sh and github-gpu.yml lay it out:

    DIR/report.json    --sglang-report (its "gate" fields: docs/report-schema.md)
    DIR/junit.xml      --junitxml (each test's outcome and its sglang_gate property)
    DIR/pytest-exit    pytest's exit code, one number (optional)

What blocks (exit 1):
  - every entry of the report's gate.regressed (a checked figure past its tolerance, and significant);
  - every failed test, except a test that could not run because its server could not start: a junit <error>
    "failed on setup" whose sglang_gate property is not-judged. So a server that died mid-session, a benchmark
    whose requests failed, an assertion, and a not-judged check made fatal by --sglang-baseline-strict all block;
  - pytest exiting 2 (interrupted, collection errors), 3 (internal error), 4 (usage error, e.g. an unknown
    profile) or 5 (no tests ran), and a run that left no report.
What warns (exit --infra-exit, default 0):
  - every entry of the report's gate.not_judged: the server could not start, too noisy to judge, client-bound,
    no baseline for this machine, failed requests (those also failed their test, which blocks);
  - the tests that did not run because their server could not start (one line per profile).
Otherwise exit 0. Nothing here reads pytest's terminal output.

Annotations are GitHub's ``::error::``/``::warning::`` commands under GitHub Actions (or --format github), else
``ERROR:``/``WARNING:`` lines. Under GitHub Actions the verdict is also appended to $GITHUB_STEP_SUMMARY, below
the table the plugin wrote there. Standard library only: copy this file next to your workflow.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

BLOCKING_PYTEST_EXITS = {2: "interrupted or collection errors", 3: "internal error", 4: "usage error",
                         5: "no tests ran"}


@dataclass
class Verdict:
    errors: list[tuple[str, str]] = field(default_factory=list)  # (title, message): blocks
    warnings: list[tuple[str, str]] = field(default_factory=list)  # (title, message): warns
    notices: list[tuple[str, str]] = field(default_factory=list)
    regressed: int = 0
    failed_tests: int = 0
    not_judged: int = 0
    passed: int = 0
    recorded: int = 0  # a --update-baseline run's benchmarks


def _first_line(text: str | None, limit: int = 300) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _junit_cases(path: Path) -> list[tuple[str, str | None, str | None, list[str]]]:
    """(test name, "failure"|"error"|None, message, its sglang_gate values) for every testcase."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = "::".join(p for p in (case.get("classname"), case.get("name")) if p)
        gates = [p.get("value") or "" for p in case.iter("property") if p.get("name") == "sglang_gate"]
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is None:
            cases.append((name, None, None, gates))
        else:
            cases.append((name, bad.tag, bad.get("message") or bad.text or "", gates))
    return cases


def judge_run(folder: Path, v: Verdict) -> None:
    label, errors_before = folder.name, len(v.errors)
    exit_file = folder / "pytest-exit"
    code = int(exit_file.read_text().strip() or 1) if exit_file.is_file() else None
    if code in BLOCKING_PYTEST_EXITS:
        v.errors.append((f"pytest failed ({label})", f"pytest exited {code}: {BLOCKING_PYTEST_EXITS[code]}; "
                         f"see {folder / 'pytest.log'}"))
    elif code not in (None, 0, 1):
        v.errors.append((f"pytest failed ({label})", f"pytest exited {code} (killed or crashed?)"))

    report_path = folder / "report.json"
    try:
        report = json.loads(report_path.read_text())
        gate = report.get("gate") or {}
    except (OSError, ValueError) as exc:
        if code != 0:  # nothing says why pytest did not pass: a blocking failure, never a silent pass
            v.errors.append((f"no report ({label})", f"{report_path}: {exc}"))
        report, gate = {}, {}
    for item in gate.get("regressed") or []:
        v.regressed += 1
        v.errors.append((f"regression ({item['profile']})", f"{item.get('nodeid') or item['test_id']}: "
                         f"{_first_line(item.get('reason'))}"))
    for item in gate.get("not_judged") or []:
        v.not_judged += 1
        v.warnings.append((f"not judged ({item['profile']})", f"{item.get('nodeid') or item['test_id']}: "
                           f"{_first_line(item.get('reason'))}"))
    v.passed += int(gate.get("passed") or 0)
    v.recorded += int(gate.get("recorded") or 0)
    for prof in (report.get("profiles") or {}).values():
        for bench in prof.get("benchmarks") or []:
            for note in bench.get("notes") or []:
                v.notices.append((f"note ({bench.get('nodeid')})", _first_line(note)))

    junit_path = folder / "junit.xml"
    try:
        cases = _junit_cases(junit_path)
    except (OSError, ET.ParseError) as exc:
        if code != 0:
            v.errors.append((f"no junit ({label})", f"{junit_path}: {exc}: cannot tell failed tests apart"))
        return
    not_started = 0
    for name, kind, message, gates in cases:
        if kind is None:
            continue
        if "regressed" in gates:
            continue  # already an error above, from the report
        if kind == "error" and (message or "").startswith("failed on setup") and "not-judged" in gates:
            not_started += 1  # its server could not start: the report's not_judged says why, once
            continue
        v.failed_tests += 1
        v.errors.append((f"test failed ({label})", f"{name}: {_first_line(message)}"))
    if not_started:
        v.warnings.append((f"tests not run ({label})", f"{not_started} test(s) did not run: their server could "
                           "not start (infrastructure: not a regression)"))
    if code == 1 and len(v.errors) == errors_before and not not_started:
        v.errors.append((f"pytest failed ({label})", "pytest exited 1 but no test failed in junit.xml"))


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def emit(v: Verdict, github: bool) -> None:
    for kind, items in (("error", v.errors), ("warning", v.warnings), ("notice", v.notices)):
        for title, message in items:
            if github:
                print(f"::{kind} title={_escape(title, prop=True)}::{_escape(message)}")
            else:
                print(f"{kind.upper()}: {title}: {message}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="artifact folders (report.json, junit.xml, pytest-exit)")
    ap.add_argument("--infra-exit", type=int, default=int(os.environ.get("SGLANG_CI_INFRA_EXIT") or 0),
                    help="exit code when only infrastructure outcomes were seen (default 0, or "
                         "$SGLANG_CI_INFRA_EXIT): e.g. 3 with GitLab's allow_failure:exit_codes or Buildkite's "
                         "soft_fail to show the job amber")
    ap.add_argument("--format", choices=("auto", "github", "plain"), default="auto")
    args = ap.parse_args(argv)
    github = args.format == "github" or (args.format == "auto" and os.environ.get("GITHUB_ACTIONS") == "true")

    v = Verdict()
    for folder in args.dirs:
        judge_run(folder, v)
    emit(v, github)
    if v.errors:
        status, code = "BLOCKED", 1
    elif v.warnings:
        status, code = "PASSED WITH WARNINGS (infrastructure, not judged)", args.infra_exit
    else:
        status, code = "PASSED", 0
    line = (f"ci gate: {status}: {v.regressed} regressed, {v.failed_tests} failed test(s), "
            f"{v.not_judged} not judged, {v.passed} passed" + (f", {v.recorded} recorded" if v.recorded else "")
            + f" -> exit {code}")
    print(line)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if github and summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(f"\n**{line}**\n\n" + "".join(f"- {kind}: {t}: {m}\n" for kind, items in
                                                 (("error", v.errors), ("warning", v.warnings))
                                                 for t, m in items))
    return code


if __name__ == "__main__":
    sys.exit(main())
