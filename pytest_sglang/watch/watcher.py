"""The log watcher: a Kind's rules applied to a server's log as it grows: ready, phases, progress, failure.

One job: `LogWatcher.poll(now)` reads what is new from its `LogTail` and updates what the readiness loop asks:
`ready_at`, `phases`, `phase_label`, `progress`, `failing_since` (the extractor saw a traceback end, a usage
error or a fatal marker), `last_line_at`, `status(now)`, `diagnosis(...)`. It knows no server by name.

Cost: most of a long log (decode batches, access lines, progress bars) can change nothing. Every rule declares
the literals one of which each line it matches holds (kinds.py, shapes.py), so while the extractor is idle, a
block of new bytes is scanned for the literals of the rules still pending (one ``bytes.translate`` pass and a few
``bytes.find``, literals.py) and a stretch of whole lines holding none of them is passed over without splitting
it: only its last lines (the diagnosis' "last lines") and the source of its last prefixed line (the extractor's
owner) are decoded. A line holding a literal, and every line while a traceback is open, goes through every
rule. A rule with no literals declared (a profile's own `ready_pattern`) turns that off: every line is read,
and tested. The results are those of every rule on every line (tests/watch/test_watch_fastpath.py).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from ..config.kinds import Kind
from ..errors import Diagnosis, redact
from .extractor import RootCauseExtractor
from .literals import Hits, LiteralSet
from .prefixes import source_of, strip_prefixes
from .tail import LINE_BREAK, LogTail, clean_line

__all__ = ["LogWatcher", "Progress"]


@dataclass
class Progress:
    label: str  # the bar's description, e.g. "Loading safetensors checkpoint shards"
    percent: int | None
    done: int | None
    total: int | None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _line_start(data: bytes, lo: int, at: int) -> int:
    """Offset of the first byte of the line holding offset `at`; `lo` is a line start at or before it."""
    nl = data.rfind(b"\n", lo, at)
    cr = data.rfind(b"\r", max(lo, nl + 1), at)
    brk = max(nl, cr)
    return brk + 1 if brk >= 0 else lo


def _line_end(data: bytes, pos: int) -> tuple[int, int]:
    """(end of the line starting at `pos`, start of the next one) in a block of whole lines."""
    nl = data.find(b"\n", pos)
    cr = data.find(b"\r", pos, nl if nl >= 0 else len(data))
    if cr >= 0:
        return cr, cr + 2 if data[cr + 1: cr + 2] == b"\n" else cr + 1
    return nl, nl + 1


class LogWatcher:
    """Applies a Kind's rules to a log: readiness, phases, shard progress, failure and its root cause.

    `ready_pattern`: a profile's own regex instead of the kind's (it has no declared literals, so every line
    is tested against it until it matched). `tail`: what `poll` reads. `prefilter=False` runs every rule on
    every line (the reference the prefilter is tested against).
    """

    LAST_LINES = 30
    SILENCE_NOTE_S = 60.0
    READY_LINE_LABEL = "ready line logged"  # "ready" is the readiness loop's word, once its last step passed
    OWN_REQUESTS_MAX_BLOCK = 65536  # a longer block is never the readiness probe's access lines alone

    def __init__(
        self,
        kind: Kind,
        *,
        ready_pattern: str | None = None,
        started_at: float,
        tail: LogTail | None = None,
        prefilter: bool = True,
    ) -> None:
        self.kind = kind
        self.tail = tail
        if ready_pattern is None or ready_pattern == kind.ready_pattern:
            ready_pattern, self._ready_literals = kind.ready_pattern, kind.ready_literals
        else:
            self._ready_literals = ()
        self._ready_re = re.compile(ready_pattern) if ready_pattern else None
        self.started_at = started_at
        self.ready_at: float | None = None
        self.phases: dict[str, float] = {}
        self.phase_label: str | None = None
        self.progress: Progress | None = None
        self.failing_since: float | None = None
        self.last_line_at: float | None = None
        self._own_requests: re.Pattern[bytes] | None = None
        self._progress_phase: str | None = None  # phase label current when progress was last seen
        self._last: deque[str] = deque(maxlen=self.LAST_LINES)
        self._window = 4096  # bytes decoded at the end of a stretch passed over, to find its last lines
        self._extractor = RootCauseExtractor(kind.fatal_markers, prefilter=prefilter)
        self._pending_rules = list(kind.phases)
        self._prefilter = prefilter
        self._rules, self._every = self._literal_sets()

    # what the readiness loop calls --------------------------------------------------------------------------

    def poll(self, now: float, *, final: bool = False) -> None:
        """Read whatever is new from `tail` and apply the rules. `final`: the writer has exited, so also
        take everything left, the last line without a line break included."""
        tail = self.tail
        if tail is None:
            raise ValueError("LogWatcher.poll needs a tail: LogWatcher(..., tail=LogTail(path))")
        for block in tail.read_blocks():
            self._block(tail, block, now)
        if final:
            for block in tail.read_blocks(final=True):
                self._block(tail, block, now)

    def ignore_requests(self, paths: Sequence[str]) -> None:
        """The access-log lines of GETs of ``paths`` (the readiness probe's own requests) are not progress:
        a block of them alone leaves ``last_line_at`` as it was. No paths: every line is progress again."""
        alternatives = b"|".join(re.escape(("/" + p.lstrip("/")).encode()) for p in paths)
        self._own_requests = (re.compile(rb'"GET (?:' + alternatives + rb')(?:\?[^" ]*)? HTTP/1\.[01]" \d{3}')
                              if paths else None)

    def confirm_ready(self) -> None:
        """The readiness loop's last step passed: from now on the phase is "ready" (a later death's error says
        the server had been ready)."""
        self.phase_label = "ready"

    def status(self, now: float) -> str:
        """One line for a live status display, e.g. "loading weights 75% (48/64 shards)"."""
        if self.ready_at is not None:
            return self.phase_label or self.READY_LINE_LABEL
        if self.failing_since is not None:
            causes = self._extractor.root_causes()
            return redact(f"failing: {causes[0].splitlines()[0]}") if causes else "failing"
        label = self.phase_label or "starting"
        p = self.progress
        if p is not None and self._progress_phase == self.phase_label and p.percent is not None:
            label = f"{self.phase_label or p.label} {p.percent}%"
            if p.done is not None and p.total is not None:
                label += f" ({p.done}/{p.total} shards)"
        if self.last_line_at is not None and now - self.last_line_at >= self.SILENCE_NOTE_S:
            label += f" (no log output for {now - self.last_line_at:.0f} s)"
        return label

    def root_causes(self) -> list[str]:
        return self._extractor.root_causes()

    @property
    def failure_is_usage_error(self) -> bool:
        return self._extractor.only_usage_errors

    def diagnosis(self, exit_code: int | None = None) -> Diagnosis:
        causes = self._extractor.root_causes()
        return Diagnosis(
            root_causes=causes,
            reaction_only=bool(causes) and not self._extractor.has_exception,
            last_lines=list(self._last),
            phase=self.phase_label,
            exit_code=exit_code,
        )

    def feed(self, lines: Sequence[str], now: float) -> None:
        """Apply the rules to lines read elsewhere (a line may hold line breaks: it is split on them)."""
        for line in lines:
            for piece in LINE_BREAK.split(line) if ("\n" in line or "\r" in line) else (line,):
                self._line(piece, now)
        if lines:
            self.last_line_at = now

    # internals ----------------------------------------------------------------------------------------------

    def _literal_sets(self) -> tuple[LiteralSet | None, LiteralSet | None]:
        """(the pending rules' literals, those and the extractor's); None where one rule has none declared."""
        literals: list[str] = []
        declared = self._prefilter
        if self._ready_re is not None and self.ready_at is None:
            literals += self._ready_literals
            declared = declared and bool(self._ready_literals)
        for rule in self._pending_rules:
            literals += rule.literals
            declared = declared and bool(rule.literals)
        if self.kind.progress_pattern is not None and self.ready_at is None:
            literals += self.kind.progress_literals
            declared = declared and bool(self.kind.progress_literals)
        if not declared:
            return None, None
        extractor = self._extractor.literals
        rules = LiteralSet(literals)
        return rules, (LiteralSet([*literals, *extractor]) if extractor is not None else None)

    def _block(self, tail: LogTail, data: bytes, now: float) -> None:
        """One block of whole raw lines (see the module's docstring)."""
        if not self._only_own_requests(data):
            self.last_line_at = now
        every = self._every
        found = every.candidates(data) if every is not None else None
        if every is None or found is None:  # a rule without literals, or text to clean: line by line
            for line in tail.split(data):
                self._line(line, now)
            return
        hits = Hits(data, found)
        ex = self._extractor
        pos, n = 0, len(data)
        while pos < n:
            if ex.idle:
                if self._every is not every:  # a rule matched: its literals are looked for no longer
                    every = self._every
                    assert every is not None  # rules only ever go, and every one left has literals
                    hits = Hits(data, every.candidates(data) or (), pos)
                at = hits.first(pos)
                start = n if at < 0 else _line_start(data, pos, at)
                if start > pos:
                    self._pass_over(tail, data, pos, start)
                    pos = start
                    if pos >= n:
                        break
            end, nxt = _line_end(data, pos)
            self._line(tail.decode(data[pos:end]), now)
            pos = nxt

    def _only_own_requests(self, data: bytes) -> bool:
        own = self._own_requests
        if own is None or len(data) > self.OWN_REQUESTS_MAX_BLOCK or b'"GET /' not in data:
            return False
        return all(own.search(line) for line in data.splitlines() if line.strip())

    def _pass_over(self, tail: LogTail, data: bytes, a: int, b: int) -> None:
        """Whole lines [a, b) of a plain block hold no literal of any pending rule, and the extractor is idle:
        only the last lines and the extractor's owner can change. Decode the last few lines only."""
        limit = self._extractor.max_line_chars
        window = self._window
        while True:
            start = max(a, b - window)
            if start > a:  # the line cut by the window's edge is left out
                nl = data.find(b"\n", start, b)
                cr = data.find(b"\r", start, nl if nl >= 0 else b)
                brk = cr if cr >= 0 else nl
                start = brk + (2 if data[brk: brk + 2] == b"\r\n" else 1)
            lines = tail.split(data[start:b])
            shown = [line[:limit] for line in lines if line.strip()]
            if len(shown) >= self.LAST_LINES or start <= a:
                break
            # wide enough for the lines seen so far, with some room; remembered for the next stretch
            window = window * 4 if len(shown) < 4 else window * (self.LAST_LINES + 4) // len(shown)
            self._window = window
        self._last.extend(shown[-self.LAST_LINES:])
        source = None
        for line in reversed(lines):
            source = source_of(line[:limit])
            if source is not None:
                break
        if source is None and start > a:
            source = self._source_before(tail, data, a, start)
        self._extractor.pass_over(source)

    def _source_before(self, tail: LogTail, data: bytes, a: int, b: int) -> str | None:
        """The source of the last line in [a, b) that names one: only lines holding "[" or "(" can."""
        limit = self._extractor.max_line_chars
        bracket, paren = data.rfind(b"[", a, b), data.rfind(b"(", a, b)
        while True:
            at = max(bracket, paren)
            if at < 0:
                return None
            start = _line_start(data, a, at)
            end, _ = _line_end(data, start)
            source = source_of(tail.decode(data[start:end])[:limit])
            if source is not None:
                return source
            if bracket >= start:
                bracket = data.rfind(b"[", a, start)
            if paren >= start:
                paren = data.rfind(b"(", a, start)

    def _line(self, line: str, now: float) -> None:
        """One line through every rule (the extractor's own prefilter aside)."""
        line = line[: self._extractor.max_line_chars]
        if "\x1b" in line:
            line = clean_line(line)
        if line.strip():
            self._last.append(line)
        if self._extractor.feed_line(line) and self.failing_since is None:
            self.failing_since = now
        rules = self._rules
        if rules is not None and not rules.holds_any(line):
            return
        if self._ready_re is not None and self.ready_at is None and self._ready_re.search(line):
            self.ready_at = now  # phases["ready"] is the readiness loop's to write: the line is not the last step
            self.phase_label = self.READY_LINE_LABEL
            # A server that logged its ready line has no startup phase or shard progress left to show; what
            # follows is its serving log, read on only for a crash.
            self._pending_rules = []
            self._rules, self._every = self._literal_sets()
        if self._pending_rules:
            matched = False
            for rule in self._pending_rules:
                if rule.pattern.search(line):
                    matched = True
                    self.phases[rule.name] = now - self.started_at
                    if self.ready_at is None:
                        self.phase_label = rule.label
            if matched:
                self._pending_rules = [r for r in self._pending_rules if r.name not in self.phases]
                self._rules, self._every = self._literal_sets()
        if self.kind.progress_pattern is not None and self.ready_at is None and "%" in line:
            self._progress(line)

    def _progress(self, line: str) -> None:
        pp = self.kind.progress_pattern
        assert pp is not None
        m = pp.search(line)
        if m:
            groups = m.groups()
            desc = line[: m.start(1)].rsplit(":", 1)[0]
            label = re.split(r"[\]|]", strip_prefixes(desc)[2])[-1].strip()
            self.progress = Progress(
                label=label,
                percent=_int(groups[0]) if len(groups) > 0 else None,
                done=_int(groups[1]) if len(groups) > 1 else None,
                total=_int(groups[2]) if len(groups) > 2 else None,
            )
            self._progress_phase = self.phase_label
