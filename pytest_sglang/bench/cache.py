"""The server's prefix cache and the rounds: which workload a round measures, and the server's word on it.

SGLang (radix cache) and vLLM (automatic prefix caching) keep the KV cache of prompts they have served; the same
prompt again skips its prefill, so a round that repeats an earlier round's prompts measures a cached workload
(a lower TTFT, a higher tok/s, a "prefill-heavy" run that measures decode). ``run_bench(..., cache=MODE)``:

* ``"fresh"`` (the default for generated prompts): every round, and the warmup, sends prompts of its own, each
  set drawn from the run's ``seed`` and the set's number (:class:`PromptSets`), so a run is reproducible; the
  sets a server has been sent are remembered for the session, so a later run on the same server (a sweep's
  next point, another test) draws sets it has not seen either, and the two sides of an A/B pair are aligned to
  get the same set in the same pair;
* ``"flush"`` (the default where ``prompts=`` are given, which cannot be redrawn): the same prompts every round,
  the server's prefix cache flushed after the warmup and between rounds (:func:`flush_prefix_cache`: SGLang's
  ``/flush_cache``, vLLM's ``/reset_prefix_cache``, which it serves only with ``VLLM_SERVER_DEV_MODE=1``);
* ``"warm"``: the same prompts every round, nothing flushed: a cached workload, on purpose.

The witness: each round's ``server_cache_hit_rate`` (server_metrics.py: the prompt tokens the server served from
its prefix cache over those it was asked for, from its /metrics). :func:`cached_round_note` flags a round of a
mode that should be uncached whose rate says it was mostly cached (:data:`CACHED_SHARE`). Knows nothing about
pytest.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from pytest_sglang.errors import BenchmarkError

CACHE_MODES = ("fresh", "flush", "warm")
CACHED_SHARE = 0.5  # a round whose prompt tokens came from the cache at least this share was mostly not prefilled
FLUSH_WAIT_S = 10.0  # how long a flush may wait for the server to go idle (the last round's requests to finish)
FLUSH_RETRY_S = 0.2
FLUSH_PATHS = {"sglang": "/flush_cache", "vllm": "/reset_prefix_cache"}


class CacheFlushError(BenchmarkError):
    """``cache="flush"``: the server refused to flush its prefix cache, or has no endpoint to flush it."""


class CachedRoundWarning(UserWarning):
    """A round that should have measured an uncached workload was mostly served from the server's prefix cache."""


def resolve_cache_mode(cache: str | None, *, prompts_given: bool) -> str:
    """The mode a run uses: ``cache`` checked, or the default (``"fresh"``; ``"flush"`` for given prompts)."""
    if cache is None:
        return "flush" if prompts_given else "fresh"
    if cache not in CACHE_MODES:
        raise BenchmarkError(f"cache must be one of {', '.join(map(repr, CACHE_MODES))}, got {cache!r}: 'fresh' "
                             "draws new prompts each round, 'flush' flushes the server's prefix cache before each "
                             "round, 'warm' repeats the prompts with the cache kept (a cached workload)")
    if cache == "fresh" and prompts_given:
        raise BenchmarkError("cache='fresh' draws new prompts for every round, but prompts= were given and cannot be "
                             "redrawn: pass cache='flush' (the same prompts, the server's prefix cache flushed before "
                             "each round) or cache='warm' (the same prompts, served from the cache on purpose)")
    return cache


class PromptSets:
    """Which prompt sets each server has been sent in this process: set ``n`` of a run is drawn from its seed and
    ``n`` (prompts.py), and :meth:`take` hands out sets a server has not been sent yet, in order, so the same
    session sends the same prompts and no run repeats an earlier run's. :meth:`align` moves servers to the same
    next set (an A/B pair: both sides then draw the same prompts)."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, server: str, count: int) -> int:
        """The first of ``count`` consecutive sets not yet sent to ``server`` (marked sent)."""
        with self._lock:
            first = self._next.get(server, 0)
            self._next[server] = first + count
            return first

    def align(self, servers: Iterable[str]) -> int:
        """Move every server's next set to the highest among them, and return it."""
        keys = list(servers)
        with self._lock:
            top = max((self._next.get(k, 0) for k in keys), default=0)
            for k in keys:
                self._next[k] = top
            return top


PROMPT_SETS = PromptSets()


def flush_prefix_cache(client: Any, kind: str, *, wait_s: float | None = None) -> None:
    """Flush the server's prefix cache through ``client`` (bench/client.py), waiting up to ``wait_s`` for the
    requests it still runs (default :data:`FLUSH_WAIT_S`); CacheFlushError where it refuses or has no such
    endpoint. SGLang answers 400 while requests run (0.5.23 waits for idle up to its ``timeout`` query
    parameter, older versions refuse at once), vLLM ``{"success": false}`` while blocks are held: both are
    asked again until ``wait_s`` has passed."""
    import requests

    wait_s = FLUSH_WAIT_S if wait_s is None else wait_s
    paths = [FLUSH_PATHS[kind]] if kind in FLUSH_PATHS else list(FLUSH_PATHS.values())
    deadline = time.monotonic() + wait_s
    for path in paths:
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                response = client.post(f"{path}?timeout={left:.1f}" if path == FLUSH_PATHS["sglang"] else path,
                                       None, timeout=left + 30.0)
            except requests.RequestException as exc:
                raise CacheFlushError(f"cache='flush': POST {client.url(path)} failed: {exc}; is the server up? "
                                      "(cache='fresh' needs no flush)") from exc
            if response.status_code == 404 and path != paths[-1]:
                break  # a server of unknown kind: try the other server's endpoint
            refused = _refusal(response, path, kind, wait_s)
            if refused is None:
                return
            if response.status_code in (400, 200) and time.monotonic() < deadline:
                time.sleep(FLUSH_RETRY_S)  # still busy: its last requests are finishing
                continue
            raise CacheFlushError(refused)


def _refusal(response: Any, path: str, kind: str, wait_s: float) -> str | None:
    """Why the flush did not happen (None: it did)."""
    server = {"sglang": "SGLang", "vllm": "vLLM"}.get(kind, "the server")
    where = f"{server} answered POST {path} with HTTP {response.status_code}"
    body = (response.text or "").strip()[:300]
    if response.status_code == 200:
        try:
            answer = response.json()
        except ValueError:
            return None  # SGLang's plain text, or an older vLLM's empty 200
        if isinstance(answer, dict) and answer.get("success") is False:
            return (f"cache='flush': {server} did not reset its prefix cache ({{\"success\": false}} at "
                    f"{path}) within {wait_s:.0f} s: it still held blocks of running requests. Run the "
                    "benchmark where no other client loads the server, or use cache='fresh'")
        return None
    if response.status_code == 404:
        hint = (" vLLM serves it only with VLLM_SERVER_DEV_MODE=1 in its environment (the profile's env)."
                if kind != "sglang" else "")
        return (f"cache='flush': {where}: it has no endpoint to flush its prefix cache.{hint} Or use "
                "cache='fresh' (new prompts every round: no flush needed) or cache='warm' (a cached workload)")
    if response.status_code in (401, 403):
        return (f"cache='flush': {where} ({body!r}): flushing needs the server's admin key (SGLang's "
                "--admin-api-key, where set, is not the key this run sends); use cache='fresh' instead")
    if response.status_code == 400:
        return (f"cache='flush': {where} ({body!r}) for {wait_s:.0f} s: it refuses while requests run or "
                "wait. Run the benchmark where no other client loads the server, or use cache='fresh'")
    return f"cache='flush': {where}: {body!r}"


def cached_round_note(mode: str, rate: float | None, *, round_index: int, rounds: int) -> str | None:
    """The flag of a round that the mode says is uncached but whose hit rate says mostly cached (None: fine)."""
    if mode == "warm" or rate is None or rate < CACHED_SHARE:
        return None
    where = f"round {round_index}" if rounds > 1 else "the run"
    if mode == "fresh":
        why = ("its prompts were new to this run, so the server had them already: another client or process "
               "sending the same seeded prompts, or repeats within the round")
        todo = "use cache='flush', or another seed=, or a server no one else loads"
    else:
        why = "the cache was flushed before it, so its prompts repeat within the round or another client sent them"
        todo = "give distinct prompts, or run where no other client loads the server"
    return (f"{where}: the server served {rate:.0%} of the prompt tokens from its prefix cache although "
            f"cache={mode!r} should measure an uncached workload ({why}); its TTFT and throughput describe a cached "
            f"workload: {todo}")
