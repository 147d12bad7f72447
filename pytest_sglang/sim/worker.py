"""Child processes of the simulator: one scheduler per TP rank and a detokenizer.

Run as `python -m pytest_sglang.sim.worker ROLE CONFIG_JSON` by the main process (server.py). Each scheduler
writes its own startup lines (with the ` TPn` prefix when tp > 1), paced against the launch time the parent
passes, and reports readiness through the pipe whose descriptor is in the config. Faults are played here:
a rank that raises prints SGLang's `Scheduler hit an exception: Traceback ...` and, for "exit" and for the
mid-session crash, sends SIGQUIT to the parent exactly as SGLang's `run_scheduler_process` does.

Children die with their parent: stdin is a pipe from the parent, and end-of-file on it ends the child. With
the `ignore_sigterm` knob a child calls os.setsid(), ignores SIGTERM and end-of-file, and so survives its
parent on purpose (to test that the plugin's teardown finds escaped descendants); such an orphan still exits
by itself ORPHAN_GRACE seconds after its parent is gone, so a broken teardown cannot leak it forever.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from pytest_sglang.sim.logfmt import Logger, rank_prefix, tqdm_bar, write_raw

ORPHAN_GRACE = 120.0

_SITE = "/usr/local/lib/python3.12/dist-packages/sglang/srt"
_TORCH = "/usr/local/lib/python3.12/dist-packages/torch"

STARTUP_TRACEBACK = [
    "Traceback (most recent call last):",
    f'  File "{_SITE}/managers/scheduler.py", line 2937, in run_scheduler_process',
    "    scheduler = Scheduler(",
    "                ^^^^^^^^^^",
    f'  File "{_SITE}/managers/scheduler.py", line 346, in __init__',
    "    self.init_model_worker()",
    f'  File "{_SITE}/managers/scheduler.py", line 535, in init_model_worker',
    "    self.init_tp_model_worker()",
    f'  File "{_SITE}/managers/scheduler.py", line 497, in init_tp_model_worker',
    "    self.tp_worker = TpModelWorker(",
    "                     ^^^^^^^^^^^^^^",
    f'  File "{_SITE}/managers/tp_worker.py", line 246, in __init__',
    "    self._init_model_runner()",
    f'  File "{_SITE}/managers/tp_worker.py", line 329, in _init_model_runner',
    "    self._model_runner = ModelRunner(",
    "                         ^^^^^^^^^^^^",
    f'  File "{_SITE}/model_executor/model_runner.py", line 383, in __init__',
    "    self.initialize(min_per_gpu_memory)",
    f'  File "{_SITE}/model_executor/model_runner.py", line 512, in initialize',
    "    self.model.set_eagle3_layers_to_capture(layer_ids)",
    "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{_TORCH}/nn/modules/module.py", line 1940, in __getattr__',
    "    raise AttributeError(",
    "AttributeError: 'KimiK25ForConditionalGeneration' object has no attribute "
    "'set_eagle3_layers_to_capture'",
]

SERVING_TRACEBACK = [
    "Traceback (most recent call last):",
    f'  File "{_SITE}/managers/scheduler.py", line 2955, in run_scheduler_process',
    "    scheduler.event_loop_overlap()",
    f'  File "{_TORCH}/utils/_contextlib.py", line 116, in decorate_context',
    "    return func(*args, **kwargs)",
    "           ^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{_SITE}/managers/scheduler.py", line 1012, in event_loop_overlap',
    "    batch_result = self.run_batch(batch)",
    "                   ^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{_SITE}/managers/scheduler.py", line 1904, in run_batch',
    "    ) = self.tp_worker.forward_batch_generation(model_worker_batch)",
    "        ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{_SITE}/managers/tp_worker.py", line 254, in forward_batch_generation',
    "    logits_output, can_run_cuda_graph = self.model_runner.forward(",
    "                                        ^^^^^^^^^^^^^^^^^^^^^^^^^^",
    f'  File "{_SITE}/model_executor/model_runner.py", line 1786, in forward',
    "    output = self._forward_raw(",
    "             ^^^^^^^^^^^^^^^^^^",
    "RuntimeError: CUDA error: an illegal memory access was encountered",
]

CUDA_GRAPH_BS = [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144,
                 152, 160, 168, 176, 184, 192, 200, 208, 216, 224, 232, 240, 248, 256, 272, 288, 304, 320,
                 336, 352, 368, 384, 400, 416, 432, 448, 464, 480, 496, 512]


class _Stop(Exception):
    """Raised inside the schedule when the fault time arrives."""


class Scheduler:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.rank: int = cfg["rank"]
        self.tp: int = cfg["server_args"]["tp_size"]
        self.knobs: dict[str, Any] = cfg["knobs"]
        self.t0: float = cfg["t0"]
        self.ranks_end: float = cfg["ranks_end"]  # seconds after t0 at which ranks report ready
        self.lag = 0.004 * self.rank  # keep ranks' lines in rank order at equal times
        self.log = Logger(rank_prefix(self.rank, self.tp))
        fault = self.knobs.get("fault")
        self.fault: str | None = fault if fault in ("traceback", "exit", "hang") else None
        self.fault_at = float(cfg["fault_at"])
        self.fault_rank: int = cfg["fault_rank"]
        self.bar_open = False

    # -- pacing -------------------------------------------------------------------------------------------
    def until(self, frac: float) -> None:
        """Sleep until frac * ranks_end after launch; stop there if the fault comes first."""
        target = self.t0 + frac * self.ranks_end + self.lag
        if self.fault is not None and self.t0 + self.fault_at <= target:
            _sleep_until(self.t0 + self.fault_at)
            raise _Stop
        _sleep_until(target)

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # -- the startup log ------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self.startup()
        except _Stop:
            self.play_fault()
            return
        ready_fd = self.cfg.get("ready_fd")
        if ready_fd is not None:
            try:
                os.write(ready_fd, b"ready\n")
                os.close(ready_fd)
            except OSError:
                pass

    def startup(self) -> None:
        sa = self.cfg["server_args"]
        spec = bool(sa.get("speculative_algorithm"))
        r0 = self.rank == 0
        self.until(0.02)
        self.log.line("Init torch distributed begin.")
        self.until(0.08)
        self.log.line("Init torch distributed ends. mem usage=0.00 GB")
        self.until(0.10)
        self.log.line("Load weight begin. avail mem=78.58 GB")
        self.log.line("Using model weights format ['*.safetensors']")
        if r0:
            self.bar("Loading safetensors checkpoint shards", 64, 0.11, 0.42, shard_style=True)
        self.until(0.44)
        self.log.line("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=63.43 GB, "
                      "mem usage=15.15 GB.")
        if spec:
            self.until(0.46)
            self.log.line("Load weight begin. avail mem=63.40 GB")
            self.until(0.49)
            self.log.line("Load weight end. type=LlamaForCausalLMEagle3, dtype=torch.bfloat16, "
                          "avail mem=62.10 GB, mem usage=1.30 GB.")
        self.until(0.51)
        self.log.line("KV Cache is allocated. #tokens: 834615, K size: 54.12 GB, V size: 54.12 GB")
        if spec:
            self.log.line("KV Cache is allocated. #tokens: 834615, K size: 0.81 GB, V size: 0.81 GB")
        self.until(0.53)
        self.log.line("Memory pool end. avail mem=14.61 GB")
        self.capture_graphs(r0, spec)
        self.until(0.96)
        if r0:
            self.log.line(
                f"max_total_num_tokens=834615, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                f"max_running_requests={self.knobs.get('max_batch', 64)}, "
                f"context_len={sa.get('context_length', 32768)}, available_gpu_mem=11.85 GB"
            )
        self.until(1.0)

    def capture_graphs(self, r0: bool, spec: bool) -> None:
        """The CUDA graph captures, the draft model's two after the target's under speculative decoding."""
        self.until(0.55)
        self.log.line("Capture cuda graph begin. This can take up to several minutes. avail mem=13.95 GB")
        begin = self.elapsed()
        if r0:
            self.log.line(f"Capture cuda graph bs {CUDA_GRAPH_BS}")
            self.bar("Capturing batches (bs=1 avail_mem=12.52 GB)", len(CUDA_GRAPH_BS), 0.56, 0.74,
                     shard_style=False)
        self.until(0.76)
        self.log.line(f"Capture cuda graph end. Time elapsed: {self.elapsed() - begin:.2f} s. "
                      "mem usage=1.44 GB. avail mem=12.51 GB.")
        if spec:
            self.until(0.78)
            self.log.line("Capture draft cuda graph begin. This can take up to several minutes. "
                          "avail mem=12.40 GB")
            begin = self.elapsed()
            self.until(0.84)
            self.log.line(f"Capture draft cuda graph end. Time elapsed: {self.elapsed() - begin:.2f} s. "
                          "mem usage=0.35 GB. avail mem=12.05 GB.")
            self.until(0.85)
            self.log.line("Capture draft extend cuda graph begin. This can take up to several minutes. "
                          "avail mem=12.05 GB")
            begin = self.elapsed()
            self.until(0.92)
            took = self.elapsed() - begin
            self.log.line(f"Capture draft extend cuda graph end. Time elapsed: {took:.2f} s. "
                          "mem usage=0.20 GB. avail mem=11.85 GB.")

    def bar(self, desc: str, total: int, start: float, end: float, *, shard_style: bool) -> None:
        """A tqdm bar on stderr: updates separated by \\r and no newline until it closes (sglang 0.5.23)."""
        steps = 8
        self.until(start)
        began = self.elapsed()
        self.bar_open = True
        try:
            for i in range(steps + 1):
                if i:
                    self.until(start + (end - start) * i / steps)
                n = total * i // steps
                write_raw("\r" + tqdm_bar(desc, n, total, self.elapsed() - began, shard_style=shard_style))
        finally:
            # tqdm closes the bar with a newline; on a fault we close it too, so the traceback starts a line.
            write_raw("\n")
            self.bar_open = False

    # -- faults ---------------------------------------------------------------------------------------------
    def play_fault(self) -> None:
        if self.fault in ("traceback", "exit") and self.rank == self.fault_rank:
            time.sleep(0.02)  # after rank 0 has closed any open bar line
            self.crash(STARTUP_TRACEBACK, sigquit=self.fault == "exit")
        # every other case (hang, the surviving ranks of a crash) blocks, as ranks stuck in a collective do

    def crash(self, tb: list[str], *, sigquit: bool) -> None:
        self.log.block(f"Scheduler hit an exception: {tb[0]}", tb[1:])
        if sigquit:
            try:
                os.kill(self.cfg["parent_pid"], signal.SIGQUIT)
            except OSError:
                pass
        os._exit(1)


def _sleep_until(deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(left)


def _watch_parent(cfg: dict[str, Any], escaped: bool, on_crash: Any) -> None:
    """Read the parent's control pipe (stdin): "crash" lines, and end-of-file when the parent is gone."""
    stdin = sys.stdin.buffer
    while True:
        try:
            line = stdin.readline()
        except (OSError, ValueError):
            line = b""
        if not line:
            break
        if line.strip() == b"crash" and on_crash is not None:
            on_crash()
    if not escaped:
        os._exit(0)
    # Escaped on purpose: outlive the parent, but not forever.
    time.sleep(ORPHAN_GRACE)
    os._exit(0)


def main(argv: list[str]) -> int:
    role, cfg = argv[0], json.loads(argv[1])
    escaped = bool(cfg["knobs"].get("ignore_sigterm"))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which then ends its children
    if escaped:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sched = Scheduler(cfg) if role.startswith("scheduler") else None
    on_crash = None
    if sched is not None and sched.rank == sched.fault_rank:
        def on_crash() -> None:
            sched.crash(SERVING_TRACEBACK, sigquit=True)
    threading.Thread(target=_watch_parent, args=(cfg, escaped, on_crash), daemon=True).start()
    if sched is not None:
        sched.run()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
