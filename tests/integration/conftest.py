"""Fixtures for the real-server tests; the helpers live in realservers.py (see its docstring)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from realservers import TinyModels, reap


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))


@pytest.fixture
def mark() -> Iterator[str]:
    """A TEST_MARK for one inner project's servers; whatever carries it at the end is killed and reported."""
    value = uuid.uuid4().hex
    yield value
    left = reap(value)
    assert not left, f"server processes survived the inner session: {left}"
