"""Every relative link in README.md and docs/*.md points at a file that exists, and an anchor at a heading of it.

The README is a user's page that sends its reader to docs/ for the rest: a link that goes nowhere (a page
renamed, a heading reworded) is a dead end there and a `mkdocs build --strict` failure, so it fails here first,
without mkdocs. Links inside code (fenced blocks, `spans`) are text, not links, and are not read.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^ {0,3}(```|~~~)")
CODE_SPAN = re.compile(r"(`+).+?\1")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)


def prose(text: str, spans: bool = False) -> str:
    """The text with code taken out: fenced blocks, indented blocks after a blank line, and code spans (unless
    `spans`: a heading's anchor keeps their text)."""
    out, fenced, previous_blank = [], False, True
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or (previous_blank and line.startswith("    ") and not line.lstrip().startswith(("-", "*"))):
            previous_blank = previous_blank and not line.strip()
            continue
        previous_blank = not line.strip()
        out.append(line if spans else CODE_SPAN.sub("", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading (and mkdocs' for these pages): lower case, punctuation dropped, spaces to -."""
    text = re.sub(r"`|\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    for line in prose(page.read_text(encoding="utf-8"), spans=True).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            seen[base if base not in seen else f"{base}-{seen[base]}"] = 0
            seen[base] = seen.get(base, 0) + 1
    return set(seen)


def relative_links(page: Path) -> list[str]:
    text = prose(page.read_text(encoding="utf-8"))
    targets = LINK.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]  # http:, mailto:, ...


def test_the_pages_have_links_to_check() -> None:
    readme = relative_links(REPO / "README.md")
    # The README is a user's page pointing into docs/: it must link to them, and so the check has work to do.
    assert sum(t.startswith("docs/") for t in readme) >= 10, readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.name} (has: {sorted(anchors(dest))})")
    assert not broken, f"{page.relative_to(REPO)}:\n" + "\n".join(broken)


def test_the_link_reader_finds_what_it_must_and_skips_code(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# A title: with `code`\n\n## Prefill/decode disaggregation\n\n"
        "[a](x.md) ![img](img/y.png \"t\") [b](x.md#a-title-with-code) [web](https://e.x/z.md)\n"
        "[top](#a-title-with-code)\n"
        "`[not](code-span.md)`\n\n```\n[not](fenced.md)\n```\n\n    [not](indented.md)\n\n[ref]: ref.md\n",
        encoding="utf-8")
    assert relative_links(page) == ["x.md", "img/y.png", "x.md#a-title-with-code", "#a-title-with-code", "ref.md"]
    assert anchors(page) == {"a-title-with-code", "prefilldecode-disaggregation"}
