"""LogTail: incremental, never re-reading, bounded-memory reading of a growing log file."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from pytest_sglang.watch import LogTail


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_missing_file_then_created(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    assert tail.read_lines() == []
    assert tail.flush() == []
    _append(log, b"hello\n")
    assert tail.read_lines() == ["hello"]


def test_appends_across_calls_and_partial_line(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    _append(log, b"one\ntw")
    assert tail.read_lines() == ["one"]
    assert tail.read_lines() == []
    _append(log, b"o\nthree\nfou")
    assert tail.read_lines() == ["two", "three"]
    _append(log, b"r")
    assert tail.read_lines() == []
    assert tail.flush() == ["four"]
    assert tail.flush() == []


def test_blank_lines_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"a\n\nb\n")
    assert LogTail(log).read_lines() == ["a", "", "b"]


def test_carriage_returns_split_lines_and_crlf_counts_once(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    _append(log, b"bar:  0%| 0/4\rbar: 50%| 2/4\rbar:100%| 4/4\n")
    assert tail.read_lines() == ["bar:  0%| 0/4", "bar: 50%| 2/4", "bar:100%| 4/4"]
    _append(log, b"windows\r\nline\r")  # \r\n is one break, even when split across reads
    assert tail.read_lines() == ["windows", "line"]
    _append(log, b"\nnext\n")
    assert tail.read_lines() == ["next"]


def test_multibyte_character_split_across_reads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    text = "caf\u00e9 \u20ac \U0001f680 \u2588\u2588\n".encode()
    for i in range(len(text)):  # one byte per call: every character is cut somewhere
        _append(log, text[i : i + 1])
        got = tail.read_lines()
        if i < len(text) - 1:
            assert got == []
        else:
            assert got == ["caf\u00e9 \u20ac \U0001f680 \u2588\u2588"]


def test_multibyte_split_across_internal_chunks(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(("\u20ac" * 100 + "\n").encode())
    assert LogTail(log, chunk_size=7).read_lines() == ["\u20ac" * 100]


def test_invalid_utf8_is_replaced_not_fatal(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"ok \xff\xfe bad\nnext \xe2\x82\n")  # garbage, then a truncated 3-byte sequence
    lines = LogTail(log).read_lines()
    assert lines[0] == "ok \ufffd\ufffd bad"
    assert lines[1].startswith("next ") and "\ufffd" in lines[1]


def test_dangling_partial_character_at_flush(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"end \xe2\x82")
    tail = LogTail(log)
    assert tail.read_lines() == []
    assert tail.flush() == ["end \ufffd"]


def test_ansi_escapes_are_stripped(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(
        b"\x1b[1;33mwarning\x1b[0m text\n"
        b"\x1b]0;title\x07after osc\n"
        b"\x1b[2K\x1b[1A[2025-01-01 00:00:00 TP0] Load weight begin.\n"
    )
    assert LogTail(log).read_lines() == [
        "warning text",
        "after osc",
        "[2025-01-01 00:00:00 TP0] Load weight begin.",
    ]


def test_ansi_sequence_split_across_reads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    _append(log, b"\x1b[1;3")
    assert tail.read_lines() == []
    _append(log, b"1mred\x1b[0m\n")
    assert tail.read_lines() == ["red"]


def test_overlong_line_is_truncated(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 10_000 + b"\nshort\n")
    lines = LogTail(log, max_line_chars=100).read_lines()
    assert len(lines[0]) == 100 and lines[0].endswith("\u2026") and lines[0].startswith("x" * 99)
    assert lines[1] == "short"


def test_huge_single_line_memory_is_bounded(tmp_path: Path) -> None:
    log = tmp_path / "huge.log"
    size = 100 << 20
    block = b"A" * (1 << 20)
    with open(log, "wb") as f:
        f.write(b"before\n")
        for _ in range(size >> 20):
            f.write(block)
        f.write(b"\nafter\n")
    tail = LogTail(log, max_line_chars=8192, max_read_bytes=256 << 20)
    tracemalloc.start()
    try:
        lines = tail.read_lines()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert lines[0] == "before"
    assert len(lines[1]) == 8192 and lines[1].endswith("\u2026")
    assert lines[2] == "after"
    assert len(lines) == 3
    assert peak < 16 << 20, f"peak {peak} bytes while reading a 100 MB line"
    assert tail.position == log.stat().st_size


def test_read_is_limited_per_call(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(b"line %04d\n" % i for i in range(1000)))  # 10 bytes a line
    tail = LogTail(log, chunk_size=64, max_read_bytes=1000)
    first = tail.read_lines()
    assert tail.position == 1000
    assert first == [f"line {i:04d}" for i in range(100)]
    rest: list[str] = []
    for _ in range(20):
        rest += tail.read_lines()
    assert rest == [f"line {i:04d}" for i in range(100, 1000)]


def test_never_rereads(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    total = 0
    seen: list[str] = []
    for i in range(50):
        data = f"line {i}\n".encode()
        _append(log, data)
        total += len(data)
        seen += tail.read_lines()
        assert tail.position == total
        assert tail.bytes_read == total
    assert seen == [f"line {i}" for i in range(50)]
    # Overwrite bytes that were already read: a re-reading tail would report them again.
    with open(log, "r+b") as f:
        f.write(b"XXXX")
    _append(log, b"new\n")
    assert tail.read_lines() == ["new"]
    assert tail.bytes_read == total + 4


def test_truncated_file_is_read_again_from_start(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    tail = LogTail(log)
    log.write_bytes(b"first run line 1\nfirst run line 2\n")
    assert len(tail.read_lines()) == 2
    log.write_bytes(b"second\n")  # truncated and rewritten, shorter than before
    assert tail.read_lines() == ["second"]


def test_flush_skips_the_middle_of_a_huge_remainder(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(b"line %04d\n" % i for i in range(1000)) + b"Killed")
    tail = LogTail(log, chunk_size=64, max_read_bytes=1000)
    lines = tail.flush()
    assert any("bytes of log skipped" in line for line in lines)
    assert lines[-1] == "Killed"
    assert lines[-2] == "line 0999"
    assert len(lines) < 120
