"""The prefilter: does a line, or a whole block of raw log bytes, hold one of a set of literals?

One job: rule out, cheaply, the lines no rule can act on. Every rule (kinds.py, shapes.py) declares the literals
one of which each line it matches holds; a `LiteralSet` is the union of the literals of the rules still pending.

A line (`holds_any`): a one-character test per group of literals first (their anchor), then `in`.

A block of bytes (`candidates`, then `Hits`): one ``bytes.translate`` pass keeps only the bytes of a small set
(each literal's rarest characters in server logs, and the control characters) and drops the rest; a literal can
only occur in the block where its own kept bytes occur, in a row, in that projection, so the few literals whose
projection is there are the only ones `bytes.find` then looks for. A block that holds a control character
(ANSI escapes: its text is cleaned, which may join a literal) answers None: read it line by line. Literals with no
rare character are looked for with `bytes.find` in every block.
"""

from __future__ import annotations

from collections.abc import Iterable

from .tail import CONTROL_BYTES

__all__ = ["Hits", "LiteralSet"]

# Printable ASCII from the rarest to the commonest in server logs: byte frequencies of the crash and startup
# logs of shared/samples/logs and tests/integration/logs, averaged with those of a serving log (SGLang decode,
# prefill and access lines, tqdm bars; benchmarks/readiness.py's). Only the cost of the prefilter depends on it.
_RARITY = (
    "$&@\\~J!;+?>*`YQZXjV{}WKUzMHL%<B\"AxSGRDEI^wC|FyNO)(v=Pf97#q][T4685/bkm'3h.dpgcl_-1,2iuso:rtna0e "
)
_RANK = {c: i for i, c in enumerate(_RARITY)}
_RARE = 40  # characters ranked below this are kept in the projection
_PER_LITERAL = 2  # at most this many of a literal's rare characters


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
        # blocks: the projection onto the literals' rare characters and the control characters
        keep = set(CONTROL_BYTES)
        rare: dict[str, bytes] = {}
        for lit in self.literals:
            chars = sorted({c for c in lit if _RANK.get(c, len(_RARITY)) < _RARE}, key=_RANK.__getitem__)
            rare[lit] = "".join(chars[:_PER_LITERAL]).encode()
            keep.update(rare[lit])
        self._delete = bytes(b for b in range(256) if b not in keep)
        encoded = [(lit.encode(), rare[lit]) for lit in self.literals]
        self._probes = tuple((b, b.translate(None, self._delete)) for b, r in encoded if r)
        self._always = tuple(b for b, r in encoded if not r)  # no rare character: looked for in every block
        self.encoded = frozenset(b for b, _ in encoded)

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
        proj = data.translate(None, self._delete)
        if proj and len(proj.translate(None, CONTROL_BYTES)) != len(proj):
            return None
        found = [lit for lit, p in self._probes if p in proj]
        found += self._always
        return found


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
