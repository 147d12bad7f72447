"""Configuration: profiles (load, extends, ${VAR}, validate) and kinds (each server's rules and log literals)."""

from pytest_sglang.config.profiles import Profile, ProfileSet, load_profiles
from pytest_sglang.kinds import GENERIC, KINDS, SGLANG, VLLM, Kind

__all__ = ["GENERIC", "KINDS", "SGLANG", "VLLM", "Kind", "Profile", "ProfileSet", "load_profiles"]
