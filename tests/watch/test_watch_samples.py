"""Every real log in tests/samples/logs through the watcher: the sidecar says what must come out."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES

from pytest_sglang.config.kinds import SGLANG, VLLM, Kind
from pytest_sglang.watch import LogTail, LogWatcher, extract_root_causes

SIDECARS = sorted(SAMPLES.glob("*.json"))

# The headline must be the exception or argparse error line itself.
_EXCEPTION_HEADLINE = re.compile(r"^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?::\s.*)?$")
_ARGPARSE_HEADLINE = re.compile(r"^\S[^:]*: error: \S")
_BENIGN = re.compile(r"Ignore import error|error_count=|UserWarning|can be ignored")


def _kind_for(sidecar: Path, text: str) -> Kind:
    return VLLM if "vllm" in sidecar.name.lower() else SGLANG


def _load(sidecar: Path) -> tuple[dict[str, Any], Path]:
    meta = json.loads(sidecar.read_text(encoding="utf-8"))
    return meta, sidecar.with_suffix(".log")


def _replay(log: Path, kind: Kind, tmp_path: Path, *, seed: int) -> tuple[LogWatcher, LogTail]:
    """Write the sample into a growing file in random pieces, polled as the readiness loop does."""
    data = log.read_bytes()
    live = tmp_path / log.name
    live.write_bytes(b"")
    tail = LogTail(live)
    watcher = LogWatcher(kind, started_at=100.0, tail=tail)
    rng = random.Random(seed)
    pos, now = 0, 100.0
    with open(live, "ab") as f:
        while pos < len(data):
            step = rng.randint(1, 700)
            f.write(data[pos : pos + step])
            f.flush()
            pos += step
            now += 0.25
            watcher.poll(now)
    watcher.poll(now + 0.25, final=True)
    return watcher, tail


@pytest.mark.parametrize("sidecar", SIDECARS, ids=[p.stem for p in SIDECARS])
def test_sample(sidecar: Path, tmp_path: Path) -> None:
    meta, log = _load(sidecar)
    text = log.read_text(encoding="utf-8", errors="replace")
    kind = _kind_for(sidecar, text)
    watcher, tail = _replay(log, kind, tmp_path, seed=len(text))
    assert tail.position == log.stat().st_size
    diagnosis = watcher.diagnosis(exit_code=None)
    causes = diagnosis.root_causes
    outcome = meta["outcome"]
    joined = "\n".join(causes)

    # whatever the outcome, a benign line that merely mentions "error" is never a root cause
    for block in causes:
        assert not _BENIGN.search(block), block
    assert len(diagnosis.last_lines) <= 30
    assert diagnosis.last_lines, "the last lines are kept for the error message"

    if outcome in ("crash", "argparse"):
        expected = meta["expected_error_message_substring"]
        assert causes, f"no root cause extracted; last lines: {diagnosis.last_lines}"
        assert expected in joined, joined
        headline = causes[0].splitlines()[0]
        if outcome == "argparse":
            assert _ARGPARSE_HEADLINE.match(headline), headline
        else:
            assert _EXCEPTION_HEADLINE.match(headline), headline
            assert expected in headline, headline
            if meta.get("expected_error_type"):
                assert headline.startswith(meta["expected_error_type"] + ":"), headline
        assert watcher.ready_at is None
        # the same extraction as a pure function over the whole file
        assert extract_root_causes(text.splitlines(), kind=kind)[0].splitlines()[0] == headline
    elif outcome == "ready":
        assert watcher.ready_at is not None
        assert {"load_weights", "kv_cache", "http_up"} <= set(watcher.phases), watcher.phases
        assert watcher.failing_since is None, causes
        order = [watcher.phases[name] for name in ("load_weights", "kv_cache", "http_up")]
        assert order == sorted(order)
        assert watcher.phases["http_up"] <= watcher.ready_at - watcher.started_at
        assert watcher.status(watcher.ready_at) == LogWatcher.READY_LINE_LABEL
    elif outcome == "hang":
        assert causes == []
        assert watcher.ready_at is None
        assert watcher.failing_since is None
        assert watcher.phase_label is not None
    else:
        pytest.fail(f"unknown outcome {outcome!r} in {sidecar.name}")


@pytest.mark.parametrize("sidecar", SIDECARS, ids=[p.stem for p in SIDECARS])
def test_sample_fed_all_at_once_matches_live_replay(sidecar: Path, tmp_path: Path) -> None:
    """Chunking must not change the result: reading the finished file in one go gives the same answer."""
    meta, log = _load(sidecar)
    kind = _kind_for(sidecar, "")
    live, _ = _replay(log, kind, tmp_path, seed=7)
    tail = LogTail(log)
    whole = LogWatcher(kind, started_at=0.0)
    whole.feed(tail.read_lines() + tail.flush(), 1.0)
    assert whole.diagnosis().root_causes == live.diagnosis().root_causes
    assert set(whole.phases) == set(live.phases)
    assert (whole.ready_at is None) == (live.ready_at is None)


def test_crash_samples_fail_fast() -> None:
    """In the crash logs with a complete traceback, the failure becomes evident while lines are fed."""
    checked = 0
    for sidecar in SIDECARS:
        meta, log = _load(sidecar)
        if meta["outcome"] not in ("crash", "argparse"):
            continue
        kind = _kind_for(sidecar, "")
        watcher = LogWatcher(kind, started_at=0.0)
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        for i, line in enumerate(lines):
            watcher.feed([line], float(i))
        assert watcher.failing_since is not None, sidecar.name
        assert watcher.failing_since <= len(lines) - 1
        assert watcher.status(float(len(lines))).startswith("failing")
        checked += 1
    assert checked
