"""Deterministic "model" output and the token schedule of one request.

Output: the same prompt always gives the same tokens (greedy output is identical twice); token ids are
100 + an index into a fixed word list, and the text is " word" per token.

Pacing: the first chunk leaves ttft_ms after the request gets a batch slot; token i (0-based) is due at
start + ttft + i / pace, against absolute deadlines so that no drift builds up. Without speculative
decoding every chunk is one token and pace = decode_tok_s (with ``--stream-interval N``, as SGLang's: the
first token alone, then N tokens a chunk, each chunk leaving when its last token is due). Under speculative
decoding the per-request pace is decode_tok_s * spec_speedup (default speedup 1.0, so measured tok/s still
equals decode_tok_s), and the tokens come in verify steps of about accept_length tokens: step k carries tokens
[floor(k * A), floor((k + 1) * A)) and leaves when its first token is due. So the chunk count is about
tokens / accept_length, and meta_info.spec_verify_ct is that chunk count.

Jitter (the ``jitter`` knob, a fraction j): each busy period runs at its own pace, the decode pace times a
factor drawn uniformly from [1 - j, 1 + j] and the TTFT divided by it. A busy period starts with a request
that arrives after the engine has been idle (nothing running or queued) for at least ``JITTER_IDLE_S``; the
benchmark runner pauses longer than that between rounds, so every round of ``sglang_bench(rounds=N)`` gets
its own pace, while the requests of one round (even back to back at concurrency 1) share one.

Host drift (the ``session_drift`` and ``wander`` knobs, drift.py) multiplies the pace (and divides the TTFT)
of each request by the host's speed as it arrives, on top of the jitter.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
import zlib
from collections.abc import Callable, Generator
from dataclasses import dataclass

WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be has had it "
    "not or have one their its new after who they two but been more first also other some all time into "
    "only most over there when than can these many three city where while may during under such about "
    "world people state between both since later each years known through part"
).split()
TOKEN_ID_BASE = 100
VARIANT_FROM = 4  # output_variant changes the output from this token index on
JITTER_IDLE_S = 0.05  # idle this long, and the next request starts a new busy period (a new paced round)


def prompt_seed(prompt: object) -> int:
    return zlib.crc32(repr(prompt).encode("utf-8", "replace"))


def output_tokens(prompt: object, n: int, variant: int = 0) -> list[int]:
    """The greedy output of ``prompt``; a ``variant`` other than 0 (the ``output_variant`` knob) shifts every
    token from index VARIANT_FROM on, so two profiles' outputs agree on the first VARIANT_FROM tokens only."""
    seed = prompt_seed(prompt)
    return [TOKEN_ID_BASE + (seed + 7 * i + (variant if i >= VARIANT_FROM else 0)) % len(WORDS) for i in range(n)]


def top_candidates(prompt: object, n: int, variant: int, k: int, margin: float) -> list[list[tuple[int, float]]]:
    """Each output position's k best (token id, logprob), at most the vocabulary's len(WORDS): the output's own
    token first, then its rival ``margin`` nats behind (from VARIANT_FROM on, the token the other variant says
    there, variant 0's rival being variant 1, so two variants diverge at a tie of that width; before it, the
    next word), then the next words, a nat apart."""
    own = output_tokens(prompt, n, variant)
    rival = output_tokens(prompt, n, 1 if variant == 0 else 0)
    k = min(k, len(WORDS))
    out = []
    for i, token in enumerate(own):
        second = rival[i] if i >= VARIANT_FROM else TOKEN_ID_BASE + (token - TOKEN_ID_BASE + 1) % len(WORDS)
        cands = [(token, -0.01), (second, -0.01 - margin)][:k]
        step = 1
        while len(cands) < k:
            extra = TOKEN_ID_BASE + (token - TOKEN_ID_BASE + step) % len(WORDS)
            if all(extra != c[0] for c in cands):
                cands.append((extra, -0.01 - margin - len(cands)))
            step += 1
        out.append(cands)
    return out


def detokenize(ids: list[int]) -> str:
    return "".join(" " + WORDS[(t - TOKEN_ID_BASE) % len(WORDS)] for t in ids)


def count_prompt_tokens(prompt: object) -> int:
    """A list of ints counts its length; text counts whitespace-separated words; lists of those add up."""
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
            return len(prompt)
        return sum(count_prompt_tokens(x) for x in prompt)
    if isinstance(prompt, dict):  # a chat message
        return count_prompt_tokens(prompt.get("content") or "")
    return 0


@dataclass(frozen=True)
class Pacing:
    decode_tok_s: float
    ttft_s: float
    accept_length: float | None = None  # None: no speculative decoding
    spec_speedup: float = 1.0
    stream_interval: int = 1  # SGLang's --stream-interval: without speculative decoding, tokens per chunk

    @property
    def pace(self) -> float:
        return self.decode_tok_s * (self.spec_speedup if self.accept_length else 1.0)

    def chunks(self, n: int) -> list[tuple[float, int, int]]:
        """(seconds after the slot was granted, first token index, end index) for each chunk."""
        if n <= 0:
            return [(self.ttft_s, 0, 0)]
        out: list[tuple[float, int, int]] = []
        if not self.accept_length and self.stream_interval <= 1:
            return [(self.ttft_s + i / self.pace, i, i + 1) for i in range(n)]
        if not self.accept_length:  # the first token at once, then every stream_interval, the rest at the end
            cuts = [0, 1, *range(1 + self.stream_interval, n, self.stream_interval), n]
            return [(self.ttft_s + (hi - 1) / self.pace, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)
                    if hi > lo]
        a = max(1.0, self.accept_length)
        k = 0
        while True:
            lo, hi = math.floor(k * a), min(n, math.floor((k + 1) * a))
            if lo >= n:
                break
            out.append((self.ttft_s + lo / self.pace, lo, hi))
            k += 1
        return out


class Engine:
    """Batch slots (max_batch; the rest queue) and paced chunk delivery."""

    def __init__(self, pacing: Pacing, max_batch: int, *, jitter: float = 0.0,
                 rng: random.Random | None = None, host_speed: Callable[[], float] | None = None) -> None:
        self.pacing = pacing
        self.slots = threading.BoundedSemaphore(max_batch)
        self._lock = threading.Lock()
        self.running = 0
        self.queued = 0
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.pace_factor = 1.0  # this busy period's pace multiplier (1.0 without jitter)
        self.host_speed = host_speed  # the host's drift (drift.HostSpeed.factor), read as each request arrives
        self._idle_since: float | None = None  # None: never busy yet

    def _paced(self) -> Pacing:
        """The pacing of a request arriving now: the host's speed now times this round's jitter."""
        factor = (self.host_speed() if self.host_speed else 1.0) * self._jitter_factor()
        if factor == 1.0:
            return self.pacing
        return dataclasses.replace(self.pacing, decode_tok_s=self.pacing.decode_tok_s * factor,
                                   ttft_s=self.pacing.ttft_s / factor)

    def _jitter_factor(self) -> float:
        """This busy period's jitter; draws a new one at the start of a busy period."""
        if not self.jitter:
            return 1.0
        now = time.monotonic()
        with self._lock:
            idle = self.running == 0 and self.queued == 0
            if idle and (self._idle_since is None or now - self._idle_since >= JITTER_IDLE_S):
                self.pace_factor = self.rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
            return self.pace_factor

    def stream(self, tokens: list[int]) -> Generator[tuple[list[int], bool], None, None]:
        """Yield (new token ids, is_last) on schedule; holds a batch slot while it runs."""
        pacing = self._paced()
        with self._lock:
            self.queued += 1
        self.slots.acquire()
        with self._lock:
            self.queued -= 1
            self.running += 1
        try:
            start = time.monotonic()
            plan = pacing.chunks(len(tokens))
            for i, (offset, lo, hi) in enumerate(plan):
                sleep_until(start + offset)
                yield tokens[lo:hi], i == len(plan) - 1
        finally:
            with self._lock:
                self.running -= 1
                if self.running == 0 and self.queued == 0:
                    self._idle_since = time.monotonic()
            self.slots.release()

    def verify_steps(self, n: int) -> int:
        return len(self.pacing.chunks(n))


def sleep_until(deadline: float) -> None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(left)
