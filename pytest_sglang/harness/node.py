"""Which test a measurement belongs to, in the harness's terms: its node id (the profile parameter taken out
for the baseline's test id) and the properties it gathers for junit's report."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TestRef:
    """A test (or a script's step) that measures: pytest hands its node id and ``item.user_properties``."""

    __test__ = False  # not a pytest test class, whatever its name

    nodeid: str = "script"
    properties: list[tuple[str, object]] = field(default_factory=list)

    def test_id(self, profile: str | None) -> str:
        """The baseline's and the history's key: the node id without the profile parameter."""
        return strip_param(self.nodeid, profile)


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
