"""mkdocs hooks (mkdocs.yml): README.md is the site's index, and the links between it and docs/ work on both sides.

On GitHub the README links `docs/ab.md` and a page of docs/ links `../README.md#profile-keys`; on the site the
README is `index.md` beside those pages. The hooks bring the README in as `index.md` and rewrite exactly those
two link forms. A page that another branch is still writing (BEING_WRITTEN) and that this tree lacks is left
out of the nav and its links become plain text, so a build of this tree stays --strict; once the page lands it
is built and linked like any other.
"""

from __future__ import annotations

import logging
import re
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
BEING_WRITTEN = ("fleet-faults.md", "fleet-real.md")
log = logging.getLogger("mkdocs.hooks.pytest_sglang")


def _absent(config: Any) -> set[str]:
    return {name for name in BEING_WRITTEN if not (Path(config["docs_dir"]) / name).exists()}


def _drop(nav: Any, absent: set[str]) -> Any:
    if isinstance(nav, list):
        return [kept for item in nav if (kept := _drop(item, absent)) not in (None, [], {})]
    if isinstance(nav, dict):
        return {title: kept for title, item in nav.items() if (kept := _drop(item, absent)) not in (None, [], {})}
    return None if nav in absent else nav


def on_config(config: Any) -> Any:
    absent = _absent(config)
    if absent and config["nav"]:
        log.info("left out of the nav until they land: %s", ", ".join(sorted(absent)))
        config["nav"] = _drop(config["nav"], absent)
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    if hasattr(File, "generated"):  # mkdocs 1.6
        files.append(File.generated(config, "index.md", content=readme))
    else:  # mkdocs 1.5: a file of its own in a folder that lasts the build
        folder = tempfile.mkdtemp(prefix="pytest-sglang-docs-")
        (Path(folder) / "index.md").write_text(readme, encoding="utf-8")
        files.append(File("index.md", folder, config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        markdown = re.sub(r"\]\(docs/", "](", markdown)
    markdown = re.sub(r"\]\(\.\./README\.md", "](index.md", markdown)
    for name in _absent(config):
        markdown = re.sub(r"\[([^\]]+)\]\(" + re.escape(name) + r"(#[^)]*)?\)", r"\1", markdown)
    return markdown
