"""The device callback of the HPS op's GPU kernel (``csrc/tf/hps_kernels_gpu.cc``, ABI in
``csrc/tf/hps_callbacks.h``), registered by :mod:`embedlab.hps.layers`.

The kernel passes the keys' device pointer (int64, or int32 it copied from host memory), the
output's device pointer, the CUDA device ordinal and TensorFlow's stream. When the table is on
the GPU tier of that device, the pointers are viewed in place as arrays of the server's GPU
framework (PyTorch or CuPy, :class:`~embedlab.hps.tiers.DeviceArrays`' choice), TensorFlow's
stream becomes that framework's current stream, ``ParameterServer.lookup(..., device=d)`` runs
(int32 keys are widened on the device by the server) and the rows are copied into the output on
that stream. Ordering by the stream, not by a host sync of it first: the server's work follows
the op that produced the keys and precedes the ops that read the rows with no sync of its own
(the server's lookup already synchronizes that stream once to read its miss count).

Otherwise (no GPU cache for the model, or the device not in its ``deployed_device_list``) the
callback answers ``HOST_PATH`` with the reason, logged once per model, table and device, and the
kernel serves the lookup through the host callback: one copy of the keys to the host, one of the
rows back.

No TensorFlow here: the module runs, and is tested, where the server's GPU tier runs.
"""
from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import threading

import numpy as np

from ._registry import get_server
from .tiers import DeviceArrays

# (config, model, table_id, global_batch_size, keys, key_bytes, n, out, dim, device, stream, err, err_len)
DEVICE_CALLBACK_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64,
                                        ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_int64)
HOST_PATH = 2            # the callback's answer "serve this through the host path" (kEmbedLabHpsHostPath)
_KEY_DTYPES = {8: np.int64, 4: np.int32}
_log = logging.getLogger("embedlab.hps")
_host_path_noted: set = set()
_views: list = []        # the one _DeviceViews of this process, made on the first GPU-tier lookup
_views_lock = threading.Lock()


def _write_err(err_ptr, err_len, text: str) -> None:
    msg = text.encode(errors="replace")[:max(0, err_len - 1)]
    ctypes.memmove(err_ptr, msg + b"\0", len(msg) + 1)


def _check_device_args(keys_ptr, key_bytes, n, out_ptr, dim, device) -> None:
    """The device callback's arguments as the GPU kernel must pass them (raises ValueError)."""
    if key_bytes not in _KEY_DTYPES:
        raise ValueError(f"key_bytes must be 8 (int64 keys) or 4 (int32 keys), got {key_bytes}")
    if n < 1:
        raise ValueError(f"n must be >= 1 (the kernel answers empty lookups itself), got {n}")
    if dim < 1:
        raise ValueError(f"emb_vec_size must be >= 1, got {dim}")
    if device < 0:
        raise ValueError(f"device must be a CUDA device ordinal >= 0, got {device}")
    if not keys_ptr:
        raise ValueError("keys is a null pointer")
    if not out_ptr:
        raise ValueError("out is a null pointer")


def _device_route(ps, model: str, table_id: int, dim: int, device: int) -> str:
    """Which path serves a lookup of (model, table_id) asked for on CUDA device ``device``.

    Args:
        ps: the :class:`~embedlab.hps.ParameterServer`.
        model, table_id: the table.
        dim: the op's ``emb_vec_size``.
        device: the CUDA ordinal of the op's GPU.

    Returns:
        ``""`` when the table is on the GPU tier of ``device`` (its cache there serves it), else
        the reason it is served through the host path (one copy of the keys to the host, one of
        the rows back).

    Raises:
        HPSLookupError: unknown model or table. ValueError: ``dim`` is not the table's.

    Example:
        >>> _device_route(ps, "demo", 0, 2, 0)           # doctest: +SKIP
        "model 'demo' has no GPU cache (cache_tier 'none': gpucache is false, ..."
    """
    info = ps.table_info(model, table_id)
    if info["dim"] != dim:
        raise ValueError(f"emb_vec_size is {dim} but table {table_id} of model {model!r} has vectors of {info['dim']}")
    if info["cache_tier"] != "gpu":
        return (f"model {model!r} has no GPU cache (cache_tier {info['cache_tier']!r}: gpucache is false, or the "
                f"GPU tier cannot run in this process; see ParameterServer.stats()['models'])")
    if device not in info["devices"]:
        return (f"model {model!r} is deployed on GPU device(s) {info['devices']} (deployed_device_list), "
                f"not on cuda:{device}")
    return ""


class _CudaArray:
    """A raw device buffer as a ``__cuda_array_interface__`` (v3) exporter, for a zero-copy view."""

    def __init__(self, ptr: int, shape: tuple, dtype):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": np.dtype(dtype).str, "data": (ptr, False),
                                         "strides": None, "version": 3, "stream": None}


class _DeviceViews:
    """TensorFlow's device buffers as arrays of the server's GPU framework, and TensorFlow's stream
    as that framework's current stream. The framework is the one the server's GPU tier uses
    (:class:`~embedlab.hps.tiers.DeviceArrays`: PyTorch when it sees a GPU, else CuPy), so the
    server's work is enqueued on TensorFlow's stream.
    """

    def __init__(self):
        self.name = DeviceArrays().name
        if self.name == "torch":
            import torch
            self.t = torch
        else:
            import cupy
            self.cp = cupy

    def view(self, ptr: int, shape: tuple, dtype, device: int):
        """A view of ``ptr`` on ``device``, never a copy (the output is written through it)."""
        if self.name == "torch":
            a = self.t.as_tensor(_CudaArray(ptr, shape, dtype), device=f"cuda:{device}")
            got = a.data_ptr()
        else:
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            mem = self.cp.cuda.UnownedMemory(ptr, nbytes, None, device)
            a = self.cp.ndarray(shape, dtype, self.cp.cuda.MemoryPointer(mem, 0))
            got = a.data.ptr
        if got != ptr:
            raise RuntimeError(f"{self.name} made a copy of the device buffer at {ptr:#x} instead of a view")
        return a

    def on_stream(self, stream: int, device: int):
        """Context: ``device`` current, and TensorFlow's ``stream`` its current stream."""
        cm = contextlib.ExitStack()
        if self.name == "torch":
            cm.enter_context(self.t.cuda.device(device))
            cm.enter_context(self.t.cuda.stream(self.t.cuda.ExternalStream(stream, device=f"cuda:{device}")))
        else:
            cm.enter_context(self.cp.cuda.Device(device))
            cm.enter_context(self.cp.cuda.ExternalStream(stream, device))
        return cm

    def copy(self, out, rows) -> None:
        """rows -> out, both on the device, on the current stream."""
        if self.name == "torch":
            out.copy_(rows)
        else:
            self.cp.copyto(out, rows)


def _get_views() -> _DeviceViews:
    with _views_lock:
        if not _views:
            _views.append(_DeviceViews())
        return _views[0]


def _device_lookup_callback(config, model, table_id, global_batch_size, keys_ptr, key_bytes, n, out_ptr, dim, device,
                            stream, err_ptr, err_len):
    """The GPU kernel's callback (hps_callbacks.h): 0 when the rows are in ``out`` (GPU tier),
    ``HOST_PATH`` (2) with the reason in ``err`` when the kernel must serve the lookup through
    the host callback, 1 with the error in ``err``."""
    try:
        _check_device_args(keys_ptr, key_bytes, n, out_ptr, dim, device)
        model_s, cfg = model.decode(), (config.decode() if config else "")
        ps = get_server(cfg, global_batch_size=global_batch_size)
        reason = _device_route(ps, model_s, int(table_id), int(dim), int(device))
        if reason:
            key = (cfg, model_s, int(table_id), int(device))
            if key not in _host_path_noted:
                _host_path_noted.add(key)
                _log.warning("EmbedLabHpsLookup on cuda:%d, table %d of model %r: served through the host path "
                             "(one copy of the keys to the host, one copy of the rows back): %s",
                             device, table_id, model_s, reason)
            _write_err(err_ptr, err_len, reason)
            return HOST_PATH
        v = _get_views()
        with v.on_stream(int(stream or 0), int(device)):
            keys = v.view(keys_ptr, (n,), _KEY_DTYPES[key_bytes], device)
            out = v.view(out_ptr, (n, dim), np.float32, device)
            v.copy(out, ps.lookup(model_s, int(table_id), keys, device=int(device)))
        return 0
    except BaseException as e:  # never let an exception cross into C++
        _write_err(err_ptr, err_len, f"{type(e).__name__}: {e}")
        return 1
