"""EmbedLab: large-embedding recommender models on TensorFlow, with compiled kernels.

Submodules are imported on first use, so `import embedlab` is cheap and `embedlab.data`
works before the native library is built. `build_info()` and `cuda_built()` load the native
library and report how it was built; `import_tensorflow()` imports TensorFlow without its C++
start-up banner (for notebooks). The submodules are whatever public modules and packages
sit in this folder (names without a leading underscore): `dir(embedlab)` lists exactly those.
"""

import importlib as _importlib
import pkgutil as _pkgutil
from pathlib import Path as _Path

from . import _aliases

_aliases.install()      # old module paths of the notebooks' helpers (embedlab.tutorials)

__version__ = "0.1.0"

# Functions loaded on first use, from the private module that holds them.
_LAZY = {"build_info": "_native", "cuda_built": "_native", "import_tensorflow": "_tfstart"}


def _submodules() -> tuple:
    """The public modules and packages in this package's folder, sorted."""
    return tuple(sorted(m.name for m in _pkgutil.iter_modules([str(_Path(__file__).resolve().parent)])
                        if not m.name.startswith("_")))


def __getattr__(name):
    if name in _submodules():
        return _importlib.import_module(f"{__name__}.{name}")
    if name in _LAZY:
        return getattr(_importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'embedlab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_submodules()) | set(_LAZY))
