"""The package layering of docs/layout.md, read from the source: data flows one way, so no chain of plugin
packages imports back into itself, and the leaves (machine facts, statistics, the environment knobs, the
exceptions) import no other package of the plugin; and the test tree mirrors the package. A move that breaks
either fails here, naming what broke it."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest_sglang

PACKAGE = Path(pytest_sglang.__file__).parent
LEAVES = ("machine", "stats", "envknobs", "errors")


def _imports() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> where (file:line), for every import of pytest_sglang.X in the tree."""
    found: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        own = parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else
                     [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                dotted = name.split(".")
                if dotted[0] == "pytest_sglang" and len(dotted) > 1 and dotted[1] != own:
                    found[own][dotted[1]].append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def _cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in graph.get(node, {}):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt] if nxt in path else [*path, nxt]
            if nxt not in state and (found := visit(nxt, [*path, nxt])):
                return found
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_package_imports_back_into_itself() -> None:
    graph = _imports()
    cycle = _cycle(graph)
    where = [f"{a} -> {b}: {', '.join(graph[a][b])}" for a, b in zip(cycle or [], (cycle or [])[1:], strict=False)]
    assert cycle is None, "packages import each other: " + " | ".join(where)


def test_the_leaves_import_no_other_package_of_the_plugin() -> None:
    graph = _imports()
    allowed = {"machine": {"envknobs", "errors"}, "stats": {"errors"}, "envknobs": {"errors"}, "errors": set()}
    for leaf in LEAVES:
        extra = {pkg: where for pkg, where in graph.get(leaf, {}).items() if pkg not in allowed[leaf]}
        assert not extra, f"{leaf} imports {extra}"


def test_the_walk_sees_the_imports_it_judges() -> None:
    """A broken walk would pass the two tests above on an empty graph."""
    graph = _imports()
    assert "machine" in graph["baseline"] and "stats" in graph["history"] and "server" in graph["plugin"]


CAPABILITY_SUITES = {"fleet", "integration", "remote", "slurm"}  # across packages: one capability end to end
TEST_DATA = {"samples", "tools"}  # what the tests read and run, no tests of a package's own


def test_the_test_tree_mirrors_the_package() -> None:
    """tests/PKG/ holds pytest_sglang/PKG/'s tests; any other folder is a declared capability suite or data."""
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    folders = {p.name for p in Path(__file__).parent.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert packages - folders == set(), "packages without a tests/ folder of their own"
    assert folders - packages - CAPABILITY_SUITES - TEST_DATA == set(), "a tests/ folder that mirrors no package"
