"""Fixtures of the in-process server tests."""

from __future__ import annotations

import pytest

from pytest_sglang.config import Profile
from pytest_sglang.config.profiles import load_profiles


@pytest.fixture(scope="module")
def profiles(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Profile]:
    """The test module's PROFILES (a pyproject.toml's text), loaded as a user's project is."""
    root = tmp_path_factory.mktemp("profiles")
    (root / "pyproject.toml").write_text(request.module.PROFILES)
    return dict(load_profiles(root, None).profiles)
