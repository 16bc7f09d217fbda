"""GPU arrays for the CUDA tests, through PyTorch or CuPy, whichever is importable.

The CUDA kernels are tested through `_embedlab_core`'s DLPack functions, so the tests need
device arrays and the caller's stream, not a framework. `find_device(core, needs)` returns a
`Device` (or None and the reason to skip); `needs_gpu(needs)` is the (bool, reason) that the
`needs_gpu` marker of conftest.py skips on. On the GPU machine the module is often a
standalone cmake build on PYTHONPATH (`EMBEDLAB_CORE_STANDALONE=1`); `load_core()` finds it.
"""
from __future__ import annotations

import functools
import os

import numpy as np


def load_core():
    """The framework-free module: the installed package's, else a standalone build."""
    if os.environ.get("EMBEDLAB_CORE_STANDALONE"):  # a standalone cmake build on PYTHONPATH
        import _embedlab_core
        return _embedlab_core
    try:
        import embedlab
        return embedlab.core()
    except Exception:  # the device machine builds the module standalone, outside the package
        import _embedlab_core
        return _embedlab_core


class Device:
    """put / get / full / nan / stream over PyTorch (preferred) or CuPy device arrays."""

    def __init__(self, name: str):
        self.name = name
        if name == "torch":
            import torch
            self.t = torch
        else:
            import cupy
            self.cp = cupy

    def available(self) -> bool:
        if self.name == "torch":
            return self.t.cuda.is_available()
        return self.cp.cuda.runtime.getDeviceCount() > 0

    def put(self, a):
        a = np.ascontiguousarray(a)
        return self.t.from_numpy(a).cuda() if self.name == "torch" else self.cp.asarray(a)

    def get(self, x):
        if self.name == "torch":
            self.t.cuda.synchronize()
            return x.cpu().numpy()
        self.cp.cuda.get_current_stream().synchronize()
        return self.cp.asnumpy(x)

    def full(self, shape, value, dtype):
        """A device array of `shape` filled with `value` (a poison value, so unwritten cells show)."""
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        if self.name == "torch":
            return self.t.full(shape, value, dtype=getattr(self.t, np.dtype(dtype).name), device="cuda")
        return self.cp.full(shape, value, dtype=dtype)

    def nan(self, shape):
        return self.full(shape, float("nan"), np.float32)

    def stream(self) -> int:
        if self.name == "torch":
            return self.t.cuda.current_stream().cuda_stream
        return self.cp.cuda.get_current_stream().ptr


def core_and_device(needs: str = "cuda_device_count"):
    """(core, Device, "") where the module loads, has CUDA kernels (attribute `needs`) and a GPU
    is visible; otherwise the Device is None and the string is the reason to skip."""
    try:
        core = load_core()
    except Exception as e:  # reported as the skip reason
        return None, None, f"cannot import _embedlab_core: {e}"
    dev, reason = find_device(core, needs)
    return core, dev, reason


def find_device(core, needs: str = "cuda_device_count"):
    """(Device, "") where `core` has CUDA kernels (attribute `needs`) and a GPU is visible, else (None, reason)."""
    if core is None:
        return None, "cannot import _embedlab_core"
    if not getattr(core, "cuda_built", False) or not hasattr(core, needs):
        return None, f"_embedlab_core was built without CUDA (no {needs})"
    if hasattr(core, "cuda_device_count") and core.cuda_device_count() == 0:
        return None, "no CUDA device visible"
    for name in ("torch", "cupy"):
        try:
            d = Device(name)
            if d.available():
                return d, ""
        except Exception:
            continue
    return None, "neither PyTorch nor CuPy with CUDA is importable"


@functools.lru_cache(maxsize=None)
def needs_gpu(needs: str = "cuda_device_count") -> tuple[bool, str]:
    """(True, "") where the module loads, has CUDA kernels (attribute `needs`), a GPU is visible
    and PyTorch or CuPy can put arrays on it; otherwise (False, the reason to skip)."""
    _, dev, reason = core_and_device(needs)
    return dev is not None, reason
