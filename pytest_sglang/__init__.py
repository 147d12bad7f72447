"""pytest-sglang: launch an LLM inference server once per session, know at once when it is ready or broken."""

from pytest_sglang.errors import (
    BaselineError,
    BenchmarkError,
    PluginError,
    PortInUseError,
    ProfileError,
    ServerDiedError,
    ServerStartupError,
)

__all__ = [
    "BaselineError",
    "BenchmarkError",
    "PluginError",
    "PortInUseError",
    "ProfileError",
    "ServerDiedError",
    "ServerStartupError",
]
__version__ = "0.1.0"
