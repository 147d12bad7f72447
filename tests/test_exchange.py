"""The results exchange of an xdist run: entries round-trip through files as their own types, and a reader never
takes in half an entry or a file that is not one."""

from __future__ import annotations

from pathlib import Path

from pytest_sglang.exchange import PublishedBench, PublishedOutputs, ResultsExchange


def test_entries_round_trip_as_their_types(tmp_path: Path) -> None:
    exchange = ResultsExchange(tmp_path / "results")
    assert exchange.entries() == []  # nothing published yet: no folder
    bench = PublishedBench("a", "test_x.py::test_tput", "test_x.py::test_tput[a]", {"output_throughput": 812.5})
    outputs = PublishedOutputs("b", [{"prompt": "hi", "text": " there", "token_ids": [1, 2]}])
    exchange.publish(bench)
    exchange.publish(outputs)
    other_worker = ResultsExchange(tmp_path / "results")
    assert other_worker.entries() == [bench, outputs]
    assert (tmp_path / "results").stat().st_mode & 0o077 == 0


def test_a_half_written_or_foreign_file_is_skipped(tmp_path: Path) -> None:
    exchange = ResultsExchange(tmp_path / "results")
    exchange.publish(PublishedOutputs("b", []))
    (tmp_path / "results" / "0-1.tmp").write_text('{"kind": "outputs", "prof')  # being written: not *.json
    (tmp_path / "results" / "0-2.json").write_text('{"kind": "weather", "profile": "b"}')
    (tmp_path / "results" / "0-3.json").write_text("not json")
    assert exchange.entries() == [PublishedOutputs("b", [])]
