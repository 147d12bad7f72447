"""Load generator and metrics, with sglang.bench_serving's definitions and names. Knows nothing about pytest.

``run_bench(server, num_requests=..., concurrency=..., input_len=..., output_len=...)`` streams requests at
a server and returns a :class:`BenchResult`:

* ``duration``: from the first request sent to the last response done, warmup requests excluded;
* ``output_throughput = total_output_tokens / duration``, likewise ``input_throughput``,
  ``request_throughput`` and ``total_throughput``;
* output tokens are the server's count (``usage.completion_tokens`` with ``stream_options.include_usage``,
  ``meta_info.completion_tokens`` natively); only where the server gives none is the chunk count used
  (``server_token_counts_missing`` says how often). ``chunk_count_mismatches`` counts requests whose
  number of output-bearing stream events differs from the server's token count (expected under
  speculative decoding, where one event carries several tokens; a sign of a miscounting server otherwise);
* TTFT: request sent to the first event that carries output; ITL: the gaps between such events; TPOT:
  ``(e2e - ttft) / (output_tokens - 1)``; e2e latency: request sent to the stream's end. Each with mean,
  median, std, p90 and p99 in ms (percentiles interpolate linearly, like numpy's default);
* ``accept_length``: ``internal_states[0].avg_spec_accept_length`` of ``/server_info``, or the native
  ``completion_tokens / spec_verify_ct``; None without speculative decoding.

Failed requests never hide: ``failed`` and ``first_failure`` say what happened, and unless
``allow_failures=True`` the run raises :class:`BenchmarkFailedError` carrying the result.
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from typing import Any, Protocol, TypeVar, runtime_checkable

from pytest_sglang.client import (
    API_PATHS,
    Api,
    Client,
    ConnectionPool,
    StreamResult,
    build_payload,
    stream_request,
)
from pytest_sglang.errors import BenchmarkError, BenchmarkFailedError

T = TypeVar("T")

# A token-id range that is ordinary text in every common vocabulary (Llama, Qwen, Mistral, GPT-2/OPT...):
# special tokens sit at the very start or far above it.
_SAFE_TOKEN_IDS = (1000, 30000)
_WORDS = ("the of and to in is was for on that with as by at from his her an were are which this be "
          "or has had not but its one their they have new first two more after who other been all "
          "also time into only year when some most can would between over than about these made "
          "city people many such during state world used school under three while known part").split()


@runtime_checkable
class ServerLike(Protocol):
    """What the load generator needs of a server handle (``sglang_server`` is one)."""

    @property
    def base_url(self) -> str: ...
    @property
    def api_key(self) -> str | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def model(self) -> str | None: ...

    def check_alive(self) -> None: ...


@dataclass
class _Url:
    base_url: str
    api_key: str | None = None
    kind: str = "generic"
    model: str | None = None

    def check_alive(self) -> None:
        return None


@dataclass
class RequestRecord:
    """One measured request (warmup excluded). Times in seconds."""

    ok: bool
    start: float
    latency: float
    ttft: float | None
    itls: list[float]
    input_tokens: int
    output_tokens: int
    chunks: int
    server_counted: bool
    status: int | None = None
    error: str | None = None
    connection_error: bool = False
    spec_verify_ct: int | None = None


@dataclass
class BenchResult:
    """Figures of one benchmark run, named as sglang.bench_serving names them."""

    # what was run
    api: str = "completions"
    num_requests: int = 0
    max_concurrency: int | None = None
    request_rate: float = math.inf
    input_len: int = 0
    output_len: int = 0
    warmup: int = 0
    seed: int = 0
    prompt_kind: str = "token_ids"  # "token_ids", "tokenizer_text" or "approx_text"
    profile: str | None = None
    started_at: str = ""
    # counts
    completed: int = 0
    failed: int = 0
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    duration: float = 0.0
    # throughput
    request_throughput: float = 0.0
    input_throughput: float = 0.0
    output_throughput: float = 0.0
    total_throughput: float = 0.0
    concurrency: float = 0.0  # achieved: sum of e2e latencies / duration
    # latency (ms)
    mean_ttft_ms: float = 0.0
    median_ttft_ms: float = 0.0
    std_ttft_ms: float = 0.0
    p90_ttft_ms: float = 0.0
    p99_ttft_ms: float = 0.0
    mean_itl_ms: float = 0.0
    median_itl_ms: float = 0.0
    std_itl_ms: float = 0.0
    p90_itl_ms: float = 0.0
    p99_itl_ms: float = 0.0
    max_itl_ms: float = 0.0
    mean_tpot_ms: float = 0.0
    median_tpot_ms: float = 0.0
    std_tpot_ms: float = 0.0
    p90_tpot_ms: float = 0.0
    p99_tpot_ms: float = 0.0
    mean_e2e_latency_ms: float = 0.0
    median_e2e_latency_ms: float = 0.0
    std_e2e_latency_ms: float = 0.0
    p90_e2e_latency_ms: float = 0.0
    p99_e2e_latency_ms: float = 0.0
    # speculative decoding
    accept_length: float | None = None
    # honesty
    first_failure: dict[str, Any] | None = None  # {"index", "status", "error"} of the first failed request
    chunk_count_mismatches: int = 0
    server_token_counts_missing: int = 0
    requests: list[RequestRecord] = field(default_factory=list, repr=False)

    def to_dict(self, *, include_requests: bool = False) -> dict[str, Any]:
        """JSON-ready figures (``request_rate`` inf becomes the string "inf")."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "requests":
                continue
            value = getattr(self, f.name)
            if isinstance(value, float) and math.isinf(value):
                value = "inf"
            out[f.name] = value
        if include_requests:
            out["requests"] = [asdict(r) for r in self.requests]
        return out

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.completed > 0

    def summary(self) -> str:
        """The figures as ``python -m sglang.bench_serving`` prints them."""

        def row(label: str, value: Any) -> str:
            if isinstance(value, float):
                value = f"{value:.2f}"
            return f"{label:<40}{value!s:<10}"

        lines = [f"{' Serving Benchmark Result ':=^50}"]
        lines += [
            row("Backend:", f"{self.api} ({API_PATHS.get(self.api, '?')})"),
            row("Traffic request rate:", self.request_rate),
            row("Max request concurrency:", self.max_concurrency or "not set"),
            row("Successful requests:", self.completed),
            row("Failed requests:", self.failed),
            row("Benchmark duration (s):", self.duration),
            row("Total input tokens:", self.total_input_tokens),
            row("Total generated tokens:", self.total_output_tokens),
            row("Request throughput (req/s):", self.request_throughput),
            row("Input token throughput (tok/s):", self.input_throughput),
            row("Output token throughput (tok/s):", self.output_throughput),
            row("Total token throughput (tok/s):", self.total_throughput),
            row("Concurrency:", self.concurrency),
        ]
        if self.accept_length is not None:
            lines.append(row("Accept length:", self.accept_length))
        sections = (("End-to-End Latency", "e2e_latency"), ("Time to First Token", "ttft"),
                    ("Time per Output Token (excl. 1st token)", "tpot"), ("Inter-Token Latency", "itl"))
        for title, key in sections:
            lines.append(f"{title:-^50}")
            for stat in ("mean", "median", "p90", "p99"):
                lines.append(row(f"{stat.capitalize() if stat[0] != 'p' else stat.upper()} "
                                 f"{key.upper().replace('_LATENCY', '')} (ms):",
                                 getattr(self, f"{stat}_{key}_ms")))
        if self.failed:
            lines.append(f"{' FAILURES ':-^50}")
            lines.append(failure_text(self))
        lines.append("=" * 50)
        return "\n".join(lines)


def failure_text(result: BenchResult) -> str:
    ff = result.first_failure or {}
    status = f"HTTP {ff['status']}" if ff.get("status") else "no HTTP status"
    return (f"{result.failed} of {result.failed + result.completed} requests failed; the first "
            f"(request {ff.get('index')}, {status}): {ff.get('error')}")


# --------------------------------------------------------------------------------------------------------
# Pure metrics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, numpy's default (``numpy.percentile(values, q)``)."""
    if not values:
        return 0.0
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _stats(values_s: Sequence[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    if not ms:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, "p90": 0.0, "p99": 0.0}
    return {
        "mean": statistics.fmean(ms),
        "median": percentile(ms, 50),
        "std": statistics.pstdev(ms),
        "p90": percentile(ms, 90),
        "p99": percentile(ms, 99),
    }


def record_from_stream(s: StreamResult, prompt_tokens: int) -> RequestRecord:
    """Turn what the client saw into a measured request: the server's token counts win over chunk counts."""
    chunks = len(s.chunk_times)
    server_counted = s.completion_tokens is not None
    output_tokens = s.completion_tokens if s.completion_tokens is not None else (
        sum(s.chunk_tokens) if s.chunk_tokens else chunks)
    itls = [b - a for a, b in zip(s.chunk_times, s.chunk_times[1:], strict=False)]
    return RequestRecord(
        ok=s.ok, start=s.start, latency=s.latency, ttft=s.ttft, itls=itls,
        input_tokens=s.prompt_tokens if s.prompt_tokens is not None else prompt_tokens,
        output_tokens=output_tokens if s.ok else 0, chunks=chunks, server_counted=server_counted,
        status=s.status, error=s.error, connection_error=s.connection_error, spec_verify_ct=s.spec_verify_ct,
    )


def compute_metrics(
    records: Sequence[RequestRecord], duration: float | None = None, **config: Any
) -> BenchResult:
    """Aggregate measured requests into a BenchResult. ``duration`` defaults to first start to last end."""
    result = BenchResult(**config)
    result.requests = list(records)
    good = [r for r in records if r.ok]
    bad = [(i, r) for i, r in enumerate(records) if not r.ok]
    result.completed, result.failed = len(good), len(bad)
    if bad:
        i, r = bad[0]
        result.first_failure = {"index": i, "status": r.status, "error": r.error}
    if duration is None:
        ends = [r.start + r.latency for r in records]
        duration = (max(ends) - min(r.start for r in records)) if records else 0.0
    result.duration = duration
    result.total_input_tokens = sum(r.input_tokens for r in good)
    result.total_output_tokens = sum(r.output_tokens for r in good)
    result.chunk_count_mismatches = sum(1 for r in good if r.server_counted and r.chunks != r.output_tokens)
    result.server_token_counts_missing = sum(1 for r in good if not r.server_counted)
    if duration > 0:
        result.request_throughput = len(good) / duration
        result.input_throughput = result.total_input_tokens / duration
        result.output_throughput = result.total_output_tokens / duration
        result.total_throughput = (result.total_input_tokens + result.total_output_tokens) / duration
        result.concurrency = sum(r.latency for r in good) / duration
    ttfts = [r.ttft for r in good if r.ttft is not None]
    itls = [x for r in good for x in r.itls]
    tpots = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in good
             if r.ttft is not None and r.output_tokens > 1]
    e2e = [r.latency for r in good]
    for key, values in (("ttft", ttfts), ("itl", itls), ("tpot", tpots), ("e2e_latency", e2e)):
        for stat, value in _stats(values).items():
            setattr(result, f"{stat}_{key}_ms", value)
    result.max_itl_ms = max(itls) * 1000.0 if itls else 0.0
    verify = [r for r in good if r.spec_verify_ct]
    if verify:
        verified = sum(r.spec_verify_ct or 0 for r in verify)
        result.accept_length = sum(r.output_tokens for r in verify) / verified
    return result


# --------------------------------------------------------------------------------------------------------
# Prompts


def load_tokenizer(name_or_path: str | None) -> Any | None:
    """The model's tokenizer through ``transformers`` when installed and available offline, else None."""
    if not name_or_path:
        return None
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found,unused-ignore]

        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    except Exception:  # noqa: BLE001 - any failure means "no tokenizer at hand"
        return None


def make_prompts(count: int, input_len: int, *, seed: int, want_ids: bool, tokenizer: Any | None = None
                 ) -> tuple[list[str | list[int]], str]:
    """``count`` prompts of ``input_len`` tokens and how they were made.

    Token ids where the API takes them (exact length); otherwise text decoded from random ids with the
    model's tokenizer, re-encoded and trimmed to the exact length; otherwise (no tokenizer) words whose
    token count is only approximate, in which case input token totals come from the server's usage.
    """
    rng = random.Random(seed)
    prompts: list[str | list[int]] = []
    if want_ids:
        lo, hi = _SAFE_TOKEN_IDS
        if tokenizer is not None:
            special = set(getattr(tokenizer, "all_special_ids", []) or [])
            hi = min(hi, int(getattr(tokenizer, "vocab_size", hi)))
            lo = min(lo, max(0, hi // 10))
        else:
            special = set()
        for _ in range(count):
            ids: list[int] = []
            while len(ids) < input_len:
                tid = rng.randrange(lo, hi)
                if tid not in special:
                    ids.append(tid)
            prompts.append(ids)
        return prompts, "token_ids"
    if tokenizer is not None:
        vocab = int(getattr(tokenizer, "vocab_size", 30000))
        for _ in range(count):
            ids = [rng.randrange(min(_SAFE_TOKEN_IDS[0], vocab // 10), min(vocab, _SAFE_TOKEN_IDS[1]))
                   for _ in range(input_len)]
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text, add_special_tokens=False)[:input_len]
            prompts.append(tokenizer.decode(ids))
        return prompts, "tokenizer_text"
    for _ in range(count):
        prompts.append(" ".join(rng.choice(_WORDS) for _ in range(input_len)))
    return prompts, "approx_text"


# --------------------------------------------------------------------------------------------------------
# The run


def _run_coroutine(factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run, or, when this thread already runs an event loop (pytest-asyncio), in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(factory())
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = asyncio.run(factory())
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="sglang-bench")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


async def _drive(
    base_url: str,
    api_key: str | None,
    api: Api,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int | None,
    request_rate: float,
    rng: random.Random,
    timeout: float | None,
    warmup_bodies: Sequence[dict[str, Any]] = (),
) -> tuple[list[StreamResult], list[StreamResult]]:
    pool = ConnectionPool(base_url, api_key=api_key)
    try:
        warm = [await stream_one(pool, api, b, timeout) for b in warmup_bodies[:1]]
        if len(warmup_bodies) > 1:
            warm += await asyncio.gather(*(stream_one(pool, api, b, timeout) for b in warmup_bodies[1:]))
        sem = asyncio.Semaphore(concurrency) if concurrency else None

        async def one(body: dict[str, Any]) -> StreamResult:
            if sem is None:
                return await stream_one(pool, api, body, timeout)
            async with sem:
                return await stream_one(pool, api, body, timeout)

        tasks: list[asyncio.Task[StreamResult]] = []
        for i, body in enumerate(bodies):
            if i and math.isfinite(request_rate) and request_rate > 0:
                await asyncio.sleep(rng.expovariate(request_rate))
            tasks.append(asyncio.ensure_future(one(body)))
        measured = list(await asyncio.gather(*tasks))
    finally:
        await pool.close()
    return warm, measured


async def stream_one(
    pool: ConnectionPool, api: Api, body: dict[str, Any], timeout: float | None
) -> StreamResult:
    return await stream_request(pool, api, body, timeout=timeout)


def run_bench(
    server: ServerLike | str,
    *,
    num_requests: int = 64,
    concurrency: int | None = None,
    request_rate: float = math.inf,
    input_len: int = 128,
    output_len: int = 128,
    api: Api = "completions",
    ignore_eos: bool | None = True,
    warmup: int = 1,
    seed: int = 0,
    tokenizer: Any | str | None = None,
    prompts: Sequence[str | Sequence[int]] | None = None,
    model: str | None = None,
    extra_body: Mapping[str, Any] | None = None,
    timeout: float | None = 1800.0,
    allow_failures: bool = False,
    profile: str | None = None,
) -> BenchResult:
    """Benchmark ``server`` (a server handle, or a base URL) with streamed requests; see the module doc.

    ``concurrency`` caps requests in flight (None: no cap); ``request_rate`` is the Poisson arrival rate in
    requests/s (inf: all at once, bounded by ``concurrency``). ``warmup`` requests run first and are left
    out. ``tokenizer``: a tokenizer object or a name for ``transformers.AutoTokenizer`` (default: the
    server's model, when transformers is installed and has it locally); used only for text prompts.
    """
    if api not in API_PATHS:
        raise BenchmarkError(f"api must be one of {', '.join(API_PATHS)}, got {api!r}")
    if num_requests < 1 or input_len < 1 or output_len < 1:
        raise BenchmarkError("num_requests, input_len and output_len must be at least 1")
    if concurrency is not None and concurrency < 1:
        raise BenchmarkError(f"concurrency must be at least 1 (or None for no cap), got {concurrency}")
    handle: ServerLike = _Url(server.rstrip("/")) if isinstance(server, str) else server
    profile = profile if profile is not None else getattr(handle, "profile", None)
    client = Client(handle.base_url, api_key=handle.api_key, timeout=60, model=model or handle.model)
    try:
        served_model = None
        if api != "generate":
            served_model = model or _served_model(client, handle)
        tok = tokenizer
        if tokenizer is None or isinstance(tokenizer, str):
            tok = load_tokenizer(tokenizer or handle.model) if api == "chat" else None
        if prompts is None:
            all_prompts, prompt_kind = make_prompts(num_requests + warmup, input_len, seed=seed,
                                                    want_ids=api != "chat", tokenizer=tok)
        else:
            if len(prompts) < num_requests:
                raise BenchmarkError(f"{len(prompts)} prompts given for {num_requests} requests")
            rng_w = random.Random(seed)
            all_prompts = [p if isinstance(p, str) else list(p) for p in prompts[:num_requests]]
            picks = [all_prompts[rng_w.randrange(len(all_prompts))] for _ in range(warmup)]
            all_prompts = picks + all_prompts
            prompt_kind = "given"
        bodies: list[dict[str, Any]] = []
        prompt_lens: list[int] = []
        for p in all_prompts:
            _, body = build_payload(api, prompt=p, output_len=output_len, model=served_model,
                                    ignore_eos=ignore_eos, stream=True, extra=extra_body)
            bodies.append(body)
            prompt_lens.append(len(p) if not isinstance(p, str) else input_len)
        started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        rng = random.Random(seed + 1)
        warm, measured = _run_coroutine(lambda: _drive(
            handle.base_url, handle.api_key, api, bodies[warmup:], concurrency=concurrency,
            request_rate=request_rate, rng=rng, timeout=timeout, warmup_bodies=bodies[:warmup]))
        if any(s.connection_error for s in warm + measured):
            handle.check_alive()  # raises ServerDiedError with the log's root cause if the server died
        result = compute_metrics(
            [record_from_stream(s, n) for s, n in zip(measured, prompt_lens[warmup:], strict=True)],
            api=api, num_requests=num_requests, max_concurrency=concurrency, request_rate=request_rate,
            input_len=input_len, output_len=output_len, warmup=warmup, seed=seed, prompt_kind=prompt_kind,
            profile=profile, started_at=started_at,
        )
        if handle.kind != "vllm":
            server_accept = client.accept_length()
            if server_accept is not None:
                result.accept_length = server_accept
        warm_failures = [s for s in warm if not s.ok]
        if warm_failures and not allow_failures:
            s = warm_failures[0]
            raise BenchmarkFailedError(
                f"{len(warm_failures)} of {len(warm)} warmup requests to {handle.base_url}{API_PATHS[api]} "
                f"failed; the first: {'HTTP ' + str(s.status) if s.status else 'no HTTP status'}: {s.error}",
                result)
        if result.failed and not allow_failures:
            raise BenchmarkFailedError(
                f"benchmark against {handle.base_url}{API_PATHS[api]}: {failure_text(result)} "
                f"(output_throughput of the {result.completed} completed would be "
                f"{result.output_throughput:.1f} tok/s; pass allow_failures=True to get the result anyway)",
                result)
        return result
    finally:
        client.close()


def _served_model(client: Client, handle: ServerLike) -> str | None:
    names = []
    try:
        names = client.models()
    except Exception:  # noqa: BLE001 - a server without /v1/models gets the profile's model name
        pass
    if handle.model and handle.model in names:
        return handle.model
    return names[0] if names else handle.model


def expected_throughput(*, num_requests: int, concurrency: int, output_len: int, ttft_s: float,
                        decode_tok_s: float) -> float:
    """Output tok/s of a server that paces each request exactly: first token after ``ttft_s``, then one
    token every ``1/decode_tok_s``; ``concurrency`` requests at a time, in waves."""
    per_request = ttft_s + (output_len - 1) / decode_tok_s
    waves = math.ceil(num_requests / concurrency)
    return num_requests * output_len / (waves * per_request)

