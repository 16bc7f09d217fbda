"""Loads EmbedLab's compiled libraries once, with errors that say how to fix them.

Two libraries sit next to this file after `pip install --no-build-isolation ./helpers`:

* ``_embedlab_ops.so``: the TensorFlow custom-op library (``tf_ops()``), built against one
  TensorFlow version. Loading it under another version raises instead of crashing later.
* ``_embedlab_core``: a framework-free Python module over NumPy / DLPack arrays (``core()``),
  the same kernels for callers without TensorFlow (benchmarks, GPU checks, servers).

Both hold the CPU kernels once per instruction set of the build (baseline, AVX2 and AVX-512 on
x86-64) and run the best one this CPU supports, chosen when they load (``cpu_isa()``;
``EMBEDLAB_CPU_ISA_RUNTIME=baseline`` or ``avx2`` forces a narrower copy, which gives the same bits).

There is never a fallback to a built-in TensorFlow op: if the library is missing, you get an
error with the command that builds it.
"""
from __future__ import annotations

import ctypes
import functools
import importlib
import json
import os
import sys
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
    """How the native libraries were built, and which CPU kernels this process runs.

    Returns:
        dict with ``embedlab_version``, ``tensorflow_version`` (the one the op library was
        compiled against), ``tf_ops_built``, ``tf_gpu_kernels``, ``cuda_built``,
        ``cuda_option`` (``EMBEDLAB_CUDA`` at build time: AUTO, ON or OFF), ``cuda_reason``
        (why the CUDA kernels were or were not built, e.g. "AUTO: skipped, no GPU visible and
        TensorFlow is a CPU build"), ``cuda_version``, ``cuda_architectures``,
        ``cpu_isas_built`` (the instruction sets the CPU kernels were compiled for:
        ``["baseline", "avx2", "avx512"]`` on x86-64, ``["baseline"]`` with ``EMBEDLAB_CPU_ISA=BASELINE``),
        ``cpu_isa_option`` (``EMBEDLAB_CPU_ISA`` at build time), ``cpu_isa`` (the one this
        process runs, see ``cpu_isa()``), ``compiler``, ``build_type``, and
        ``tensorflow_runtime`` (the TensorFlow imported now, or None).

    Raises:
        NativeLibraryError: ``EMBEDLAB_CPU_ISA_RUNTIME`` asks for kernels that were not built or
            that this CPU cannot run.

    Example:
        >>> import embedlab
        >>> embedlab.build_info()["cpu_isa"] in embedlab.build_info()["cpu_isas_built"]
        True
    """
    info = dict(_info_file())
    for key in ("tf_ops_built", "tf_gpu_kernels", "cuda_built"):
        info[key] = _flag(info[key])
    info["cpu_isas_built"] = _isas_built(info)
    info["cpu_isa"] = cpu_isa()
    tf = sys.modules.get("tensorflow")
    info["tensorflow_runtime"] = getattr(tf, "__version__", None)
    return info


# The instruction sets the CPU kernels can be compiled for (csrc/core/cpu_isa.h), and the
# variable that picks one at load time.
_ISAS = ("baseline", "avx2", "avx512")
ISA_ENV = "EMBEDLAB_CPU_ISA_RUNTIME"
# The /proc/cpuinfo flags each copy needs (Linux lists AVX-512 only where the OS saves its
# registers), and how errors name them.
_ISA_FLAGS = {"baseline": frozenset(), "avx2": frozenset({"avx2"}),
              "avx512": frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})}
_ISA_NAMES = {"avx2": "AVX2", "avx512": "AVX-512 F/BW/DQ/VL"}


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


def _isas_built(info: dict) -> list:
    built = [isa for isa in str(info.get("cpu_isas_built", "")).split(",") if isa]
    if not built or any(isa not in _ISAS for isa in built):
        raise NativeLibraryError(
            f"EmbedLab's build info names no CPU kernels this version knows "
            f"(cpu_isas_built={info.get('cpu_isas_built')!r}); {_REBUILD}")
    return built


def check_cpu_isa(info: dict | None = None, flags: set | None = None, env: dict | None = None) -> str:
    """Checks ``EMBEDLAB_CPU_ISA_RUNTIME`` before a native library loads; returns what it asks
    for: ``"auto"``, ``"baseline"``, ``"avx2"`` or ``"avx512"``.

    The libraries themselves never fail on it (they run the best kernels the CPU supports,
    capped at ``baseline`` or ``avx2`` when it says so), so a value they would not honour must be
    refused here.

    Args:
        info, flags, env: the build info, this CPU's /proc/cpuinfo flags and the environment,
            for tests; None reads the real ones.

    Raises:
        NativeLibraryError: the value is not auto, baseline, avx2 or avx512 (exactly; unset or
            empty means auto), or asks for kernels that were not built or that this CPU cannot run.
    """
    info = _info_file() if info is None else info
    env = os.environ if env is None else env
    built = _isas_built(info)
    raw = env.get(ISA_ENV, "")
    want = raw or "auto"
    if want not in ("auto",) + _ISAS:
        raise NativeLibraryError(f"{ISA_ENV} must be auto, baseline, avx2 or avx512 (or unset), got {raw!r}")
    if want != "auto" and want not in built:
        raise NativeLibraryError(
            f"{ISA_ENV}={raw} but EmbedLab's CPU kernels were built for {', '.join(built)} only "
            f"(EMBEDLAB_CPU_ISA={info.get('cpu_isa_option')}); unset {ISA_ENV}, or rebuild them with "
            f"EMBEDLAB_CPU_ISA=AUTO: {_REBUILD}")
    flags = _cpu_flags() if flags is None else flags
    if want in _ISA_NAMES and flags is not None and not _ISA_FLAGS[want] <= flags:
        raise NativeLibraryError(f"{ISA_ENV}={want} but this CPU has no {_ISA_NAMES[want]}; unset it "
                                 f"(or set it to a narrower one: baseline, avx2)")
    return want


def cpu_isa(info: dict | None = None, flags: set | None = None, env: dict | None = None) -> str:
    """The instruction set of the CPU kernels in this process: ``"baseline"``, ``"avx2"`` or
    ``"avx512"``.

    The native libraries hold one copy of the kernels per instruction set they were built for
    (``build_info()["cpu_isas_built"]``) and run the best one this CPU supports, chosen once
    when they load. ``EMBEDLAB_CPU_ISA_RUNTIME``, read at that moment (so set it before the
    first EmbedLab op or ``core()`` call), overrides the choice: ``auto`` (or unset) chooses,
    ``baseline``, ``avx2`` or ``avx512`` requires that copy. Every copy gives the same bits
    (floats are never contracted into FMAs, nor reordered): forcing one changes only speed.

    Args:
        info, flags, env: as for ``check_cpu_isa``.

    Raises:
        NativeLibraryError: as ``check_cpu_isa``.

    Example:
        >>> import embedlab
        >>> embedlab.cpu_isa(info={"cpu_isas_built": "baseline,avx2,avx512"}, flags={"sse2"}, env={})
        'baseline'
    """
    if info is None and flags is None and env is None:
        loaded = loaded_cpu_isas()
        if loaded:  # what the libraries chose (the same: both read the same variable and CPU)
            return loaded.get("tf_ops", loaded.get("core"))
    info = _info_file() if info is None else info
    want = check_cpu_isa(info, flags, env)
    if want != "auto":
        return want
    built = _isas_built(info)
    if built == ["baseline"]:
        return "baseline"
    flags = _cpu_flags() if flags is None else flags
    if flags is None:  # no /proc/cpuinfo: the library asks the CPU itself (CPUID)
        return core().cpu_isa
    return [isa for isa in built if _ISA_FLAGS[isa] <= flags][-1]


PREFETCH_ENV = "EMBEDLAB_PREFETCH_LEVEL"


def check_prefetch_level(env: dict | None = None) -> str:
    """Checks ``EMBEDLAB_PREFETCH_LEVEL`` before a native library loads; returns what it asks for:
    ``"auto"``, ``"l1"`` or ``"l2"``.

    Raises:
        NativeLibraryError: any other value (unset or empty means auto).

    Example:
        >>> from embedlab import _native
        >>> _native.check_prefetch_level(env={"EMBEDLAB_PREFETCH_LEVEL": "l2"})
        'l2'
    """
    env = os.environ if env is None else env
    raw = env.get(PREFETCH_ENV, "")
    want = raw or "auto"
    if want not in ("auto", "l1", "l2"):
        raise NativeLibraryError(f"{PREFETCH_ENV} must be auto, l1 or l2 (or unset), got {raw!r}")
    return want


def prefetch_level() -> str:
    """Where the CPU forward prefetches the table rows it is about to read in this process:
    ``"l1"`` or ``"l2"``.

    Chosen when a native library loads (csrc/core/cpu_isa.h): L2 on AMD Zen 4, L1 elsewhere (the
    faster of the two on each core it was measured on), or what ``EMBEDLAB_PREFETCH_LEVEL``
    (``l1`` or ``l2``; ``auto`` or unset chooses) says, read at that moment. It changes only speed,
    never results.

    Example:
        >>> import embedlab
        >>> embedlab.prefetch_level() in ("l1", "l2")
        True
    """
    check_prefetch_level()
    lib = _HERE / "_embedlab_ops.so" if tf_ops.cache_info().currsize else Path(core().__file__)
    return _c_string(lib, "embedlab_prefetch_level")


def _c_string(lib: Path, symbol: str) -> str:
    """What `const char* symbol()` of a native library this process has already loaded returns
    (ctypes gets the loaded copy's handle, not a second copy)."""
    fn = getattr(ctypes.CDLL(str(lib)), symbol)
    fn.restype = ctypes.c_char_p
    fn.argtypes = []
    return fn().decode()


def loaded_cpu_isas() -> dict:
    """What each native library loaded in this process reports it runs, by library:
    ``{"core": "avx2", "tf_ops": "avx2"}``; a library not loaded yet is absent."""
    out = {}
    mod = sys.modules.get("embedlab._embedlab_core")
    if mod is not None:
        out["core"] = mod.cpu_isa
    if tf_ops.cache_info().currsize:
        # The op library exports embedlab_cpu_isa() (csrc/core/cpu_isa.h).
        out["tf_ops"] = _c_string(_HERE / "_embedlab_ops.so", "embedlab_cpu_isa")
    return out


def cuda_built() -> bool:
    """True when the CUDA kernels were compiled in (a GPU is not needed to build them).

    Example:
        >>> import embedlab
        >>> embedlab.cuda_built() in (True, False)
        True
    """
    return build_info()["cuda_built"]


@functools.lru_cache(maxsize=None)
def core():
    """The framework-free kernels (csrc/core) as a Python module over NumPy / DLPack arrays.

    The same kernels the TensorFlow ops run, for callers without TensorFlow (the HPS server,
    benchmarks, GPU checks): the CPU lookups, sparse optimizers, CSR building, hash table,
    embedding cache, key routing and Norm decoding, and, where ``cuda_built()``, their CUDA
    versions (the functions ending in ``_cuda`` and ``CudaEmbeddingCache``). The module is
    ``embedlab._embedlab_core`` (csrc/py, one ``<capability>_bindings.cc`` each), imported once.

    Returns:
        The module; ``cuda_built`` and ``cpu_isa`` on it say what this build holds and runs.

    Raises:
        NativeLibraryError: the module is not built, or ``EMBEDLAB_CPU_ISA_RUNTIME`` /
            ``EMBEDLAB_PREFETCH_LEVEL`` ask for something it cannot do.

    Example:
        >>> import numpy as np, embedlab
        >>> keys = np.array([3, 1, 3], np.int64)
        >>> table = embedlab.core().HashTable(1024)
        >>> table.find_or_insert(keys).tolist()
        [0, 1, 0]
    """
    check_cpu_isa()
    check_prefetch_level()
    try:
        return importlib.import_module("embedlab._embedlab_core")
    except ImportError as e:
        raise NativeLibraryError(f"cannot import embedlab._embedlab_core ({e}); {_REBUILD}") from e


@functools.lru_cache(maxsize=None)
def tf_ops():
    """The TensorFlow op library (the raw ``EmbedLab...`` ops behind ``embedlab.ops``), loaded once.

    Returns:
        The module ``tf.load_op_library`` gives: one snake_case function per op
        (``embed_lab_lookup``, ...). ``embedlab.ops`` wraps them with checks and gradients.

    Raises:
        NativeLibraryError: the library is missing, or was built against another TensorFlow
            (or, for its GPU kernels, another CUDA major version) than the one imported.

    Example:
        >>> import embedlab
        >>> hasattr(embedlab.tf_ops(), "embed_lab_aligned_table")
        True
    """
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
    check_cpu_isa()
    check_prefetch_level()
    path = _HERE / "_embedlab_ops.so"
    if not path.exists():
        raise NativeLibraryError(f"{path} is missing; {_REBUILD}")
    try:
        return tf.load_op_library(str(path))
    except tf.errors.NotFoundError as e:
        raise NativeLibraryError(f"TensorFlow could not load {path.name}: {e.message}; {_REBUILD}") from e
