"""pytest-sglang: launch an LLM inference server once per session, know at once when it is ready or broken."""

from pytest_sglang.errors import (
    BaselineError,
    BenchmarkError,
    BenchmarkFailedError,
    PluginError,
    PortInUseError,
    ProfileComparisonError,
    ProfileError,
    RemoteError,
    ResultNotFoundError,
    ServerDiedError,
    ServerError,
    ServerRequestError,
    ServerStartupError,
)

__all__ = [
    "BaselineError",
    "BenchmarkError",
    "BenchmarkFailedError",
    "PluginError",
    "PortInUseError",
    "ProfileComparisonError",
    "ProfileError",
    "RemoteError",
    "ResultNotFoundError",
    "ServerDiedError",
    "ServerError",
    "ServerRequestError",
    "ServerStartupError",
]
__version__ = "0.1.0"
