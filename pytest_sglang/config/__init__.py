"""Configuration: profiles (load, extends, ${VAR}, validate) and kinds (each server's rules and log literals).

    kinds.py     Kind: how each server kind launches, says it is ready, and says it is failing (SGLANG, VLLM, ...)
    profiles.py  Profile, ProfileSet, load_profiles
    rules.py     what each key's value must be, and the fleet rule across keys
    schema.py    KEYS (PROFILE_KEYS by name): the profile schema, every key written once
    slurm.py     SlurmSpec: a profile's `slurm` table

The names load on first use: the log watcher needs the kinds alone, not the profile loader.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_sglang.config.kinds import GENERIC, KINDS, SGLANG, VLLM, Kind
    from pytest_sglang.config.profiles import Profile, ProfileSet, load_profiles

_HOMES = {"GENERIC": "kinds", "KINDS": "kinds", "SGLANG": "kinds", "VLLM": "kinds", "Kind": "kinds",
          "Profile": "profiles", "ProfileSet": "profiles", "load_profiles": "profiles"}

__all__ = ["GENERIC", "KINDS", "SGLANG", "VLLM", "Kind", "Profile", "ProfileSet", "load_profiles"]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
