"""What a session measured, as a JSON report, a terminal table, a GitHub step-summary table and an HTML page.

Knows nothing about pytest: it reads the session ledger (startup records, benchmark results, baseline
comparisons) when the plugin asks for the report at the end. The JSON schema is documented in docs/report-schema.md.

    build.py       the JSON report, written atomically;  junit.py  its figures as junitxml properties
    tables.py      the terminal summary, the step-summary markdown, the gate lines
    html.py        the HTML page: the gate in colour first, tests, A/B runs, benchmarks, servers and their logs
    abchart.py     an A/B run's paired ratios (or bracketed rounds) as SVG;  timeseries.py  telemetry over time

Every benchmark carries a ``gate`` (decided in baseline/gate.py; checks.py ``gate_of`` sums a benchmark):
``passed``, ``regressed``, ``not-judged`` (failed requests, a client-bound run, too noisy to judge, no baseline;
with ``gate_reason``), ``recorded``, or null when nothing was checked; a profile whose server could not start
is ``not-judged`` too. The report's top-level ``gate`` lists what regressed and what could not be judged, so a
CI job can block on the first and warn on the second; the terminal summary, the step summary and junitxml
(``sglang_gate``) say the same.
"""

from pytest_sglang.report.build import SCHEMA, SCHEMA_VERSION, build_report, summarize, write_json
from pytest_sglang.report.html import html_page, sweep_svg, write_html
from pytest_sglang.report.junit import (
    HEADLINE,
    ab_properties,
    check_properties,
    junit_properties,
    startup_failure_properties,
)
from pytest_sglang.report.tables import append_step_summary, gate_lines, markdown, terminal_lines

__all__ = [
    "HEADLINE", "SCHEMA", "SCHEMA_VERSION", "ab_properties", "append_step_summary", "build_report", "check_properties",
    "gate_lines", "html_page", "junit_properties", "markdown", "startup_failure_properties", "summarize", "sweep_svg",
    "terminal_lines", "write_html", "write_json",
]
