"""Fixtures shared by the plugin's own tests."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator

import psutil
import pytest
from helpers import wait_for_no_processes


@pytest.fixture
def mark() -> Iterator[str]:
    """A unique TEST_MARK; asserts at the end that no process carrying it survived, and kills any that did."""
    value = uuid.uuid4().hex
    yield value
    left = wait_for_no_processes(value)
    for proc in left:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    assert not left, f"orphaned server processes survived: {[(p.pid, p.name()) for p in left]}"
