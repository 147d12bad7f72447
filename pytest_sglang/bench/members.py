"""How a benchmark through a fleet's router spread over its members, from each member's own ``/metrics``.

The router decides where each request goes; only the members know what they served. Each server member
(not the router) is scraped after the warmup and after the last round; the difference is its load: requests,
prompt tokens, generated tokens (None where its /metrics does not say, e.g. SGLang without --enable-metrics).
In a prefill/decode fleet the decode members' generated tokens are the answer's, the prefill members' the
prompts'. Knows nothing about pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_sglang.bench.client import Client
from pytest_sglang.bench.server_metrics import Snapshot, scrape, witness


@dataclass(frozen=True)
class MemberLoad:
    """What one member served during the measured rounds."""

    role: str  # "worker", "prefill", "decode"
    requests: int | None
    prompt_tokens: int | None
    generation_tokens: int | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MemberScrapes:
    """The server members of ``server`` (none for one server): ``mark()`` after the warmup and after the last
    round, then :meth:`loads`."""

    def __init__(self, server: Any) -> None:
        members: Mapping[str, Any] = getattr(server, "members", {}) or {}
        self.members = {name: m for name, m in members.items() if getattr(m, "role", "router") != "router"}
        self.snaps: list[dict[str, Snapshot | None]] = []

    def mark(self) -> None:
        if not self.members:
            return
        snaps = {}
        for name, member in self.members.items():
            client = Client(member.base_url, api_key=member.api_key, timeout=10.0)
            try:
                snaps[name] = scrape(client)
            finally:
                client.close()
        self.snaps.append(snaps)

    def loads(self) -> dict[str, MemberLoad]:
        """Each member's load between the first and the last mark; {} for one server or fewer than two marks."""
        if len(self.snaps) < 2:
            return {}
        first, last = self.snaps[0], self.snaps[-1]
        out = {}
        for name, member in self.members.items():
            before, after = first.get(name), last.get(name)
            seen = witness(before, after) if before is not None and after is not None else None
            out[name] = MemberLoad(member.role, seen.requests if seen else None, seen.prompt_tokens if seen else None,
                                   seen.generation_tokens if seen else None)
        return out

