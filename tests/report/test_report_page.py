"""What a person reads of a session, through real pytest runs on the simulator: the HTML page (verdicts in
colour at the top, each test's outcome, the A/B results with their plot, the baseline on the throughput chart,
links to the server logs, nothing external), a server that died mid-session shown as such, where each report
went, and what recording an A/A run did."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from helpers import profile_toml

FAST = "startup_seconds = 0.2, decode_tok_s = 400, ttft_ms = 5"
SLOW = "startup_seconds = 0.2, decode_tok_s = 200, ttft_ms = 5"
WORKLOAD = "num_requests=8, concurrency=8, input_len=16, output_len=24"

TESTS = f'''
import pytest

def test_bench(sglang_bench, sglang_baseline):
    sglang_baseline.check(sglang_bench({WORKLOAD}, rounds=3), output_throughput="50%", max_cv="off")

@pytest.mark.sglang_ab("main", "slow")
def test_slow_regresses(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=8).check(output_throughput="5%", max_cv="off")

@pytest.mark.sglang_ab("main", "slow")
def test_unchecked(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=3)
'''


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--sglang-sim", "-rs", *args, timeout=240)


def test_html_page_puts_verdicts_first_with_ab_plots_baseline_and_log_links(pytester: pytest.Pytester,
                                                                             mark: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=FAST) + profile_toml("slow", mark, sim=SLOW))
    pytester.makepyfile(test_page=TESTS)
    _run(pytester, "--sglang-profile=main", "--sglang-update-baseline", "-k", "test_bench").assert_outcomes(passed=1)
    report = pytester.path / "out" / "report.json"
    result = _run(pytester, "--sglang-profile=main,slow", f"--sglang-report={report}",
                  f"--sglang-log-dir={pytester.path / 'out' / 'logs'}")
    result.assert_outcomes(passed=3, failed=1)
    data = json.loads(report.read_text())
    page = report.with_suffix(".html").read_text()

    # The run's gate first, in its colour, then each regressed or not judged test with its reason.
    assert data["gate"]["status"] == "regressed"
    assert page.index('<div class="banner verdict-regressed" id="gate"><b>REGRESSED</b>') < page.index("<h2>")
    for item in data["gate"]["regressed"]:
        assert '<li class="verdict-regressed"><span class="badge verdict-regressed">REGRESSED</span> ' in page
        assert item["reason"].replace("'", "&#x27;") in page
    for gate in {b["gate"] for p in data["profiles"].values() for b in p["benchmarks"]} - {None}:
        assert f'class="badge verdict-{gate}"' in page
    for css in (".verdict-regressed{", ".verdict-not-judged{", ".verdict-passed{"):
        assert css in page

    # Each test's outcome.
    tests = page[page.index("<h2>Tests</h2>"):page.index("</table>", page.index("<h2>Tests</h2>"))]
    assert '<td>test_page.py::test_slow_regresses</td><td class="outcome-failed">failed</td>' in tests
    assert '<td>test_page.py::test_bench[main]</td><td class="outcome-passed">passed</td>' in tests

    # The A/B results: ratio, interval, p, pairs, verdict, message, and the paired ratios with the tolerance line.
    section = page[page.index("<h2>A/B comparisons</h2>"):page.index("<h2>Benchmarks</h2>")]
    assert section.count('<div class="card ab">') == len(data["ab"]) == 2
    regressed = next(a for a in data["ab"] if a["gate"] == "regressed")
    check = regressed["checks"][0]["checks"][0]
    ci = check["ci"]
    for shown in (f"{check['ratio']:.3f}x", f"95% CI {ci[0]:.3f}-{ci[1]:.3f}", f"{check['p_value']:.3f}",
                  f">{check['pairs']}<", check["message"].replace("'", "&#x27;")):
        assert shown in section, shown
    (card,) = [c for c in section.split('<div class="card ab">') if "REGRESSED</span> slow vs main" in c]
    assert card.count('class="tolerance-line"') == 1 and 'tolerance 0.95x' in card
    assert card.count('<circle class="pair"') == regressed["pairs"] == 8
    assert "not checked (the test called no check())" in section  # the unchecked run: its ratio, no verdict

    # The baseline's value on the throughput chart.
    base = data["profiles"]["main"]["benchmarks"][0]["baseline"]["output_throughput"]["baseline"]
    assert f"(baseline {base:.1f})" in page and 'class="baseline"' in page

    # Links to the server logs, relative to the page where the logs lie beside it; nothing external, no script.
    links = re.findall(r'<a href="([^"]+)">(\w+)\.log</a>', page)
    assert {name for _, name in links} == {"main", "slow"}
    for href, _name in links:
        assert not href.startswith(("file:", "/")) and (report.parent / unquote(href)).is_file(), href
    assert "<script" not in page
    assert not re.findall(r'(?:src|href)="(?:https?:)?//', page)


def test_dead_server_row_report_paths_and_step_summary(pytester: pytest.Pytester, mark: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    pytester.makefile(".toml", pyproject=profile_toml("dying", mark, sim=f"{FAST}, crash_after_requests = 4"))
    pytester.makepyfile(test_dead=f'''
import time

import requests

def test_bench(sglang_server, sglang_bench):
    sglang_bench(num_requests=4, concurrency=2, input_len=16, output_len=24, warmup=0)  # its 4th request: the crash
    for _ in range(600):  # until the server is gone
        try:
            requests.get(sglang_server.url("/health"), timeout=2)
        except requests.ConnectionError:
            break
        time.sleep(0.1)
    sglang_bench({WORKLOAD})
''')
    result = _run(pytester, "--sglang-profile=dying", "--sglang-report=out/report.json", "--junitxml=out/junit.xml")
    result.assert_outcomes(failed=1)
    rows = [line for line in result.outlines if line.startswith("dying ") and "test_bench" in line]
    assert len(rows) == 2, result.outlines
    measured, dead = (re.split(r"\s{2,}", row.strip()) for row in rows)
    assert "server died" not in rows[0] and float(measured[3].split()[0]) > 0  # before the crash: a measurement
    assert re.fullmatch(r"server died \(\d+ requests failed\)", dead[3]), dead
    assert dead[4:] == ["-", "-", "-", "-", "server died"], dead
    assert "client-bound" not in rows[1]
    data = json.loads((pytester.path / "out" / "report.json").read_text())
    first, bench = data["profiles"]["dying"]["benchmarks"]
    assert first["server_died"] is None
    assert bench["server_died"] and bench["server_died"] == data["profiles"]["dying"]["died"]
    assert bench["gate"] == "not-judged" and bench["gate_reason"].startswith("the server died during this benchmark")
    page = (pytester.path / "out" / "report.html").read_text()
    assert "server died: no figure" in page and "server died during the session" in page
    assert f"| {dead[3]} |" in summary.read_text()

    # Where each report went, at the end of the summary.
    end = result.outlines[result.outlines.index(rows[1]):]
    for line in (f"sglang JSON report: {pytester.path / 'out' / 'report.json'}",
                 f"sglang HTML report: {pytester.path / 'out' / 'report.html'}",
                 f"sglang step summary appended to {summary}",
                 f"sglang junit properties: {pytester.path / 'out' / 'junit.xml'}"):
        assert line in end, (line, end)
    assert Path(pytester.path / "out" / "junit.xml").is_file()


def test_recording_an_aa_run_says_it_was_stored_and_how_many(pytester: pytest.Pytester, mark: str) -> None:
    pytester.makefile(".toml", pyproject=profile_toml("main", mark, sim=FAST) + profile_toml("twin", mark, sim=FAST))
    pytester.makepyfile(test_aa=f'''
import pytest

@pytest.mark.sglang_ab("main", "twin")
def test_aa(sglang_ab):
    sglang_ab({WORKLOAD}, rounds=2)
''')
    for count in (1, 2):
        result = _run(pytester, "--sglang-profile=main,twin", "--sglang-update-baseline")
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines([f"note: A/A run twin vs main stored: {count} A/A run{'s' if count > 1 else ''} "
                                     f"of this workload now stored for * in {pytester.path / '.sglang-baselines.json'}"
                                     f"; {5 - count} more before they judge A/B checks of this workload"])


def test_history_steps_in_the_summary_step_summary_and_page(pytester: pytest.Pytester, mark: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Four sessions of the simulator, then five of one four times slower at decoding (one spare: a loaded host can
    make a run client-bound, which the history leaves out): the last run's summary, step summary and page show each
    step found and each series."""
    for name in ("PYTEST_SGLANG_COMMIT", "GITHUB_SHA"):
        monkeypatch.delenv(name, raising=False)
    summary = pytester.path / "step-summary.md"
    pytester.makefile(".toml", pyproject=profile_toml("p", mark, sim=FAST))
    pytester.makepyfile(test_hist=f'''
def test_tok_s(sglang_bench):
    sglang_bench({WORKLOAD}, rounds=2)
''')
    history, report = pytester.path / "h.sqlite", pytester.path / "report.json"
    for i in range(9):
        if i == 4:
            toml = pytester.path / "pyproject.toml"
            toml.write_text(toml.read_text().replace("decode_tok_s = 400", "decode_tok_s = 100"))
        monkeypatch.setenv("PYTEST_SGLANG_COMMIT", f"c{i + 1}")
        if i == 8:
            monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
        result = _run(pytester, "--sglang-profile=p", f"--sglang-history={history}", f"--sglang-report={report}")
        result.assert_outcomes(passed=1)
    section = json.loads(report.read_text())["history"]
    steps = section["steps"]
    assert any(s["metric"] == "output_throughput" and s["status"] == "regressed" for s in steps), section
    runs = max(s["runs"] for s in section["series"])

    # The terminal summary: where the run went, the series' length, one line per step.
    from pytest_sglang.report.tables import step_line

    head = (f"history {history}: run 9 appended (commit c9); p / test_hist.py::test_tok_s: {runs} runs; "
            f"{len(steps)} step{'s' if len(steps) != 1 else ''} found")
    assert head in result.outlines, result.outlines
    tok = next(s for s in steps if s["metric"] == "output_throughput")
    line = f"history: {step_line(tok)}"
    assert line in result.outlines
    assert re.fullmatch(r"history: output_throughput stepped down \d+\.\d % at run \d+ \(commit c\d, p=[\d.e-]+\) "
                        r"\[p / test_hist\.py::test_tok_s\]: regressed", line), line

    # $GITHUB_STEP_SUMMARY: the same head line, a table row per step.
    md = summary.read_text()
    assert "#### Run history" in md and head in md
    assert len([r for r in md.splitlines() if r.startswith("| median_") or r.startswith("| output_")
                or r.startswith("| request_")]) == len(steps)

    # The page: each series plotted, a point per run, a marker per step, the segments' medians between them.
    page = report.with_suffix(".html").read_text()
    part = page[page.index("<h2>Run history</h2>"):page.index("<h2>Benchmarks</h2>")]
    charts = part.split('<svg xmlns="http://www.w3.org/2000/svg"')[1:]
    assert len(charts) == len(section["series"])
    assert part.count('class="step-marker"') == len(steps)
    assert part.count('<circle class="run"') == sum(s["runs"] for s in section["series"])
    for chart in charts:
        markers = chart.count('class="step-marker"')
        assert chart.count('class="step-segment"') == (markers + 1 if markers else 0)
