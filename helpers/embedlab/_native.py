"""Loads EmbedLab's compiled libraries once, with errors that say how to fix them.

Two libraries sit next to this file after `pip install --no-build-isolation ./helpers`:

* ``_embedlab_ops.so``: the TensorFlow custom-op library (``tf_ops()``), built against one
  TensorFlow version. Loading it under another version raises instead of crashing later.
* ``_embedlab_core``: a framework-free Python module over NumPy / DLPack arrays (``core()``),
  the same kernels for callers without TensorFlow (benchmarks, GPU checks, servers).

There is never a fallback to a built-in TensorFlow op: if the library is missing, you get an
error with the command that builds it.
"""
from __future__ import annotations

import functools
import importlib
import json
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REBUILD = ("rebuild it from the repository root with `make setup` "
            "(or: pip install --no-build-isolation --force-reinstall ./helpers)")


class NativeLibraryError(ImportError):
    """The compiled part of EmbedLab is missing or was built for another TensorFlow."""


@functools.lru_cache(maxsize=None)
def _info_file() -> dict:
    path = _HERE / "_build_info.json"
    if not path.exists():
        raise NativeLibraryError(
            f"EmbedLab's native libraries are not built ({path.name} is missing next to {_HERE}); {_REBUILD}")
    return json.loads(path.read_text())


def _flag(value: str) -> bool:
    return str(value).upper() in ("ON", "TRUE", "1", "YES")


def build_info() -> dict:
    """How the native libraries were built.

    Returns:
        dict with ``embedlab_version``, ``tensorflow_version`` (the one the op library was
        compiled against), ``tf_ops_built``, ``tf_gpu_kernels``, ``cuda_built``,
        ``cuda_option`` (``EMBEDLAB_CUDA`` at build time: AUTO, ON or OFF), ``cuda_reason``
        (why the CUDA kernels were or were not built, e.g. "AUTO: skipped, no GPU visible and
        TensorFlow is a CPU build"), ``cuda_version``, ``cuda_architectures``, ``cpu_isa`` (the CPU kernels' instruction
        set: ``"avx2"`` or ``"baseline"``), ``compiler``, ``build_type``, and
        ``tensorflow_runtime`` (the TensorFlow imported now, or None).

    Example:
        >>> import embedlab
        >>> embedlab.build_info()["cuda_built"] in (True, False)
        True
    """
    info = dict(_info_file())
    for key in ("tf_ops_built", "tf_gpu_kernels", "cuda_built"):
        info[key] = _flag(info[key])
    import sys
    tf = sys.modules.get("tensorflow")
    info["tensorflow_runtime"] = getattr(tf, "__version__", None)
    return info


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset | None:
    """This CPU's feature flags from /proc/cpuinfo (Linux), or None where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return None


def check_cpu(info: dict | None = None, flags: set | None = None) -> None:
    """Raises NativeLibraryError if the CPU kernels were compiled for an instruction set this CPU
    lacks (an AVX2 build copied to an older machine would otherwise die of SIGILL)."""
    info = _info_file() if info is None else info
    isa = info.get("cpu_isa", "baseline")
    if isa == "baseline":
        return
    flags = _cpu_flags() if flags is None else flags
    if flags is not None and isa not in flags:
        raise NativeLibraryError(
            f"EmbedLab's CPU kernels were compiled for {isa.upper()} (on the machine that built them) but this "
            f"CPU has no {isa.upper()}; rebuild them here for the baseline instruction set: "
            f"EMBEDLAB_CPU_ISA=BASELINE pip install --no-build-isolation --force-reinstall ./helpers")


def cuda_built() -> bool:
    """True when the CUDA kernels were compiled in (a GPU is not needed to build them)."""
    return build_info()["cuda_built"]


@functools.lru_cache(maxsize=None)
def core():
    """The framework-free module ``embedlab._embedlab_core`` (see csrc/py/module.cc)."""
    check_cpu()
    try:
        return importlib.import_module("embedlab._embedlab_core")
    except ImportError as e:
        raise NativeLibraryError(f"cannot import embedlab._embedlab_core ({e}); {_REBUILD}") from e


@functools.lru_cache(maxsize=None)
def tf_ops():
    """The TensorFlow op library, loaded once; checks the TensorFlow version first."""
    import tensorflow as tf

    info = build_info()
    if not info["tf_ops_built"]:
        raise NativeLibraryError(f"EmbedLab was built without the TensorFlow op library; {_REBUILD}")
    built, running = info["tensorflow_version"], tf.__version__
    if built != running:
        raise NativeLibraryError(
            f"EmbedLab's op library was built against TensorFlow {built} but TensorFlow {running} is "
            f"imported; custom ops must be compiled against the TensorFlow that loads them: {_REBUILD}")
    if info["tf_gpu_kernels"]:
        # GPU kernels must use the CUDA major version TensorFlow itself was built with.
        tf_cuda = str(tf.sysconfig.get_build_info().get("cuda_version", ""))
        ours = str(info["cuda_version"])
        if tf_cuda.split(".")[0] != ours.split(".")[0]:
            raise NativeLibraryError(
                f"EmbedLab's GPU kernels were compiled with CUDA {ours} but TensorFlow {running} was built "
                f"with CUDA {tf_cuda or 'unknown'}; install a CUDA toolkit whose major version matches "
                f"TensorFlow's (see README, GPU) or build with EMBEDLAB_CUDA=OFF, then {_REBUILD}")
    check_cpu()
    path = _HERE / "_embedlab_ops.so"
    if not path.exists():
        raise NativeLibraryError(f"{path} is missing; {_REBUILD}")
    try:
        return tf.load_op_library(str(path))
    except tf.errors.NotFoundError as e:
        raise NativeLibraryError(f"TensorFlow could not load {path.name}: {e.message}; {_REBUILD}") from e
