"""The prefilter must change no result: the watcher reading blocks of raw bytes (passing over stretches that
hold no literal of a pending rule) is checked against every rule on every line, on real and synthetic logs
written in random pieces; LogTail's blocks against a one-shot split; and the cost is checked to stay off the
per-line path for a block no rule can act on."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from helpers import SAMPLES

from pytest_sglang.config.kinds import GENERIC, SGLANG, VLLM, Kind
from pytest_sglang.watch import LogTail, LogWatcher, RootCauseExtractor, clean_line
from pytest_sglang.watch.prefixes import source_of, strip_prefixes
from pytest_sglang.watch.tail import LINE_BREAK

REPO = Path(__file__).resolve().parents[2]


def _sample_logs() -> list[Path]:
    logs = sorted((REPO / "tests" / "integration" / "logs").glob("*.log"))
    logs += sorted(SAMPLES.glob("*.log"))
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
    return LINE_BREAK.split(path.read_bytes().decode("utf-8", "replace"))


def test_source_of_is_strip_prefixes_source() -> None:
    lines = [line for log in LOGS for line in _lines(log)] + TRICKY
    assert len(lines) > len(TRICKY)
    for line in lines:
        assert source_of(line) == strip_prefixes(line)[0], line


def _outcome(w: LogWatcher, now: float) -> dict:
    ex = w._extractor
    return {
        "causes": w.root_causes(), "phases": w.phases, "label": w.phase_label, "ready": w.ready_at,
        "failing": w.failing_since, "progress": w.progress, "progress_phase": w._progress_phase,
        "last": list(w._last), "seen": w.last_line_at, "usage": w.failure_is_usage_error, "status": w.status(now),
        "owner": ex._owner, "closed": list(ex._last_closed), "ignored": list(ex._ignored), "idle": ex.idle,
    }


def _synthetic(rng: random.Random) -> bytes:
    """Many sources (more than the extractor keeps), mostly benign lines, every kind of traceback, tqdm bars,
    colours and control characters, long lines, every line break."""
    prefixes = [
        lambda: f"[2025-01-01 00:00:{rng.randint(0, 59):02d} TP{rng.randint(0, 90)}] ",
        lambda: "[2025-01-01 00:00:01] ",
        lambda: f"(Worker_TP{rng.randint(0, 80)} pid={rng.randint(1, 99)}) ", lambda: "", lambda: "",
        lambda: "(EngineCore pid=1) ERROR 11-30 22:19:53 [core.py:700] ", lambda: f"sglang-{rng.randint(1, 70)}  | ",
    ]
    benign = ["Decode batch. #running-req: 5, #token: 100, gen throughput (token/s): 12.5", "",
              "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, 1.0it/s]",
              "Capturing batches (bs=8 avail_mem=1.0 GB):  50%|#####     | 1/2 [00:01<00:01, 1.0it/s]",
              'INFO:     127.0.0.1:5000 - "POST /generate HTTP/1.1" 200 OK', "some noise", "    indented noise",
              "x" * rng.choice([10, 70, 300]), "é█ unicode"]
    events = ["Traceback (most recent call last):", '  File "/x/y.py", line 12, in f', "    return g(x)",
              "KeyError: 'layers.0'", "RuntimeError: CUDA error", "Exception ignored in: <function f>",
              "During handling of the above exception, another exception occurred:", "    ^^^^^^^^",
              "launch_server.py: error: unrecognized arguments: --foo", "  | ValueError: x", "KeyboardInterrupt",
              "Received sigquit from a child process.", "Load weight begin.", "KV Cache is allocated.",
              "Application startup complete.", "The server is fired up and ready to roll!",
              "Error: No such option: --x", "\x1b[31mRuntimeError: red\x1b[0m",
              "Trace\x00back (most recent call last):",
              "Loading weights took 1.0 s", "Capture cuda graph begin.", "a\x85b", "ab\u2028cd"]
    seps = ["\n"] * 8 + ["\r", "\r\n"]
    p = rng.choice([0.6, 0.95, 0.995])
    out = []
    for _ in range(rng.randint(100, 3000)):
        body = rng.choice(benign) if rng.random() < p else rng.choice(events)
        out.append(rng.choice(prefixes)() + body + rng.choice(seps))
    if rng.random() < 0.5:
        out.append("last line without a break")
    return "".join(out).encode()


def _cases() -> list[bytes]:
    return [log.read_bytes() for log in LOGS] + [_synthetic(random.Random(seed)) for seed in range(40)]


def _replay(data: bytes, tmp_path: Path, rng: random.Random, watchers: list[tuple[LogWatcher, str]]) -> None:
    """Write `data` in random pieces; after each, every watcher reads ("poll": its tail; "feed": lines)."""
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    pos, now = 0, 0.0
    with open(log, "ab") as f:
        while True:
            final = pos >= len(data)
            if not final:
                step = rng.choice([1, 7, 300, 5000, 100000])
                f.write(data[pos:pos + step])
                f.flush()
                pos += step
            now += 1.0
            for w, how in watchers:
                assert w.tail is not None
                if how == "poll":
                    w.poll(now, final=final)
                else:
                    w.feed(w.tail.read_lines() + (w.tail.flush() if final else []), now)
            first = _outcome(watchers[0][0], now)
            for w, how in watchers[1:]:
                assert _outcome(w, now) == first, (how, pos)
            if final:
                return


@pytest.mark.parametrize("kind", [SGLANG, VLLM, GENERIC], ids=lambda k: k.name)
def test_fast_path_changes_nothing(kind: Kind, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    for n, data in enumerate(_cases()):
        rng = random.Random(n)
        tails = {"max_line_chars": rng.choice([16, 64, 8192]), "chunk_size": rng.choice([64, 4096, 1 << 20])}

        def make(prefilter: bool, tails: dict = tails, **kw: object) -> LogWatcher:
            return LogWatcher(kind, started_at=0.0, tail=LogTail(log, **tails), prefilter=prefilter, **kw)

        reference, fast = make(False), make(True)
        assert fast._every is not None
        _replay(data, tmp_path, rng, [(reference, "poll"), (fast, "poll"), (make(True), "feed")])
        # a profile's own ready pattern has no literals: every line is tested against it
        custom = r"fired up|startup complete\.|Listening"
        _replay(data, tmp_path, rng, [(make(False, ready_pattern=custom), "poll"),
                                       (make(True, ready_pattern=custom), "poll")])


def test_skipped_line_ends_an_exception_ignored_context() -> None:
    """'Exception ignored in' makes the next traceback of that source soft, but only when adjacent."""
    lines = ["[2025-01-01 00:00:00 TP0] Exception ignored in: <function f>",
             "[2025-01-01 00:00:00 TP0] Decode batch. #running-req: 5",  # holds no literal
             "[2025-01-01 00:00:00 TP0] Traceback (most recent call last):",
             '[2025-01-01 00:00:00 TP0]   File "/x.py", line 1, in f',
             "[2025-01-01 00:00:00 TP0] RuntimeError: boom"]
    for prefilter in (True, False):
        ex = RootCauseExtractor(prefilter=prefilter)
        evident = [ex.feed_line(line) for line in lines]
        assert evident[-1] is True  # a hard traceback: not the soft kind an ignored exception prints
        assert ex.idle


def test_a_block_no_rule_can_act_on_is_not_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost: of a serving log that holds no literal, only the last lines of each block are decoded."""
    decoded = 0
    split = LogTail.split

    def counting(self: LogTail, block: bytes) -> list[str]:
        nonlocal decoded
        decoded += len(block)
        return split(self, block)

    monkeypatch.setattr(LogTail, "split", counting)
    line = ("[2025-03-08 12:00:01 TP0] Decode batch. #running-req: 12, #token: 3000, token usage: 0.12, "
            "cuda graph: True, gen throughput (token/s): 1234.56, #queue-req: 0, \n")
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    w = LogWatcher(SGLANG, started_at=0.0, tail=LogTail(log))
    size = 0
    with open(log, "ab") as f:
        for i in range(50):
            piece = (line * 400).encode()
            f.write(piece)
            f.flush()
            size += len(piece)
            w.poll(float(i))
    assert decoded < size / 5, (decoded, size)
    assert w._extractor._owner == "TP0"
    assert list(w._last) == [line.rstrip("\n")] * w.LAST_LINES


def _reference_lines(data: bytes, max_chars: int) -> list[str]:
    def cut(p: str) -> str:
        return p if len(p) <= max_chars else p[: max_chars - 1] + "\u2026"

    parts = LINE_BREAK.split(data.decode("utf-8", "replace"))
    return [clean_line(cut(p)) for p in parts[:-1]] + ([clean_line(cut(parts[-1]))] if parts[-1] else [])


@pytest.mark.parametrize("seed", range(30))
def test_logtail_plain_and_mixed_chunks_match_a_one_shot_split(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    pieces = ["plain line", "", "x" * 100, "é█ unicode", "a\u2028b", "c\x85d", "\x1b[31mred\x1b[0m", "nul\x00here",
              "tab\there", "\x0bvt", "\x1cfs", "ü" * 40]
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
