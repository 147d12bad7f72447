"""A controlled slowdown of known size for the H200's A/B evidence (run_h200.sh GB): every forward pass of a
SGLang server made a set percentage longer *on the GPU*.

A sleep on the host would hide behind SGLang's overlap scheduler while the GPU is the bottleneck, so the wait
is a GPU kernel (``torch.cuda._sleep``) queued on the forward's own stream right after it: the next forward
starts that much later. Its length is ``pct`` of what this kind of forward took on the GPU lately (CUDA events
around each forward, read back without a sync once they have completed): prefill in ms per token, decode per
batch size. So "5" makes each forward pass about 5 % longer on the GPU; how much of that reaches the client's
tok/s is what the A/B measures.

Knob: ``SGLPROBE_SLOWDOWN_DIR=DIR`` in the server's environment (both servers of an A/A pair carry the same,
so the plugin still sees one server twice); the file ``DIR/<port>`` holds the percentage for the server on
that HTTP port (absent, empty or 0: none), read at most every 0.2 s, so a test slows one side of a live pair
and no restart is needed. ``DIR/<port>.stats``: JSON counters (forwards, slowed forwards, the GPU time the
forwards measured and the wait injected, in ms), rewritten at most every 0.5 s.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

READ_EVERY_S = 0.2
WRITE_EVERY_S = 0.5
PENDING_MAX = 512  # forwards whose events have not completed yet; past this the oldest are dropped
EMA = 0.2
CALIBRATION_CYCLES = 20_000_000  # about 10 ms at the H200's 1980 MHz


class Slowdown:
    """One server's knob and counters. ``cuda`` is torch.cuda, or a stand-in with ``Event`` and ``_sleep``."""

    def __init__(self, folder: str, port: int, cuda: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.knob = os.path.join(folder, str(port))
        self.stats_path = self.knob + ".stats"
        self.cuda, self.clock = cuda, clock
        self.pct = 0.0
        self._read_at = -math.inf
        self._written_at = -math.inf
        self.prefill_ms_per_token: float | None = None
        self.decode_ms: dict[int, float] = {}
        self.pending: list[tuple[Any, Any, str, int]] = []
        self.forwards = self.slowed = 0
        self.measured_ms = self.injected_ms = 0.0
        self.cycles_per_ms: float | None = None
        self.error = ""

    def percent(self) -> float:
        now = self.clock()
        if now - self._read_at >= READ_EVERY_S:
            self._read_at = now
            try:
                with open(self.knob) as fh:
                    text = fh.read().strip()
                self.pct = max(0.0, float(text)) if text else 0.0
            except (OSError, ValueError):
                self.pct = 0.0
        return self.pct

    def calibrate(self) -> None:
        """SM cycles per ms of ``_sleep``, once (it syncs the stream; the server's own warmup pays it)."""
        start, end = self.cuda.Event(enable_timing=True), self.cuda.Event(enable_timing=True)
        start.record()
        self.cuda._sleep(CALIBRATION_CYCLES)
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        self.cycles_per_ms = CALIBRATION_CYCLES / ms if ms > 0 else 1.98e6

    def expected_ms(self, kind: str, n: int) -> float | None:
        if kind == "prefill":
            return None if self.prefill_ms_per_token is None else self.prefill_ms_per_token * n
        if n in self.decode_ms:
            return self.decode_ms[n]
        if not self.decode_ms:
            return None
        near = min(self.decode_ms, key=lambda b: abs(b - n))
        return self.decode_ms[near]

    def harvest(self) -> None:
        """Fold the forwards whose end event has completed into the running estimates (no sync)."""
        left = []
        for start, end, kind, n in self.pending:
            if not end.query():
                left.append((start, end, kind, n))
                continue
            ms = start.elapsed_time(end)
            self.measured_ms += ms
            if kind == "prefill":
                per = ms / max(n, 1)
                old = self.prefill_ms_per_token
                self.prefill_ms_per_token = per if old is None else (1 - EMA) * old + EMA * per
            else:
                old_d = self.decode_ms.get(n)
                self.decode_ms[n] = ms if old_d is None else (1 - EMA) * old_d + EMA * ms
        self.pending = left[-PENDING_MAX:]

    def after(self, start: Any, end: Any, kind: str, n: int) -> None:
        """Called right after a forward was launched, with the events recorded around it."""
        self.forwards += 1
        self.pending.append((start, end, kind, n))
        self.harvest()
        pct = self.percent()
        if pct > 0:
            expected = self.expected_ms(kind, n)
            if expected is not None and self.cycles_per_ms:
                wait_ms = expected * pct / 100.0
                self.cuda._sleep(max(1, int(wait_ms * self.cycles_per_ms)))
                self.injected_ms += wait_ms
                self.slowed += 1
        self.write_stats()

    def write_stats(self, force: bool = False) -> None:
        now = self.clock()
        if not force and now - self._written_at < WRITE_EVERY_S:
            return
        self._written_at = now
        stats = {"pct": self.pct, "forwards": self.forwards, "slowed": self.slowed,
                 "measured_ms": round(self.measured_ms, 3), "injected_ms": round(self.injected_ms, 3),
                 "prefill_ms_per_token": self.prefill_ms_per_token,
                 "decode_ms": {str(k): round(v, 4) for k, v in sorted(self.decode_ms.items())},
                 "cycles_per_ms": self.cycles_per_ms, "error": self.error, "pid": os.getpid()}
        tmp = f"{self.stats_path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(stats, fh)
            os.replace(tmp, self.stats_path)
        except OSError:
            pass


def batch_kind(forward_batch: Any) -> tuple[str, int]:
    """("decode", batch size) or ("prefill", tokens in the batch)."""
    if forward_batch.forward_mode.is_decode():
        return "decode", int(forward_batch.batch_size)
    return "prefill", int(forward_batch.input_ids.shape[0])


def install(model_runner_module: Any, folder: str) -> None:
    """Wrap ModelRunner.forward of sglang.srt.model_executor.model_runner; never breaks a forward."""
    import torch

    runner_cls = model_runner_module.ModelRunner
    original = runner_cls.forward

    def forward(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        state = getattr(self, "_sglprobe_slowdown", None)
        if state is None:
            if getattr(self, "is_draft_worker", False):
                return original(self, forward_batch, *args, **kwargs)
            state = Slowdown(folder, int(self.server_args.port), torch.cuda)
            self._sglprobe_slowdown = state
        if state.error or torch.cuda.is_current_stream_capturing():
            return original(self, forward_batch, *args, **kwargs)
        try:
            if state.cycles_per_ms is None:
                state.calibrate()
            kind, n = batch_kind(forward_batch)
            start = torch.cuda.Event(enable_timing=True)
            start.record()
        except Exception as exc:  # the server must run on whatever happens here
            _broken(state, exc)
            return original(self, forward_batch, *args, **kwargs)
        out = original(self, forward_batch, *args, **kwargs)
        try:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            state.after(start, end, kind, n)
        except Exception as exc:
            _broken(state, exc)
        return out

    runner_cls.forward = forward
    print(f"[sglprobe] slowdown knob installed: {folder}/<port>", file=sys.stderr, flush=True)


def _broken(state: Slowdown, exc: BaseException) -> None:
    state.error = repr(exc)
    state.write_stats(force=True)
    print(f"[sglprobe] slowdown disabled: {exc!r}", file=sys.stderr, flush=True)
