"""The watcher's fast path (lines no rule can act on skip the extractor and the phase rules) and LogTail's plain-
chunk path must change no result: each is checked against the slow path on real and synthetic logs."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from pytest_sglang.kinds import GENERIC, KINDS, SGLANG, VLLM, Kind
from pytest_sglang.watch import (
    _CHAIN,
    _EXCEPTION_IGNORED,
    _FRAME,
    _LINE_BREAK,
    _STRONG_LAST,
    LogTail,
    LogWatcher,
    RootCauseExtractor,
    _source_of,
    clean_line,
    required_literals,
    strip_prefixes,
)

REPO = Path(__file__).resolve().parents[2]


def _sample_logs() -> list[Path]:
    logs = sorted((REPO / "tests" / "integration" / "logs").glob("*.log"))
    shared = REPO.parent / "shared" / "samples" / "logs"
    if shared.is_dir():
        logs += sorted(shared.glob("*.log"))
    return logs


LOGS = _sample_logs()
TRICKY = [
    "", " ", "[", "(", "[]", "()", "[2025-01-01 00:00:00 TP1]x",
    "[2025-01-01 00:00:00 TP1] [2025-01-01 00:00:00 TP2] x",
    "(Worker pid=3)x", "(Worker pid=3) (Other pid=4) x", "(RayWorkerWrapper pid=3, ip=10.0.0.1) INFO x",
    "INFO 03-07 12:29:02 __init__.py:190] (EngineCore pid=1) x", "INFO x", "INFOx", "WARNING 03-07 12:29:02 x",
    "ERROR 2025-04-07T19:13:52.541718006Z [2025-04-07 19:13:52 TP3] Received sigquit",
    "2025-04-07T19:13:52Z stdout F [2025-04-07 19:13:52 DP0 TP1] x", "\u0663\u0660\u0662\u0665-01-01 00:00:00 x",
    "sglang-1  | [2025-01-01 00:00:00 TP0] x", "sglang-1 | x", "Capturing batches (bs=8):  50%|#####     | 1/2",
    "é[2025-01-01 00:00:00 TP0] x", "\t[2025-01-01 00:00:00 TP0] x",
]


def _lines(path: Path) -> list[str]:
    return _LINE_BREAK.split(path.read_bytes().decode("utf-8", "replace"))


def test_source_of_is_strip_prefixes_source() -> None:
    lines = [line for log in LOGS for line in _lines(log)] + TRICKY
    assert len(lines) > len(TRICKY)
    for line in lines:
        assert _source_of(line) == strip_prefixes(line)[0], line


def test_required_literals() -> None:
    assert required_literals(r"\d+%") == (frozenset({"%"}), False)
    assert required_literals(r"\d+") is None
    assert required_literals(r"a?b*") is None
    assert required_literals(r"(?:foo|ba)r?") == (frozenset({"foo", "ba"}), False)
    # i and s are left out of folded literals (dotless i, long s): "load", "ng ", "hard" remain; the first wins
    assert required_literals(r"(?i)Loading shards") == (frozenset({"load"}), True)
    assert required_literals(r"(?i)ssk") is None  # s and k have non-ASCII case-insensitive matches
    assert required_literals(r"x(?i:abc)y") is not None  # scoped flags: only the plain parts count
    assert required_literals(r"[Ww]atchdog timeout") == (frozenset({"atchdog timeout"}), False)


def _rules() -> list[re.Pattern[str]]:
    pats: list[re.Pattern[str]] = [_FRAME, _CHAIN, _STRONG_LAST, _EXCEPTION_IGNORED]
    for kind in KINDS.values():
        pats += [r.pattern for r in kind.phases] + list(kind.fatal_markers)
        if kind.ready_pattern:
            pats.append(re.compile(kind.ready_pattern))
        if kind.progress_pattern is not None:
            pats.append(kind.progress_pattern)
    return pats


@pytest.mark.parametrize("pattern", _rules(), ids=lambda p: p.pattern[:40])
def test_required_literals_are_sound_on_the_samples(pattern: re.Pattern[str]) -> None:
    req = required_literals(pattern)
    assert req is not None, "every rule shipped has literals: else the fast path is off"
    literals, folded = req
    for log in LOGS:
        for line in _lines(log):
            for text in {line, strip_prefixes(line)[2].strip()}:
                if pattern.search(text):
                    hay = text.lower() if folded else text
                    assert any(lit in hay for lit in literals), (pattern.pattern, text)


def _slow(watcher: LogWatcher) -> LogWatcher:
    watcher._needles = None
    watcher._extractor._grouped_needles = None
    return watcher


def _outcome(w: LogWatcher) -> dict:
    ex = w._extractor
    return {
        "causes": w.root_causes(), "phases": w.phases, "label": w.phase_label, "ready": w.ready_at,
        "failing": w.failing_since, "progress": w.progress, "last": list(w._last), "seen": w.lines_seen,
        "owner": ex._owner, "keys": list(ex._prev_body), "closed": list(ex._last_closed),
        "ignored": [k for k, v in ex._prev_body.items() if _EXCEPTION_IGNORED.match(v)],
    }


def _synthetic(rng: random.Random) -> list[str]:
    """Many sources (more than the extractor keeps), mostly benign lines, with every kind of traceback."""
    prefixes = [
        lambda: f"[2025-01-01 00:00:{rng.randint(0, 59):02d} TP{rng.randint(0, 90)}] ",
        lambda: "[2025-01-01 00:00:01] ",
        lambda: f"(Worker_TP{rng.randint(0, 80)} pid={rng.randint(1, 99)}) ", lambda: "", lambda: "",
        lambda: "(EngineCore pid=1) ERROR 11-30 22:19:53 [core.py:700] ", lambda: f"sglang-{rng.randint(1, 70)}  | ",
    ]
    benign = ["Decode batch. #running-req: 5, #token: 100, gen throughput (token/s): 12.5", "",
              "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]",
              'INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK', "some noise", "    indented noise"]
    events = ["Traceback (most recent call last):", '  File "/x/y.py", line 12, in f', "    return g(x)",
              "KeyError: 'layers.0'", "RuntimeError: CUDA error", "Exception ignored in: <function f>",
              "During handling of the above exception, another exception occurred:", "    ^^^^^^^^",
              "launch_server.py: error: unrecognized arguments: --foo", "  | ValueError: x", "KeyboardInterrupt",
              "Received sigquit from a child process.", "Load weight begin.",
              "The server is fired up and ready to roll!"]
    p = rng.choice([0.6, 0.95, 0.995])
    return [rng.choice(prefixes)() + (rng.choice(benign) if rng.random() < p else rng.choice(events))
            for _ in range(rng.randint(100, 3000))]


@pytest.mark.parametrize("kind", [SGLANG, VLLM, GENERIC], ids=lambda k: k.name)
def test_fast_path_changes_nothing(kind: Kind) -> None:
    cases = [_lines(log) for log in LOGS] + [_synthetic(random.Random(seed)) for seed in range(40)]
    for n, lines in enumerate(cases):
        rng = random.Random(n)
        fast, slow = LogWatcher(kind, started_at=0.0), _slow(LogWatcher(kind, started_at=0.0))
        assert fast._needles is not None and fast._extractor._grouped_needles is not None
        pos, now = 0, 0.0
        while pos < len(lines):
            step = rng.choice([1, 3, 50, 1000])
            now += 1.0
            fast.feed(lines[pos:pos + step], now)
            slow.feed(lines[pos:pos + step], now)
            pos += step
            assert _outcome(fast) == _outcome(slow), (n, pos)


def test_skipped_line_ends_an_exception_ignored_context() -> None:
    """'Exception ignored in' makes the next traceback of that source soft, but only when adjacent."""
    lines = ["[2025-01-01 00:00:00 TP0] Exception ignored in: <function f>",
             "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 5",  # skipped by the fast path
             "[2025-01-01 00:00:00 TP0] Traceback (most recent call last):",
             '[2025-01-01 00:00:00 TP0]   File "/x.py", line 1, in f',
             "[2025-01-01 00:00:00 TP0] RuntimeError: boom"]
    for strip in (False, True):
        ex = RootCauseExtractor()
        evident = [ex.feed_line(line) for line in lines]
        assert evident[-1] is True  # a hard traceback: not the soft kind an ignored exception prints
        if strip:
            ex = RootCauseExtractor()
            ex._grouped_needles = None
            assert [ex.feed_line(line) for line in lines] == evident


def _reference_lines(data: bytes, max_chars: int) -> list[str]:
    def cut(p: str) -> str:
        return p if len(p) <= max_chars else p[: max_chars - 1] + "\u2026"

    parts = _LINE_BREAK.split(data.decode("utf-8", "replace"))
    return [clean_line(cut(p)) for p in parts[:-1]] + ([clean_line(cut(parts[-1]))] if parts[-1] else [])


@pytest.mark.parametrize("seed", range(30))
def test_logtail_plain_and_mixed_chunks_match_a_one_shot_split(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["plain line", "", "x" * 100, "é█ unicode", "a\u2028b", "c\x85d", "\x1b[31mred\x1b[0m", "nul\x00here",
              "tab\there", "\x0bvt", "\x1cfs"]
    seps = ["\n", "\r", "\r\n", "\n\n"]
    text = "".join(rng.choice(pieces) + rng.choice(seps) for _ in range(rng.randint(1, 400)))
    if rng.random() < 0.5:
        text += rng.choice(pieces)
    data = text.encode()
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    tail = LogTail(log, max_line_chars=64, chunk_size=rng.choice([1, 5, 64, 4096]))
    got: list[str] = []
    pos = 0
    with open(log, "ab") as f:
        while pos < len(data):
            step = rng.choice([1, 2, 3, 17, 500, 100000])
            f.write(data[pos:pos + step])
            f.flush()
            pos += step
            got += tail.read_lines()
    got += tail.flush()
    assert got == _reference_lines(data, 64)
