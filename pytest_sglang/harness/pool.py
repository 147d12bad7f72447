"""The servers an A/B test needs alive at once, beside the one the ``sglang_server`` fixture keeps.

``sglang_server`` keeps one server alive at a time; the pool is told of it (``adopt``) and lends it to an A/B
test of its profile instead of launching it twice. What the pool launches itself it owns: it stops those an A/B
test no longer needs before launching others (so at most one pair is alive), and all of them at the end of the
session. A handle the fixture owns is never stopped here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from pytest_sglang.errors import ABStartupError, PluginError

if TYPE_CHECKING:
    from pytest_sglang.server.handle import ServerHandle

STARTUP_ADVICE = ("Both servers share this machine: give each a share of the GPU memory (e.g. --mem-fraction-static "
                  "0.25 in each profile's args), pin them to different GPUs (gpus = [0] / gpus = [1]), or measure "
                  "one at a time with @pytest.mark.sglang_ab(..., together=False).")


class ServerPool:
    """Live handles by profile: the fixture's (adopted) and the pool's own (launched for A/B tests)."""

    def __init__(self, launch: Callable[[str], ServerHandle]) -> None:
        self._launch = launch
        self._adopted: dict[str, ServerHandle] = {}
        self._owned: dict[str, ServerHandle] = {}
        self._failed: dict[tuple[str, ...], str] = {}  # profiles that failed to start together -> why

    def adopt(self, handle: ServerHandle) -> None:
        self._adopted[handle.profile] = handle

    def forget(self, handle: ServerHandle) -> None:
        if self._adopted.get(handle.profile) is handle:
            del self._adopted[handle.profile]

    def alive(self) -> list[str]:
        return [*self._adopted, *(p for p in self._owned if p not in self._adopted)]

    def acquire(self, profiles: Sequence[str]) -> list[ServerHandle]:
        """A live handle for each of ``profiles``, all alive at once: reused where one is open, launched in
        order otherwise, after stopping the pool's servers of other profiles. A launch that fails stops what this
        call launched and raises ABStartupError naming the profile and what to change. Profiles that failed to
        start together are not launched together again in this session (each later test of the pair would wait
        the startup out again: 70 s a test for a model that fills the GPU): the same error, at once."""
        earlier = self._failed.get(tuple(profiles))
        if earlier is not None:
            raise ABStartupError(f"not launched again (it failed earlier in this session): {earlier}")
        self.release(keep=profiles)
        handles: list[ServerHandle] = []
        launched: list[str] = []
        for profile in profiles:
            handle = self._adopted.get(profile) or self._owned.get(profile)
            if handle is None:
                try:
                    handle = self._launch(profile)
                except PluginError as exc:
                    for name in launched:
                        self._stop(name)
                    running = [p for p in profiles if p != profile and p not in launched]
                    beside = f" while {', '.join(running)} {'was' if len(running) == 1 else 'were'} running" \
                        if running and len(profiles) > 1 else ""
                    error = ABStartupError(f"A/B {' vs '.join(profiles)}: the server of profile {profile!r} "
                                           f"failed to start{beside}. {STARTUP_ADVICE if len(profiles) > 1 else ''}"
                                           f"\n\n{str(exc).strip()}")
                    self._failed[tuple(profiles)] = str(error)
                    raise error from exc
                self._owned[profile] = handle
                launched.append(profile)
            handles.append(handle)
        return handles

    def release(self, keep: Sequence[str] = ()) -> None:
        """Stop the pool's own servers other than ``keep``'s."""
        for profile in [p for p in self._owned if p not in keep]:
            self._stop(profile)

    def _stop(self, profile: str) -> None:
        handle = self._owned.pop(profile, None)
        if handle is not None:
            handle.close()
