"""The server as a second witness: its Prometheus ``/metrics`` scraped before and after each round.

vLLM always serves ``/metrics``; SGLang with ``--enable-metrics``. :func:`scrape` reads the counters and
histograms this module knows in either server's names (summed over label sets: streaming or not, engines,
ranks), :func:`witness` turns two scrapes into what the server saw in between (:class:`Witness`): its
generation and prompt token counts, the median TTFT and ITL from its histograms (interpolated inside a
bucket, as Prometheus' ``histogram_quantile`` does), and the speculative accept length from its counters
(SGLang: generation tokens / ``spec_verify_calls``; vLLM: 1 + accepted tokens / drafts).

The gauges of :data:`GAUGES` (requests running and queued, KV-cache usage, generation throughput) are read
too: the telemetry sampler (telemetry.py) scrapes them during the rounds, for the server's time series.

:func:`disagreement` says whether the server's token counts differ from the ones the responses carried;
the runner fails the run on one (``BenchmarkFailedError``). Counters can trail the last response by a few
milliseconds (vLLM records its stats after handing the outputs out), so the runner re-scrapes for up to
:data:`SETTLE_S` before it calls a difference a disagreement. Knows nothing about pytest.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_sglang.bench.result import BenchResult

SETTLE_S = 2.0  # how long the counters may trail the last response
SETTLE_STEP_S = 0.1

# Our name -> each server's metric name (counters without the _total suffix, which is matched either way).
COUNTERS: dict[str, dict[str, str]] = {
    "generation_tokens": {"sglang": "sglang:generation_tokens", "vllm": "vllm:generation_tokens"},
    "prompt_tokens": {"sglang": "sglang:prompt_tokens", "vllm": "vllm:prompt_tokens"},
    "requests": {"sglang": "sglang:num_requests", "vllm": "vllm:request_success"},
    "spec_verify": {"sglang": "sglang:spec_verify_calls"},
    "spec_drafts": {"vllm": "vllm:spec_decode_num_drafts"},
    "spec_accepted": {"vllm": "vllm:spec_decode_num_accepted_tokens"},
    # prompt tokens served from the prefix cache (SGLang: summed over its cache_source labels; vLLM's hits) and,
    # vLLM only, the prompt tokens it looked up (SGLang's share is over its prompt_tokens)
    "cached_tokens": {"sglang": "sglang:cached_tokens", "vllm": "vllm:prefix_cache_hits"},
    "cache_queries": {"vllm": "vllm:prefix_cache_queries"},
}
HISTOGRAMS: dict[str, dict[str, str]] = {
    "ttft": {"sglang": "sglang:time_to_first_token_seconds", "vllm": "vllm:time_to_first_token_seconds"},
    "itl": {"sglang": "sglang:inter_token_latency_seconds", "vllm": "vllm:inter_token_latency_seconds"},
    "e2e": {"sglang": "sglang:e2e_request_latency_seconds", "vllm": "vllm:e2e_request_latency_seconds"},
}
# Our name -> each server's gauge names (the first one present is read): counts sum over label sets (data-parallel
# ranks), a usage share takes the highest. vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc in 0.10.
GAUGES: dict[str, dict[str, tuple[str, ...]]] = {
    "running": {"sglang": ("sglang:num_running_reqs",), "vllm": ("vllm:num_requests_running",)},
    "queued": {"sglang": ("sglang:num_queue_reqs",), "vllm": ("vllm:num_requests_waiting",)},
    "kv_usage": {"sglang": ("sglang:token_usage",),
                 "vllm": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")},
    "gen_throughput": {"sglang": ("sglang:gen_throughput",)},
    "cache_hit_rate": {"sglang": ("sglang:cache_hit_rate",)},  # its last prefill batch's: see cache_hits()
}
_HIGHEST = frozenset({"kv_usage", "cache_hit_rate"})
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?\s*$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value); comments and junk skipped."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line.strip())
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        samples.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return samples


@dataclass
class Snapshot:
    """One scrape: the known counters (summed over label sets) and histograms ({le: cumulative count})."""

    family: str  # "sglang" or "vllm"
    at: float  # time.perf_counter() of the scrape
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[float, float]] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)


def snapshot(text: str, at: float = 0.0) -> Snapshot | None:
    """The known figures of an exposition; None where it holds neither server's metrics."""
    samples = parse_prometheus(text)
    names = {name for name, _, _ in samples}
    family = "sglang" if any(n.startswith("sglang:") for n in names) else (
        "vllm" if any(n.startswith("vllm:") for n in names) else None)
    if family is None:
        return None
    snap = Snapshot(family, at)
    for ours, theirs in COUNTERS.items():
        name = theirs.get(family)
        if name is None:
            continue
        values = [v for n, _, v in samples if n in (name, name + "_total")]
        if values:
            snap.counters[ours] = sum(values)
    for ours, theirs in HISTOGRAMS.items():
        buckets: dict[float, float] = {}
        for n, labels, v in samples:
            if n == theirs[family] + "_bucket" and "le" in labels:
                le = math.inf if labels["le"] in ("+Inf", "Inf", "inf") else float(labels["le"])
                buckets[le] = buckets.get(le, 0.0) + v
        if buckets:
            snap.histograms[ours] = buckets
    for ours, gauge in GAUGES.items():
        for name in gauge.get(family, ()):
            values = [v for n, _, v in samples if n == name]
            if values:
                snap.gauges[ours] = max(values) if ours in _HIGHEST else sum(values)
                break
    return snap


def scrape(client: Any, timeout: float = 10.0) -> Snapshot | None:
    """GET /metrics through a :class:`~pytest_sglang.bench.client.Client`; None where the server has none."""
    import requests

    try:
        response = client.get("/metrics", timeout=timeout)
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    return snapshot(response.text, time.perf_counter())


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over cumulative ``{le: count}``: linear inside the bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return prev_bound  # in the +Inf bucket: the highest finite bound, as Prometheus answers
            if count == prev_count:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = bound, count
    return prev_bound


@dataclass
class Witness:
    """What the server's own metrics saw between two scrapes."""

    family: str
    generation_tokens: int | None = None
    prompt_tokens: int | None = None
    requests: int | None = None
    median_ttft_ms: float | None = None
    median_itl_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    accept_length: float | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache
    cache_hit_rate: float | None = None  # those over the prompt tokens (vLLM: over the tokens it looked up)


def witness(before: Snapshot, after: Snapshot) -> Witness:
    def diff(key: str) -> float | None:
        if key not in after.counters:
            return None
        return after.counters[key] - before.counters.get(key, 0.0)

    w = Witness(after.family)
    for key in ("generation_tokens", "prompt_tokens", "requests"):
        value = diff(key)
        if value is not None:
            setattr(w, key, int(round(value)))
    for key, attr in (("ttft", "median_ttft_ms"), ("itl", "median_itl_ms"), ("e2e", "median_e2e_latency_ms")):
        b, a = before.histograms.get(key, {}), after.histograms.get(key)
        if a:
            median = histogram_quantile(0.5, {le: n - b.get(le, 0.0) for le, n in a.items()})
            setattr(w, attr, median * 1000.0 if median is not None else None)
    w.cached_tokens, w.cache_hit_rate = cache_hits(before, after)
    gen = diff("generation_tokens")
    if after.family == "sglang":
        verify = diff("spec_verify")
        if gen and verify:
            w.accept_length = gen / verify
    else:
        drafts, accepted = diff("spec_drafts"), diff("spec_accepted")
        if drafts and accepted is not None:
            w.accept_length = 1.0 + accepted / drafts
    return w


def cache_hits(before: Snapshot, after: Snapshot) -> tuple[int | None, float | None]:
    """The prompt tokens served from the prefix cache between two scrapes, and their share (None: unknown).

    vLLM: ``vllm:prefix_cache_hits`` over ``vllm:prefix_cache_queries`` (tokens). SGLang: ``sglang:cached_tokens``
    over ``sglang:prompt_tokens``. SGLang 0.5.x exports its counter only from the first cache hit on (a labelled
    child appears when first incremented), so its absence means no hit yet where the server reports a last
    prefill batch's hit rate (``sglang:cache_hit_rate``) of 0; with that gauge missing or above 0 (a version
    without the counter) it means unknown."""
    hits_after = after.counters.get("cached_tokens")
    if after.family == "vllm":
        queries = after.counters.get("cache_queries")
        if hits_after is None or queries is None:
            return None, None
        hits = hits_after - before.counters.get("cached_tokens", 0.0)
        asked = queries - before.counters.get("cache_queries", 0.0)
    else:
        prompt = after.counters.get("prompt_tokens")
        if prompt is None:
            return None, None
        if hits_after is None:
            if after.gauges.get("cache_hit_rate") != 0.0:
                return None, None
            hits_after = 0.0
        hits = hits_after - before.counters.get("cached_tokens", 0.0)
        asked = prompt - before.counters.get("prompt_tokens", 0.0)
    return int(round(hits)), (hits / asked if asked > 0 else None)


def disagreement(w: Witness, *, output_tokens: int, input_tokens: int | None, requests: int) -> str | None:
    """Why the server's counts differ from the responses' (None: they agree, or the server counts nothing).
    ``input_tokens`` None: not compared (the responses carried no prompt counts)."""
    problems = []
    if w.generation_tokens is not None and w.generation_tokens != output_tokens:
        problems.append(f"{w.generation_tokens} generation tokens where the {requests} responses carried "
                        f"{output_tokens}")
    if input_tokens is not None and w.prompt_tokens is not None and w.prompt_tokens != input_tokens:
        problems.append(f"{w.prompt_tokens} prompt tokens where the responses carried {input_tokens}")
    return "; ".join(problems) or None


def settled(client: Any, before: Snapshot, after: Snapshot | None, agrees: Callable[[Witness], bool]
            ) -> Snapshot | None:
    """``after``, or a later scrape (for up to SETTLE_S) once the counters agree: they may trail the responses."""
    deadline = time.perf_counter() + SETTLE_S
    while after is not None and not agrees(witness(before, after)) and time.perf_counter() < deadline:
        time.sleep(SETTLE_STEP_S)
        after = scrape(client) or after
    return after


class RoundWitness:
    """The runner's witness: ``mark(None)`` after the warmup, ``mark(results)`` after each round (before the
    next starts, so that no round's traffic leaks into another's counts), then :meth:`apply` writes each
    round's figures into its result and returns the disagreements."""

    def __init__(self, client: Any, enabled: bool = True) -> None:
        self.client = client
        self.enabled = enabled
        self.snaps: list[Snapshot | None] = []
        self.expected: list[tuple[int, int | None, int] | None] = []  # per round: output, input, requests

    def mark(self, results: Any = None) -> None:
        if not self.enabled or (self.snaps and self.snaps[0] is None):
            self.snaps.append(None)  # a server without /metrics says so at the first scrape: no more asking
            if results is not None:
                self.expected.append(None)
            return
        snap = scrape(self.client)
        if results is not None:
            ok = [s for s in results if s.ok]
            expect = None
            if len(ok) == len(results):  # failed requests: the server may count their partial tokens
                out = sum(s.completion_tokens if s.completion_tokens is not None else
                          (sum(s.chunk_tokens) if s.chunk_tokens else len(s.chunk_times)) for s in ok)
                prompts = [s.prompt_tokens for s in ok]
                inp = None if any(p is None for p in prompts) else sum(p for p in prompts if p is not None)
                expect = (out, inp, len(ok))
            before = self.snaps[-1]
            if expect is not None and before is not None:
                out, inp, n = expect
                snap = settled(self.client, before, snap, lambda w: disagreement(
                    w, output_tokens=out, input_tokens=inp, requests=n) is None)
            self.expected.append(expect)
        self.snaps.append(snap)

    def apply(self, rounds: Sequence[BenchResult]) -> tuple[list[BenchResult], list[str]]:
        """Each round with its ``server_*`` figures (and ``accept_length`` where the requests gave none), a new
        result of each; and the disagreements that fail the run."""
        problems: list[str] = []
        out = list(rounds)
        for k, one in enumerate(rounds):
            if k + 1 >= len(self.snaps):
                break
            before, after = self.snaps[k], self.snaps[k + 1]
            if before is None or after is None:
                continue
            w = witness(before, after)
            figures: dict[str, Any] = {
                "server_metrics": w.family, "server_generation_tokens": w.generation_tokens,
                "server_prompt_tokens": w.prompt_tokens, "server_median_ttft_ms": w.median_ttft_ms,
                "server_median_itl_ms": w.median_itl_ms, "server_accept_length": w.accept_length,
                "server_cached_tokens": w.cached_tokens, "server_cache_hit_rate": w.cache_hit_rate}
            if one.accept_length is None and w.accept_length is not None:
                figures.update(accept_length=w.accept_length, accept_length_source="server_metrics")
            expect = self.expected[k] if k < len(self.expected) else None
            if expect is not None:
                out_tokens, inp, n = expect
                why = disagreement(w, output_tokens=out_tokens, input_tokens=inp, requests=n)
                if why:
                    where = f"round {k}: " if len(rounds) > 1 else ""
                    figures["server_disagreement"] = f"{where}the server's /metrics ({w.family}) counted {why}"
                    problems.append(figures["server_disagreement"])
            out[k] = one.with_figures(**figures)
        return out, problems
