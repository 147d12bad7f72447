"""mkdocs hooks (mkdocs.yml): README.md is the site's index, and the links between it and docs/ work on both sides.

On GitHub the README links `docs/ab.md` and a page of docs/ links `../README.md#profile-keys`; on the site the
README is `index.md` beside those pages. The hooks bring the README in as `index.md` and rewrite exactly those
two link forms.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent


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
    return markdown
