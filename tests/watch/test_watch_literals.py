"""Every declared prefilter literal set is really required by its rule: each line a rule matches, in the real
sample logs, the integration logs and the log lines the tests quote, holds one of the rule's literals. An edit
of a regex that lets it match a line without them fails here, instead of silently hiding that line from the
watcher (which passes over stretches holding no literal of a pending rule)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import SAMPLES

from pytest_sglang.config.kinds import KINDS, LinePattern, PhaseRule
from pytest_sglang.watch import RootCauseExtractor, shapes
from pytest_sglang.watch.literals import LiteralSet
from pytest_sglang.watch.prefixes import _LEVEL_TS, _LEVEL_WORDS, SOURCE_LITERALS, source_of, strip_prefixes
from pytest_sglang.watch.tail import LINE_BREAK

REPO = Path(__file__).resolve().parents[2]


def _corpus() -> list[str]:
    """Lines of every real log we have, and of the tests' own sources (the log lines they quote)."""
    paths = sorted((REPO / "tests" / "integration" / "logs").glob("*.log"))
    paths += sorted(SAMPLES.glob("*.log"))
    paths += sorted((REPO / "tests").rglob("*.py"))
    lines: set[str] = set()
    for path in paths:
        for line in LINE_BREAK.split(path.read_bytes().decode("utf-8", "replace")):
            lines.add(line)
    return sorted(lines)


CORPUS = _corpus()


def _variants(line: str) -> set[str]:
    """The line and what the rules see of it: its body after the prefixes, stripped, without a group bar."""
    body = strip_prefixes(line)[2]
    return {line, body, body.strip(), shapes.GROUP_BAR.sub("", body, count=1)}


# (name, literals, does this text match the rule?)
Rule = tuple[str, tuple[str, ...], Callable[[str], bool]]


def _search(pattern: re.Pattern[str]) -> Callable[[str], bool]:
    return lambda text: pattern.search(text) is not None


def _kind_rules() -> list[Rule]:
    rules: list[Rule] = []
    for kind in KINDS.values():
        for phase in kind.phases:
            rules.append((f"{kind.name} phase {phase.name}", phase.literals, _search(phase.pattern)))
        for marker in kind.fatal_markers:
            rules.append((f"{kind.name} fatal {marker.pattern.pattern}", marker.literals, _search(marker.pattern)))
        if kind.ready_pattern:
            rules.append((f"{kind.name} ready", kind.ready_literals, _search(re.compile(kind.ready_pattern))))
        if kind.progress_pattern is not None:
            rules.append((f"{kind.name} progress", kind.progress_literals, _search(kind.progress_pattern)))
    return rules


def _extractor_rules() -> list[Rule]:
    return [
        ("traceback header", shapes.TB_HEADER_LITERALS, lambda t: shapes.TB_HEADER in t),
        ("frame", shapes.FRAME_LITERALS, _search(shapes.FRAME)),
        ("chain", shapes.CHAIN_LITERALS, _search(shapes.CHAIN)),
        ("exception line", shapes.STRONG_LITERALS, lambda t: shapes.exception_line(t, strong=True) is not None),
        ("argparse", shapes.ARGPARSE_LITERALS, _search(shapes.ARGPARSE)),
        ("click usage", shapes.CLICK_USAGE_LITERALS, _search(shapes.CLICK_USAGE)),
        ("exception ignored", shapes.EXCEPTION_IGNORED_LITERALS, _search(shapes.EXCEPTION_IGNORED)),
        ("level prefix", _LEVEL_WORDS, _search(_LEVEL_TS)),
        ("source", SOURCE_LITERALS, lambda t: source_of(t) is not None),
    ]


RULES = _kind_rules() + _extractor_rules()


def _unmatched(literals: tuple[str, ...], matches: Callable[[str], bool], lines: list[str]) -> list[str]:
    """Texts the rule matches that hold none of its literals (the level prefix: start with one)."""
    bad = []
    for line in lines:
        for text in _variants(line):
            if matches(text) and not any(lit in text for lit in literals):
                bad.append(text)
    return bad


@pytest.mark.parametrize("rule", RULES, ids=[r[0] for r in RULES])
def test_declared_literals_are_required(rule: Rule) -> None:
    name, literals, matches = rule
    assert literals, f"{name}: no literals declared, so the watcher reads every line for it"
    assert all(lit and lit.isascii() and "\n" not in lit and "\r" not in lit for lit in literals), literals
    assert not _unmatched(literals, matches, CORPUS)


def test_the_corpus_exercises_the_rules() -> None:
    """The check above means something only where the rules match lines of the corpus."""
    matched = {name for name, _, matches in RULES if any(matches(t) for line in CORPUS for t in _variants(line))}
    for must in ("sglang phase load_weights", "sglang ready", "vllm ready", "sglang progress", "traceback header",
                 "frame", "chain", "exception line", "argparse", "source", "level prefix"):
        assert must in matched, must


def test_a_wrong_declaration_is_caught() -> None:
    wrong = PhaseRule("load_weights", "loading weights", re.compile(r"Load weights? begin"), ("Load weight begin",))
    lines = ["[2025-10-16 09:06:10 TP0] Load weights begin. avail mem=78.58 GB"]
    assert _unmatched(wrong.literals, _search(wrong.pattern), lines)


def test_shipped_kinds_keep_the_prefilter_on() -> None:
    for kind in KINDS.values():
        assert RootCauseExtractor(kind.fatal_markers).literals is not None, kind.name
    # a marker without literals turns the extractor's prefilter off rather than hiding its lines
    assert RootCauseExtractor([LinePattern(re.compile("boom"))]).literals is None
    assert RootCauseExtractor([re.compile("boom")]).literals is None


def test_literal_set_on_lines_and_blocks() -> None:
    s = LiteralSet(["Traceback (most recent call last):", "Error", "atchdog timeout", "Error: "])
    assert s.literals == ("Error", "atchdog timeout", "Traceback (most recent call last):")  # "Error: " is implied
    assert s.holds_any("x RuntimeError: y") and not s.holds_any("Decode batch. #running-req: 5")
    block = b"Decode batch\nWatchdog timeout\nmore\n"
    found = s.candidates(block)
    assert found is not None and b"atchdog timeout" in found
    assert s.candidates(b"nothing to see here\n") == []
    assert s.candidates(b"\x1b[31mErr\x1b[0mor\n") is None  # text to clean: read line by line


@pytest.mark.parametrize("seed", range(20))
def test_block_candidates_hold_every_literal_present(seed: int) -> None:
    """Whatever characters the projection was tuned on, a literal in a block is among its candidates."""
    import random

    rng = random.Random(seed)
    alphabet = "abcdeEFIrlo: ()\"!x\n"
    lits = ["".join(rng.choice(alphabet.strip()) for _ in range(rng.randint(1, 6))) for _ in range(8)]
    lits = [lit for lit in lits if lit.strip() and "\n" not in lit] or ["Error"]
    s = LiteralSet(lits)
    for _ in range(30):
        s._tune("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200))).encode())
        block = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400))).encode() + b"\n"
        found = s.candidates(block)
        assert found is not None
        assert {lit for lit in s.encoded if lit in block} <= set(found)
