"""The simulator's Prometheus ``/metrics``, in SGLang's names or vLLM's, and its word-level tokenizer.

SGLang (``--enable-metrics``, as the real server wants it) exposes ``sglang:prompt_tokens_total``,
``sglang:generation_tokens_total``, ``sglang:num_requests_total``, ``sglang:spec_verify_calls_total`` and the
histograms ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds``,
``sglang:e2e_request_latency_seconds``; vLLM (the ``metrics_format = "vllm"`` knob; vLLM always serves it)
``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``, ``vllm:request_success_total``,
``vllm:spec_decode_num_drafts_total``, ``vllm:spec_decode_num_draft_tokens_total``,
``vllm:spec_decode_num_accepted_tokens_total`` and ``vllm:time_to_first_token_seconds``,
``vllm:inter_token_latency_seconds``, ``vllm:e2e_request_latency_seconds``. The counters count every request
when it finishes (the server's own warmup too, as the real servers do); the ``metrics_skew`` knob adds that
many generation tokens per request, a miscounting server for the tests of the second witness. The gauges
follow the engine's load as it is at the scrape: requests running and queued (``sglang:num_running_reqs``,
``sglang:num_queue_reqs``; ``vllm:num_requests_running``, ``vllm:num_requests_waiting``) and the KV-cache
usage, each running request holding one ``max_batch``-th of it (``sglang:token_usage``;
``vllm:kv_cache_usage_perc``). The prefix cache (prefix.py), as each server reports it: SGLang
``sglang:cached_tokens_total{cache_source="device"}``, exported only from the first hit on as SGLang 0.5.23 does
(a labelled counter appears when first incremented), and the gauge ``sglang:cache_hit_rate`` (the last request's
share); vLLM ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` (prompt tokens looked up and
found), always.

Tokenizer (``/tokenize``, ``/detokenize``): a word-level vocabulary of ``vocab_size`` ids (knob, default
32000): the simulator's output words keep their ids (100 + index), any other word hashes into the rest.
"""

from __future__ import annotations

import bisect
import itertools
import math
import threading
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pytest_sglang.sim.engine import TOKEN_ID_BASE, WORDS

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MIN_VOCAB = TOKEN_ID_BASE + len(WORDS) + 16  # the output words' ids, plus room for hashed ones


def tokenize(text: str, vocab_size: int) -> list[int]:
    ids = []
    first_free = TOKEN_ID_BASE + len(WORDS)
    for word in text.split():
        if word in WORDS:
            ids.append(TOKEN_ID_BASE + WORDS.index(word))
        else:
            ids.append(first_free + zlib.crc32(word.encode()) % (vocab_size - first_free))
    return ids


def detokenize_any(ids: Sequence[int]) -> str:
    """Text for any ids: the output words for theirs, ``<id>`` for the others."""
    n = len(WORDS)
    return " ".join(WORDS[t - TOKEN_ID_BASE] if 0 <= t - TOKEN_ID_BASE < n else f"<{t}>" for t in ids)


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.observe_all([value])

    def observe_all(self, values: Sequence[float]) -> None:
        """Each value counts in its own bucket only, cumulated at the scrape: a request's hundreds of ITLs are
        observed before its last chunk leaves, by a bisection per bucket over them sorted, not per value."""
        ordered = sorted(values)
        self.total += math.fsum(ordered)
        self.n += len(ordered)
        below = 0
        for i, bound in enumerate(self.buckets):
            upto = bisect.bisect_right(ordered, bound, lo=below)
            self.counts[i] += upto - below
            below = upto

    def lines(self, name: str, labels: str) -> list[str]:
        sep = "," if labels else ""
        cumulative = list(itertools.accumulate(self.counts))
        out = [f"# HELP {name} Histogram of {name.split(':', 1)[-1]}.", f"# TYPE {name} histogram"]
        out += [f'{name}_bucket{{{labels}{sep}le="{b}"}} {float(c)}' for b, c in zip(self.buckets, cumulative,
                                                                                     strict=True)]
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {float(self.n)}')
        out.append(f"{name}_count{{{labels}}} {float(self.n)}")
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        return out


class Metrics:
    """The counters and histograms of one simulated server."""

    def __init__(self, *, fmt: str, model: str, skew: int = 0, num_draft_tokens: int = 4,
                 load: Callable[[], tuple[int, int]] = lambda: (0, 0), max_batch: int = 1) -> None:
        self.fmt = fmt
        self.load = load  # (running, queued) now
        self.max_batch = max_batch
        self.model = model
        self.skew = skew
        self.num_draft_tokens = num_draft_tokens
        self._lock = threading.Lock()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests = 0
        self.verify_steps = 0
        self.cached_tokens = 0
        self.last_hit_rate = 0.0
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.e2e = _Histogram(E2E_BUCKETS)

    def finished(self, *, prompt_tokens: int, generation_tokens: int, verify_steps: int | None,
                 ttft: float | None, itls: Sequence[float], e2e: float, cached_tokens: int = 0) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens
            self.last_hit_rate = cached_tokens / prompt_tokens if prompt_tokens else 0.0
            self.generation_tokens += generation_tokens + self.skew
            self.requests += 1
            self.verify_steps += verify_steps or 0
            if ttft is not None:
                self.ttft.observe(ttft)
            self.itl.observe_all(itls)
            self.e2e.observe(e2e)

    def exposition(self) -> str:
        with self._lock:
            return "\n".join(self._sglang() if self.fmt == "sglang" else self._vllm()) + "\n"

    def _counter(self, name: str, labels: str, value: float, kind: str = "counter") -> list[str]:
        return [f"# HELP {name} {name.split(':', 1)[-1]}.", f"# TYPE {name} {kind}",
                f"{name}{{{labels}}} {float(value)}"]

    def _gauges(self, labels: str, running: str, queued: str, usage: str) -> list[str]:
        now_running, now_queued = self.load()
        out = self._counter(running, labels, now_running, "gauge")
        out += self._counter(queued, labels, now_queued, "gauge")
        return out + self._counter(usage, labels, now_running / self.max_batch, "gauge")

    def _sglang(self) -> list[str]:
        base = f'model_name="{self.model}",engine_type="unified",tp_rank="0",pp_rank="0"'
        stream = base + ',is_streaming="true"'
        out = self._counter("sglang:prompt_tokens_total", stream, self.prompt_tokens)
        out += self._counter("sglang:generation_tokens_total", stream, self.generation_tokens)
        out += self._counter("sglang:num_requests_total", stream, self.requests)
        if self.cached_tokens:
            out += self._counter("sglang:cached_tokens_total", base + ',cache_source="device"', self.cached_tokens)
        out += self._counter("sglang:cache_hit_rate", base, self.last_hit_rate, "gauge")
        if self.verify_steps:
            out += self._counter("sglang:spec_verify_calls_total", base, self.verify_steps)
        out += self.ttft.lines("sglang:time_to_first_token_seconds", stream)
        out += self.itl.lines("sglang:inter_token_latency_seconds", base)
        out += self.e2e.lines("sglang:e2e_request_latency_seconds", stream)
        return out + self._gauges(base, "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage")

    def _vllm(self) -> list[str]:
        labels = f'engine="0",model_name="{self.model}"'
        out = self._counter("vllm:prompt_tokens_total", labels, self.prompt_tokens)
        out += self._counter("vllm:generation_tokens_total", labels, self.generation_tokens)
        out += self._counter("vllm:request_success_total", labels + ',finished_reason="length"', self.requests)
        out += self._counter("vllm:prefix_cache_queries_total", labels, self.prompt_tokens)
        out += self._counter("vllm:prefix_cache_hits_total", labels, self.cached_tokens)
        if self.verify_steps:
            # vLLM counts a draft per verify step; the tokens it accepted are the step's tokens but the bonus one.
            accepted = self.generation_tokens - self.skew * self.requests - self.verify_steps
            out += self._counter("vllm:spec_decode_num_drafts_total", labels, self.verify_steps)
            out += self._counter("vllm:spec_decode_num_draft_tokens_total", labels,
                                 self.verify_steps * self.num_draft_tokens)
            out += self._counter("vllm:spec_decode_num_accepted_tokens_total", labels, max(0, accepted))
        out += self.ttft.lines("vllm:time_to_first_token_seconds", labels)
        out += self.itl.lines("vllm:inter_token_latency_seconds", labels)
        out += self.e2e.lines("vllm:e2e_request_latency_seconds", labels)
        return out + self._gauges(labels, "vllm:num_requests_running", "vllm:num_requests_waiting",
                                  "vllm:kv_cache_usage_perc")
