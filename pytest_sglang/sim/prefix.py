"""The simulator's prefix cache: which prompts it has served, so that a repeated one reports a cache hit.

As SGLang's radix cache counts it (page size 1): a request's ``cached_tokens`` is the longest prefix it shares
with a prompt served before, at most its length less one (the last token is always computed, for the first
output's logits); every served prompt is then kept. vLLM's block-granular count is not modelled. The oldest
prompts go first once more than ``capacity`` tokens are kept, as a full cache evicts. The cache only counts:
the simulator's pace does not depend on it. ``clear()`` is the flush (SGLang's ``/flush_cache``, vLLM's
``/reset_prefix_cache``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

CAPACITY_TOKENS = 4_000_000


class PrefixCache:
    def __init__(self, capacity: int = CAPACITY_TOKENS) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._by_first: dict[int, list[tuple[int, ...]]] = {}  # first token -> prompts that start with it
        self._order: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self._tokens = 0

    def serve(self, tokens: Sequence[int]) -> int:
        """The cached prefix length of a prompt about to be served; the prompt is kept from now on."""
        key = tuple(tokens)
        if not key:
            return 0
        with self._lock:
            best = 0
            for kept in self._by_first.get(key[0], ()):
                n = 0
                for a, b in zip(kept, key, strict=False):
                    if a != b:
                        break
                    n += 1
                best = max(best, n)
            self._keep(key)
        return min(best, len(key) - 1)

    def _keep(self, key: tuple[int, ...]) -> None:
        if key in self._order:
            self._order.move_to_end(key)
            return
        self._order[key] = None
        self._by_first.setdefault(key[0], []).append(key)
        self._tokens += len(key)
        while self._tokens > self.capacity and len(self._order) > 1:
            old, _ = self._order.popitem(last=False)
            self._by_first[old[0]].remove(old)
            if not self._by_first[old[0]]:
                del self._by_first[old[0]]
            self._tokens -= len(old)

    def clear(self) -> None:
        with self._lock:
            self._by_first.clear()
            self._order.clear()
            self._tokens = 0
