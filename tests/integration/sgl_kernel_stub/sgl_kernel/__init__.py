"""Stand-in for sgl_kernel on a CPU-only machine (put its parent folder on PYTHONPATH of the SGLang server).

PyPI's sglang-kernel wheel is CUDA-only and SGLang's CPU build is compiled from source. SGLang imports a few
names from sgl_kernel at module load and falls back to PyTorch-native code where its CPU ops are missing, so
any attribute resolves to a function that raises NotImplementedError if it is ever called.
"""

from __future__ import annotations

__version__ = "0.0.0+stub"


def __getattr__(name: str):
    if name.startswith("__") and name.endswith("__"):
        raise AttributeError(name)

    def _missing(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is a stub on this CPU-only machine")

    _missing.__name__ = name
    return _missing
