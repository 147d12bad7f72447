"""pytest's terms to the plugin's: a node id's test id without its profile, and a failure that shows the
plugin's message alone."""

from __future__ import annotations

from typing import NoReturn

import pytest


def strip_param(nodeid: str, param: str | None) -> str:
    """``tests/t.py::test_x[eagle3-128]`` -> ``tests/t.py::test_x[128]`` for profile ``eagle3``."""
    if not param or not nodeid.endswith("]") or "[" not in nodeid:
        return nodeid
    head, _, inner = nodeid[:-1].partition("[")
    parts = inner.split("-")
    if param in parts:
        parts.remove(param)
    elif inner.startswith(param + "-") or inner.endswith("-" + param) or inner == param:
        inner = inner.replace(param, "", 1).strip("-")
        parts = [inner] if inner else []
    return f"{head}[{'-'.join(parts)}]" if parts else head


def fail_with(exc: BaseException) -> NoReturn:
    """Fail with our message alone: no traceback of the plugin, no "During handling of..." chain."""
    raise pytest.fail.Exception(str(exc), pytrace=False) from None
