"""EmbedLab: large-embedding recommender models on TensorFlow, with compiled kernels.

Submodules are imported on first use, so `import embedlab` is cheap and `embedlab.data`
works before the native library is built. `build_info()` and `cuda_built()` load the native
library and report how it was built.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = ("config", "ops", "optimizers", "plugin", "data", "models", "session", "sok", "hps")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in ("build_info", "cuda_built"):
        from . import _native
        return getattr(_native, name)
    raise AttributeError(f"module 'embedlab' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SUBMODULES) + ["build_info", "cuda_built"])
