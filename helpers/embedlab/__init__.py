"""EmbedLab: large-embedding recommender models on TensorFlow, with compiled kernels.

Submodules are imported on first use, so `import embedlab` is cheap and `embedlab.data`
works before the native library is built. The compiled libraries, loaded on first use:

* `core()`: the framework-free kernels (csrc/core) as a Python module over NumPy / DLPack
  arrays, for callers without TensorFlow (the HPS server, benchmarks, GPU checks);
* `tf_ops()`: the TensorFlow op library (the raw ops behind `embedlab.ops`);
* `build_info()`, `cuda_built()`, `cpu_isa()`, `prefetch_level()`: how they were built and which
  CPU kernels this process runs; `NativeLibraryError` is what they raise when a library is
  missing or was built for another TensorFlow.

`import_tensorflow()` imports TensorFlow without its C++ start-up banner (for notebooks). The
submodules are whatever public modules and packages sit in this folder (names without a leading
underscore): `dir(embedlab)` lists exactly those and the functions above.

    >>> import embedlab
    >>> embedlab.core().cuda_built == embedlab.cuda_built()
    True
    >>> embedlab.cpu_isa() in embedlab.build_info()["cpu_isas_built"]
    True
"""

import importlib as _importlib
import pkgutil as _pkgutil
from pathlib import Path as _Path

__version__ = "0.1.0"

# Functions loaded on first use, from the private module that holds them.
_LAZY = {name: "_native" for name in ("core", "tf_ops", "build_info", "cuda_built", "cpu_isa",
                                       "prefetch_level", "NativeLibraryError")}
_LAZY["import_tensorflow"] = "_tfstart"
_LAZY["SparseInput"] = "sparse_input"       # the one sparse-input type every lookup takes


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
