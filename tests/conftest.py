"""Fixtures shared by the plugin's own tests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from helpers import reap_marked


@pytest.fixture
def mark() -> Iterator[str]:
    """A unique TEST_MARK; asserts at the end that no process carrying it survived, and kills any that did."""
    value = uuid.uuid4().hex
    yield value
    left = reap_marked(value)
    assert not left, f"orphaned server processes survived: {left}"
