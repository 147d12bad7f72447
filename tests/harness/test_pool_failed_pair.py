"""A pair of profiles that failed to start together is not launched together again in the session: each later
A/B test of the pair gets the same error at once instead of waiting the startup out again (on the H200 a 3B
model's pair cost 70 s a test, m15)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_sglang.errors import ABStartupError, PluginError
from pytest_sglang.harness.pool import ServerPool


class Handle:
    def __init__(self, profile: str) -> None:
        self.profile = profile
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_a_pair_that_failed_to_start_fails_again_at_once() -> None:
    launched: list[str] = []

    def launch(profile: str) -> Any:
        launched.append(profile)
        if profile == "big-twin":
            raise PluginError("CUDA out of memory")
        return Handle(profile)

    pool = ServerPool(launch)
    with pytest.raises(ABStartupError, match="the server of profile 'big-twin' failed to start"):
        pool.acquire(["big", "big-twin"])
    assert launched == ["big", "big-twin"]
    with pytest.raises(ABStartupError, match=r"not launched again \(it failed earlier in this session\): A/B big "
                                             "vs big-twin: the server of profile 'big-twin'"):
        pool.acquire(["big", "big-twin"])
    assert launched == ["big", "big-twin"], "nothing was launched for the second test of the pair"
    assert [h.profile for h in pool.acquire(["big"])] == ["big"]  # the profile alone still launches
