"""The rows of the fault matrix (benchmarks/fault_matrix.py, docs/reliability.md) that no other test covers, run
as the matrix runs them: a real pytest run through the plugin each, the user's line checked, 0 processes left.

The other rows cite their tests in docs/reliability.md (tests/test_lifecycle.py, test_scale.py,
launch/test_release.py, launch/test_tree_members.py, launch/test_private_logs.py, plugin/test_show.py)."""

from __future__ import annotations

import sys

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import fault_matrix  # noqa: E402

pytestmark = pytest.mark.timeout(120)

UNCOVERED = ["malformed-toml", "self-extends", "deaf-server", "setsid-grandchild", "log-garbage", "log-deleted",
             "log-1gb", "secrets"]
ROWS = {row.name: row for row in fault_matrix.ROWS}


@pytest.mark.parametrize("name", UNCOVERED)
def test_matrix_row(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fault_matrix, "BIG_LOG_BYTES", 128 << 20)  # the 1 GB run is the benchmark's
    result = fault_matrix.run_row(ROWS[name], keep=False)
    assert result.outcome.ok, result.outcome.sees
    assert not result.left, f"processes left: {result.left}"


def test_every_row_names_its_test() -> None:
    """Each row of the matrix cites the test that covers it, and the uncovered ones are here."""
    for row in fault_matrix.ROWS:
        assert row.covered_by.startswith("tests/"), row.name
        cited = [part.split(" (")[0].split("::")[0] for part in row.covered_by.split("; ")]
        assert all((REPO / path).is_file() for path in cited), row.covered_by
    assert {f"tests/test_fault_matrix.py::test_matrix_row[{n}]" for n in UNCOVERED} <= {
        part.split(" (")[0] for row in fault_matrix.ROWS for part in row.covered_by.split("; ")}
