"""A tiny tensor-parallel completions server, launched by torchrun: the plugin's view of a multi-rank server.

    python -m torch.distributed.run --nproc-per-node 2 benchmarks/tp_server/server.py \
        --model MODEL_DIR --host 127.0.0.1 --port 30000

Every rank holds a row shard of one square weight matrix; each decode step is a broadcast of the step's
tokens from rank 0 and an ``all_reduce`` of the ranks' partial matmuls, so no token is made without every
rank taking part. Rank 0 serves HTTP (``/health``, ``/v1/models``, ``/v1/completions`` with streaming SSE and
``usage``); the other ranks follow rank 0's steps. The backend is NCCL where CUDA is available (one GPU per
rank, by LOCAL_RANK), else gloo on the CPU: the same code runs on the two-GPU machine.

MODEL_DIR holds a ``config.json`` with ``vocab_size`` and ``hidden_size`` (the weights are seeded random
numbers, the same on every rank); sglang_bench reads the vocabulary from it and sends token-id prompts.

Log lines, one per rank and phase, in the form torch's own excepthook prints tracebacks in (``[rankN]: ``):

    [rank0]: Init torch distributed begin (backend gloo, world 2)
    [rank0]: Load weight begin
    [rank0]: Load weight end
    [rank0]: Warmup begin (4 steps)
    [rank0]: Listening on http://127.0.0.1:30000
    [rank0]: tp_server ready: tp 2, backend gloo, vocab 256, hidden 64

Faults on one rank, for the plugin's tests (``--fault-rank`` picks it, default 1):

* ``--fault exception``: at warmup step ``--fault-step`` the rank sleeps 0.5 s (so that the others are waiting
  in that step's all_reduce) and raises RuntimeError; torch's excepthook prints it with the rank's prefix.
* ``--fault sigkill``: the same moment, the rank SIGKILLs itself (no traceback: an OOM kill's view).

The line before a fault says when it happened (``at t=<unix time>``), so a test can time the error.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import sys
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
import torch.distributed as dist

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
OP_STEP, OP_STOP = 1, 2
MAX_BATCH = 64


def log(msg: str) -> None:
    print(f"[rank{RANK}]: {msg}", flush=True)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="folder with config.json (vocab_size, hidden_size)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--served-model-name", default="tp-tiny")
    ap.add_argument("--warmup-steps", type=int, default=4)
    ap.add_argument("--fault", choices=["none", "exception", "sigkill"], default="none")
    ap.add_argument("--fault-rank", type=int, default=1)
    ap.add_argument("--fault-step", type=int, default=2)
    return ap.parse_args()


class Model:
    """Embedding (replicated) and one square layer, row-sharded: rank r holds rows [r*H/W, (r+1)*H/W)."""

    def __init__(self, vocab: int, hidden: int, device: torch.device) -> None:
        if hidden % WORLD:
            raise ValueError(f"hidden_size {hidden} is not divisible by the world size {WORLD}")
        gen = torch.Generator().manual_seed(1234)
        embed = torch.randn(vocab, hidden, generator=gen)
        weight = torch.randn(hidden, hidden, generator=gen) / hidden ** 0.5
        shard = hidden // WORLD
        self.lo, self.hi = RANK * shard, (RANK + 1) * shard
        self.embed = embed.to(device)
        self.weight = weight[self.lo:self.hi].contiguous().to(device)
        self.vocab, self.device = vocab, device

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Next token of each sequence: a collective on every rank, every step."""
        h = self.embed[tokens] + 0.01 * positions.unsqueeze(1).to(self.embed.dtype)
        partial = h[:, self.lo:self.hi] @ self.weight  # this rank's rows of the matmul
        dist.all_reduce(partial)  # the sum over ranks is the whole matmul
        logits = torch.tanh(partial) @ self.embed.T
        return logits.argmax(dim=-1)


class Engine:
    """Rank 0's decode loop: batches the live requests, one collective step for all of them at a time."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.inbox: queue.Queue[Request] = queue.Queue()
        self.lock = threading.Lock()  # the collectives of one process group go one at a time

    def collective_step(self, tokens: list[int], positions: list[int]) -> list[int]:
        with self.lock:
            header = torch.tensor([OP_STEP, len(tokens)], dtype=torch.int64, device=self.model.device)
            dist.broadcast(header, src=0)
            batch = torch.tensor([tokens, positions], dtype=torch.int64, device=self.model.device)
            dist.broadcast(batch, src=0)
            return self.model.step(batch[0], batch[1]).tolist()

    def run(self) -> None:
        live: list[Request] = []
        while True:
            if not live:
                live.append(self.inbox.get())
            while len(live) < MAX_BATCH:
                try:
                    live.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            nxt = self.collective_step([r.last for r in live], [r.position for r in live])
            for req, tok in zip(live, nxt, strict=True):
                req.push(tok)
            live = [r for r in live if not r.done]


class Request:
    def __init__(self, prompt: list[int], max_tokens: int) -> None:
        self.last, self.position, self.max_tokens = prompt[-1], len(prompt), max_tokens
        self.out: queue.Queue[int | None] = queue.Queue()
        self.made = 0

    @property
    def done(self) -> bool:
        return self.made >= self.max_tokens

    def push(self, tok: int) -> None:
        self.made += 1
        self.last, self.position = tok, self.position + 1
        self.out.put(tok)
        if self.done:
            self.out.put(None)


def token_text(tok: int) -> str:
    return chr(33 + tok % 94)  # one printable character per token: the text's length is its token count


def make_handler(engine: Engine, args: argparse.Namespace, vocab: int) -> type[BaseHTTPRequestHandler]:
    model_root = str(Path(args.model).resolve())

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *a: object) -> None:  # access lines: one per request, as uvicorn
            log(f'{self.address_string()} - "{self.requestline}" {a[1] if len(a) > 1 else ""}')

        def _json(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._json(200, {"status": "ok", "tp": WORLD})
            elif self.path == "/v1/models":
                self._json(200, {"object": "list", "data": [
                    {"id": args.served_model_name, "object": "model", "root": model_root, "max_model_len": 4096}]})
            else:
                self._json(404, {"error": f"no route {self.path}"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/completions":
                self._json(404, {"error": f"no route {self.path}"})
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            prompt = body.get("prompt", "")
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
                prompt = prompt[0]
            ids = [int(t) % vocab for t in prompt] if isinstance(prompt, list) else [b % vocab for b in
                                                                                     str(prompt).encode()]
            if not ids:
                self._json(400, {"error": "empty prompt"})
                return
            req = Request(ids, max(1, int(body.get("max_tokens") or 16)))
            engine.inbox.put(req)
            usage = {"prompt_tokens": len(ids), "completion_tokens": req.max_tokens,
                     "total_tokens": len(ids) + req.max_tokens}
            rid, created = f"cmpl-{id(req):x}", int(time.time())
            if not body.get("stream"):
                toks = []
                while (tok := req.out.get()) is not None:
                    toks.append(tok)
                self._json(200, {"id": rid, "object": "text_completion", "created": created,
                                 "model": args.served_model_name, "usage": usage, "choices": [
                                     {"index": 0, "text": "".join(map(token_text, toks)), "finish_reason": "length",
                                      "token_ids": toks}]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

            def event(payload: object) -> None:
                self.wfile.write(b"data: " + (payload if isinstance(payload, bytes) else
                                              json.dumps(payload).encode()) + b"\n\n")
                self.wfile.flush()

            n = 0
            while (tok := req.out.get()) is not None:
                n += 1
                event({"id": rid, "object": "text_completion", "created": created, "model": args.served_model_name,
                       "choices": [{"index": 0, "text": token_text(tok), "token_ids": [tok],
                                    "finish_reason": "length" if n == req.max_tokens else None}]})
            event({"id": rid, "object": "text_completion", "created": created, "model": args.served_model_name,
                   "choices": [], "usage": usage})
            event(b"[DONE]")

    return Handler


def maybe_fault(args: argparse.Namespace, step: int) -> None:
    if args.fault == "none" or RANK != args.fault_rank or step != args.fault_step:
        return
    time.sleep(0.5)  # the other ranks are in this step's all_reduce by now, waiting for this one
    if args.fault == "sigkill":
        log(f"fault: SIGKILL to myself in warmup step {step} at t={time.time():.3f}")
        os.kill(os.getpid(), signal.SIGKILL)
    log(f"fault: raising in warmup step {step} at t={time.time():.3f}")
    raise RuntimeError(f"injected fault on rank {RANK} in warmup step {step} (the other ranks wait in all_reduce)")


def follow(model: Model) -> None:
    """Ranks other than 0: take part in every step rank 0 starts, until it says stop."""
    header = torch.zeros(2, dtype=torch.int64, device=model.device)
    while True:
        dist.broadcast(header, src=0)
        if int(header[0]) == OP_STOP:
            return
        batch = torch.zeros(2, int(header[1]), dtype=torch.int64, device=model.device)
        dist.broadcast(batch, src=0)
        model.step(batch[0], batch[1])


def main() -> None:
    args = parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    vocab, hidden = int(config["vocab_size"]), int(config.get("hidden_size", 64))
    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device(f"cuda:{LOCAL_RANK}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    log(f"Init torch distributed begin (backend {backend}, world {WORLD})")
    # An idle server's followers wait in a broadcast between requests: no collective timeout while idle.
    dist.init_process_group(backend, timeout=timedelta(hours=24))
    log("Init torch distributed end")
    log("Load weight begin")
    model = Model(vocab, hidden, device)
    log(f"Load weight end (rows {model.lo}:{model.hi} of {hidden})")
    log(f"Warmup begin ({args.warmup_steps} steps)")
    for step in range(args.warmup_steps):
        maybe_fault(args, step)
        model.step(torch.arange(4, device=device) % vocab, torch.arange(4, device=device))
    log("Warmup end")
    if RANK != 0:
        follow(model)
        log("stopped")
        return
    engine = Engine(model)
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(engine, args, vocab))
    httpd.daemon_threads = True
    threading.Thread(target=engine.run, name="engine", daemon=True).start()
    log(f"Listening on http://{args.host}:{args.port}")
    log(f"tp_server ready: tp {WORLD}, backend {backend}, vocab {vocab}, hidden {hidden}")

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        log("shutting down")
        with engine.lock:
            dist.broadcast(torch.tensor([OP_STOP, 0], dtype=torch.int64, device=device), src=0)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
