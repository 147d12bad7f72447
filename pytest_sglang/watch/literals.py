"""The prefilter: does a line, or a whole block of raw log bytes, hold one of a set of literals?

One job: rule out, cheaply, the lines no rule can act on. Every rule (kinds.py, shapes.py) declares the literals
one of which each line it matches holds; a `LiteralSet` is the union of the literals of the rules still pending.

A line (`holds_any`): a one-character test per group of literals first (their anchor), then `in`.

A block of bytes (`candidates`, then `Hits`): one ``bytes.translate`` pass keeps only the bytes of a small set
(each literal's two rarest characters in this log, counted on a sample now and then, and the control characters)
and drops the rest. A literal can only occur in the block where its own kept bytes occur, in a row, in that
projection, so only the literals whose projection is there (a ``memchr`` for its rarest character, then ``in``)
are looked for with `bytes.find`. A block that holds a control character (ANSI escapes: its text is cleaned,
which may join a literal) answers None: read it line by line.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from .tail import CONTROL_BYTES

__all__ = ["Hits", "LiteralSet"]

_PER_LITERAL = 2  # a literal is probed by its two rarest characters in the log (more, where they never occur)
_RETUNE_BYTES = 16 << 20  # the rarest characters are counted again after this much log
_SAMPLE_BYTES = 16 << 10  # on this much of it (sooner, after 64 times the sample, when a block was shorter)


def minimal(literals: Iterable[str]) -> tuple[str, ...]:
    """The literals, less those that contain another one (finding the shorter one says enough)."""
    out: list[str] = []
    for lit in sorted(set(literals), key=lambda x: (len(x), x)):
        if not any(shorter in lit for shorter in out):
            out.append(lit)
    return tuple(out)


class LiteralSet:
    """A set of literals (non-empty ASCII strings), tested on one line or on a block of raw bytes."""

    def __init__(self, literals: Iterable[str]) -> None:
        self.literals = minimal(literals)
        for lit in self.literals:
            if not lit or not lit.isascii():
                raise ValueError(f"a prefilter literal must be a non-empty ASCII string: {lit!r}")
        # lines: literals grouped under a character each holds (its first capital letter; "" when it has
        # none): one `in` of a character rules out a whole group for most lines
        groups: dict[str, list[str]] = {}
        for lit in self.literals:
            anchor = next((c for c in lit if "A" <= c <= "Z"), "")
            groups.setdefault(anchor, []).append(lit)
        self._groups = tuple((a, tuple(groups[a])) for a in sorted(groups))
        self.encoded = frozenset(lit.encode() for lit in self.literals)
        self._scanned = 0  # log bytes scanned since the rarest characters were counted
        self._retune_at = 0
        self._delete = b""
        self._probes: tuple[tuple[bytes, bytes, bytes], ...] = ()

    def holds_any(self, line: str) -> bool:
        for anchor, group in self._groups:
            if anchor in line:  # "" is in every line
                for lit in group:
                    if lit in line:
                        return True
        return False

    def candidates(self, data: bytes) -> list[bytes] | None:
        """The literals (encoded) that may occur in `data`, a superset of those that do; None when `data`
        holds a control character."""
        if self._scanned >= self._retune_at:
            self._tune(data[-_SAMPLE_BYTES:])
        self._scanned += len(data)
        proj = data.translate(None, self._delete)
        if proj and len(proj.translate(None, CONTROL_BYTES)) != len(proj):
            return None
        return [lit for lit, probe, rarest in self._probes if rarest in proj and probe in proj]

    def _tune(self, sample: bytes) -> None:
        """Choose the projection's characters: each literal's two rarest in `sample`, and those it never holds
        (any choice is correct; rare ones keep the projection short and the probe selective; a probe of more
        characters is found faster, one of more common ones makes the projection longer: two measured best)."""
        self._scanned = 0
        self._retune_at = _RETUNE_BYTES if len(sample) >= _SAMPLE_BYTES else 64 * max(len(sample), 256)
        counts = Counter(sample)
        keep = set(CONTROL_BYTES)
        for lit in self.encoded:
            chars = sorted(set(lit), key=lambda c: (counts[c], c))
            keep.update(c for i, c in enumerate(chars) if i < _PER_LITERAL or counts[c] == 0)
        self._delete = bytes(b for b in range(256) if b not in keep)
        probes = []
        for lit in sorted(self.encoded):
            probe = lit.translate(None, self._delete)
            probes.append((lit, probe, bytes([min(probe, key=lambda c: (counts[c], c))])))
        self._probes = tuple(probes)


class Hits:
    """Where the next occurrence of any of some literals is in `data`, from a position that only grows."""

    def __init__(self, data: bytes, literals: Iterable[bytes], start: int = 0) -> None:
        self._data = data
        self._next: dict[bytes, int] = {}
        for lit in literals:
            at = data.find(lit, start)
            if at >= 0:
                self._next[lit] = at

    def first(self, pos: int) -> int:
        """The first offset >= `pos` where one of the literals starts; -1: none."""
        best = -1
        stale = [lit for lit, at in self._next.items() if at < pos]
        for lit in stale:
            at = self._data.find(lit, pos)
            if at < 0:
                del self._next[lit]
            else:
                self._next[lit] = at
        for at in self._next.values():
            if best < 0 or at < best:
                best = at
        return best
