"""The storage tiers of the parameter server, one class per kind, all with one interface.

A tier holds several tables, each named by a string (``hps_et.<model>.<table>``, HugeCTR's
naming) with a fixed row width ``dim``. Every method works on a batch:

* ``find(table, keys, out) -> missing``: writes the rows it holds into ``out[i]`` and returns
  the positions ``i`` (int64, ascending) it did not write;
* ``insert(table, keys, values)``: inserts or overwrites rows;
* ``erase(table, keys)``; ``size(table)``; ``close()``.

A tier that cannot be reached raises :class:`TierUnavailable`; the :class:`~embedlab.hps.ParameterServer`
then logs it once, counts it, and goes on with the tiers below. Nothing here imports
TensorFlow (the Triton python backend runs the server without it).
"""
from __future__ import annotations

import contextlib
import logging
import math
import operator
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

log = logging.getLogger("embedlab.hps")

__all__ = ["TierUnavailable", "TierFull", "TierError", "CacheTier", "GpuCacheTier", "DeviceArrays", "HashMapTier",
           "RedisTier", "RocksDBTier", "gpu_tier_available", "redis_unavailable_errors"]


class TierUnavailable(RuntimeError):
    """The tier cannot be reached right now (a Redis outage); lookups fall through."""


class TierFull(RuntimeError):
    """The tier refused a write because it is full (a Redis at ``maxmemory`` under the
    ``noeviction`` policy answers OOM); it still answers reads, so it is not marked down."""


class TierError(RuntimeError):
    """A tier cannot be set up (bad path, wrong credentials); raised at start-up."""


def _check_rows(keys: np.ndarray, values: np.ndarray, dim: int, what: str) -> np.ndarray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.shape != (keys.shape[0], dim):
        raise ValueError(f"{what}: values must be [{keys.shape[0]}, {dim}], got {values.shape}")
    return values


# ---- tiers over EmbedLab's native kernels ---------------------------------------------------

def _scatter_values(vals, rows: np.ndarray, dim: int, out: np.ndarray, found: np.ndarray) -> int:
    """Writes the byte values `vals` (None = absent) of a database's multi-get into out[rows].

    A value must be exactly `dim` little-endian float32s; one of another length is a miss and is
    counted, never returned as a vector. Returns the number of wrong-length values.
    """
    want = 4 * dim
    if None in vals:
        lens = np.fromiter((-1 if v is None else len(v) for v in vals), np.int64, len(vals))
    else:                       # every key found (the common case): no Python-level loop
        lens = np.fromiter(map(len, vals), np.int64, len(vals))
    ok = lens == want
    bad = int(np.count_nonzero((lens >= 0) & ~ok))
    if ok.all():
        buf = b"".join(vals)
    elif ok.any():
        buf = b"".join([v for v, o in zip(vals, ok) if o])
    else:
        return bad
    hit = rows[ok]
    out[hit] = np.frombuffer(buf, dtype="<f4").reshape(-1, dim)
    found[hit] = True
    return bad


class CacheTier:
    """The embedding cache (``csrc/core/embedding_cache.h``): set-associative, one per table.

    ``capacity`` rows per table (``gpucacheper`` x the table's rows, at least one set);
    ``static=True`` is HugeCTR's static cache (filled once, never updated).
    """
    name = "cache"

    def __init__(self, static: bool = False, ways: int = 8):
        from .._native import core
        self._core = core()
        self._static = static
        self._ways = ways
        self._tables: dict[str, object] = {}

    def add_table(self, table: str, dim: int, capacity: int) -> None:
        capacity = max(int(capacity), self._ways)
        self._tables[table] = self._core.EmbeddingCache(capacity, dim, ways=self._ways, static=self._static)

    def capacity(self, table: str) -> int:
        return int(self._tables[table].capacity)

    def find(self, table, keys, out):
        return np.asarray(self._tables[table].lookup(keys, out), dtype=np.int64)

    def insert(self, table, keys, values):
        self._tables[table].insert(keys, values)

    def update(self, table, keys, values) -> int:
        """Overwrites rows already cached (others are not inserted); returns how many."""
        return int(self._tables[table].update(keys, values))

    def erase(self, table, keys):
        return int(self._tables[table].erase(keys))

    def size(self, table) -> int:
        return int(self._tables[table].size())

    def clear(self, table=None):
        for t, c in self._tables.items():
            if table is None or t == table:
                c.clear()

    def stats(self, table):
        return self._tables[table].stats()

    def close(self):
        self._tables.clear()


# ---- the embedding cache on a GPU -----------------------------------------------------------

class DeviceArrays:
    """The few device-array operations the GPU tier needs, over PyTorch (preferred) or CuPy.

    Keys and rows cross frameworks through DLPack, zero-copy: a CuPy or TensorFlow tensor on the
    GPU is read in place, and a result can be handed back in the caller's framework. Work is
    enqueued on the backend's current stream of the device (``torch.cuda.current_stream(d)``,
    CuPy's current stream), so a lookup is ordered after the caller's earlier work there.

    Args:
        name: ``"torch"`` or ``"cupy"``; None picks PyTorch when it sees a GPU, else CuPy.

    Example:
        >>> xp = DeviceArrays()                       # doctest: +SKIP
        >>> xp.get(xp.put(np.arange(3), 0)).tolist()  # doctest: +SKIP
        [0, 1, 2]
    """

    def __init__(self, name: str | None = None):
        errors = []
        for cand in ([name] if name else ["torch", "cupy"]):
            try:
                if cand == "torch":
                    import torch
                    if not torch.cuda.is_available():
                        raise RuntimeError("torch.cuda.is_available() is False")
                    self.t = torch
                elif cand == "cupy":
                    import cupy
                    if cupy.cuda.runtime.getDeviceCount() < 1:
                        raise RuntimeError("CuPy sees no GPU")
                    self.cp = cupy
                else:
                    raise ValueError(f"DeviceArrays: name must be 'torch' or 'cupy', got {cand!r}")
                self.name = cand
                self._setup()
                return
            except ImportError as e:
                errors.append(f"{cand}: {e}")
            except RuntimeError as e:
                errors.append(f"{cand}: {e}")
        raise RuntimeError("the GPU tier needs PyTorch or CuPy with CUDA (" + "; ".join(errors) + ")")

    def _setup(self) -> None:
        """What the request path reads per call, looked up once: the backend's array type and
        int64 dtype (identity-compared), its device objects, the raw current-stream getter."""
        self._devs: dict[int, object] = {}
        if self.name == "torch":
            t = self.t
            self.tensor_type, self.int64, self._f32 = t.Tensor, t.int64, t.float32
            self.length = operator.methodcaller("size", 0)      # a C method (len() is Python in torch)
            # What the compiled module is handed: a DLPack capsule made in C. Tensor.__dlpack__
            # is Python (stream checks, device queries: microseconds per array); the binding
            # runs on the current stream itself, so those checks have nothing to order.
            self.to_binding = t.utils.dlpack.to_dlpack
            self._raw_stream = getattr(t._C, "_cuda_getCurrentRawStream", None)
        else:
            self.tensor_type, self.int64, self._f32 = self.cp.ndarray, np.dtype(np.int64), np.float32
            self.length = len
            self.to_binding = _same
            self._raw_stream = None

    def _device(self, device: int):
        """The backend's device object of ordinal ``device`` (kept: building one costs microseconds)."""
        dv = self._devs.get(device)
        if dv is None:
            dv = self._devs[device] = self.t.device("cuda", device) if self.name == "torch" else device
        return dv

    # -- framework of an object ---------------------------------------------------------------
    @staticmethod
    def framework(x) -> str:
        """"torch" / "cupy" for their device arrays, "dlpack" for another CUDA DLPack object
        (a TensorFlow GPU tensor, a capsule), "" for host arrays."""
        if type(x) is np.ndarray:
            return ""
        mod = type(x).__module__
        if mod.startswith("torch"):
            return "torch" if getattr(x, "is_cuda", False) else ""
        if mod.startswith("cupy"):
            return "cupy"
        if type(x).__name__ == "PyCapsule":
            return "dlpack"
        dev = getattr(x, "__dlpack_device__", None)
        if dev is not None and not isinstance(x, np.ndarray):
            try:
                return "dlpack" if int(dev()[0]) in (2, 3, 13) else ""    # kDLCUDA, kDLCUDAHost, managed
            except Exception:
                return ""
        return ""

    def import_array(self, x):
        """A device array of this backend viewing x (zero-copy DLPack), or x itself."""
        if self.name == "torch":
            return x if isinstance(x, self.t.Tensor) else self.t.utils.dlpack.from_dlpack(x)
        return x if isinstance(x, self.cp.ndarray) else self.cp.from_dlpack(x)

    def export_array(self, x, framework: str):
        """x (this backend's) as an array of `framework` ("torch" / "cupy"; others get this backend's)."""
        if framework == self.name or framework not in ("torch", "cupy"):
            return x
        if framework == "cupy":
            import cupy
            return cupy.from_dlpack(x)
        import torch
        return torch.utils.dlpack.from_dlpack(x)

    # -- arrays ---------------------------------------------------------------------------------
    def fast_keys(self, x) -> bool:
        """True when x is already a contiguous 1-D int64 device array (nothing to check or convert)."""
        if self.name == "torch":
            return x.dtype is self.t.int64 and x.dim() == 1 and x.is_contiguous()
        return x.dtype == np.int64 and x.ndim == 1 and x.flags.c_contiguous

    def contiguous(self, x) -> bool:
        return x.is_contiguous() if self.name == "torch" else x.flags.c_contiguous

    def device_index_of(self, x) -> int:
        """The CUDA ordinal of a backend array, -1 for a host (CPU) tensor."""
        if self.name == "torch":
            return x.get_device()
        return int(x.device.id)

    def dtype_name(self, x) -> str:
        return str(x.dtype).replace("torch.", "")

    def device_of(self, x) -> int:
        return x.get_device() if self.name == "torch" else int(x.device.id)

    def as_int64_1d(self, x):
        if self.name == "torch":
            if x.dtype != self.t.int64:
                x = x.to(self.t.int64)
            return x if x.is_contiguous() else x.contiguous()
        return self.cp.ascontiguousarray(x, dtype=self.cp.int64)

    def empty(self, shape, dtype, device: int):
        if self.name == "torch":
            return self.t.empty(shape, dtype=getattr(self.t, np.dtype(dtype).name), device=f"cuda:{device}")
        with self.cp.cuda.Device(device):
            return self.cp.empty(shape, dtype=dtype)

    def empty_f32(self, n: int, device: int):
        """An uninitialized 1-D float32 device array of n entries."""
        if self.name == "torch":
            return self.t.empty(n, dtype=self._f32, device=self._device(device))
        return self.cp.empty(n, dtype=np.float32)      # under the caller's device_context

    def put(self, a: np.ndarray, device: int, stream=None):
        """Host -> device copy of a (on `stream`, else the current stream of the device)."""
        a = np.ascontiguousarray(a)
        if self.name == "torch":
            if stream is None:
                return self.t.from_numpy(a).to(self._device(device))
            with self.t.cuda.stream(stream):
                return self.t.from_numpy(a).to(self._device(device))
        with self.cp.cuda.Device(device), (stream if stream is not None else contextlib.nullcontext()):
            return self.cp.asarray(a)

    def get(self, x) -> np.ndarray:
        """Device -> host copy (waits for the work that produced x on the current stream)."""
        if self.name == "torch":
            return x.cpu().numpy()
        return self.cp.asnumpy(x)

    def take(self, x, idx):
        return x[idx]

    def scatter(self, out, idx, rows) -> None:
        out[idx] = rows

    def cat(self, xs: list):
        """One device array of the 1-D arrays xs, end to end."""
        if self.name == "torch":
            return self.t.cat(xs)
        return self.cp.concatenate(xs)

    def split_views(self, flat, shapes: list) -> list:
        """Views of the 1-D array `flat`, end to end, one per shape ((n,) or (n, dim))."""
        sizes = [math.prod(sh) for sh in shapes]
        if self.name == "torch":
            parts = self.t.split(flat, sizes)
            return [p if len(sh) == 1 else p.view(sh) for p, sh in zip(parts, shapes)]
        out, o = [], 0
        for sz, sh in zip(sizes, shapes):
            out.append(flat[o:o + sz].reshape(sh))
            o += sz
        return out

    def row_views(self, flat, offsets: list, shapes: list) -> list:
        """Views ``flat[o:o + n * dim]`` as ``[n, dim]``, one per (offset, shape)."""
        if self.name == "torch":
            return [flat[o:o + n * d].view(n, d) for o, (n, d) in zip(offsets, shapes)]
        return [flat[o:o + n * d].reshape(n, d) for o, (n, d) in zip(offsets, shapes)]

    def row_view(self, flat, offset: int, n: int, dim: int):
        """``flat[offset:offset + n * dim]`` viewed as ``[n, dim]``."""
        return flat[offset:offset + n * dim].reshape(n, dim)

    def views(self, flat, segs: list, framework: str) -> list:
        """Per-table views of a request's output ``flat`` (this backend's), in ``framework``
        ("torch" / "cupy"; others get this backend's): ``segs`` are runs ``(start, end, dim,
        sizes)`` of tables of one width lying end to end, each run viewed as ``[-1, dim]`` (1-D
        for dim 0) and split by its sizes. Crosses DLPack at most once, for the whole buffer."""
        if framework in ("torch", "cupy") and framework != self.name:
            flat = self.export_array(flat, framework)
        else:
            framework = self.name
        out = []
        if framework == "torch":
            for s, e, d, ns in segs:
                part = flat[s:e]
                if d:
                    part = part.view(-1, d)
                out.extend(part.split_with_sizes(ns))
            return out
        return self.host_views(flat, segs)

    @staticmethod
    def host_views(flat, segs: list) -> list:
        """:meth:`views` of a NumPy (or CuPy) array."""
        out = []
        for s, e, d, ns in segs:
            part = flat[s:e]
            if d:
                part = part.reshape(-1, d)
            o = 0
            for n in ns:
                out.append(part[o:o + n])
                o += n
        return out

    def min_max(self, x) -> tuple[int, int]:
        return int(x.min()), int(x.max())

    # -- streams and events ---------------------------------------------------------------------
    def current_stream(self, device: int):
        if self.name == "torch":
            return self.t.cuda.current_stream(device)
        with self.cp.cuda.Device(device):
            return self.cp.cuda.get_current_stream()

    def current_stream_ptr(self, device: int) -> int:
        """The current stream's cudaStream_t (PyTorch: read without building a Stream object)."""
        if self.name == "torch":
            raw = self._raw_stream
            return int(raw(device)) if raw is not None else int(self.t.cuda.current_stream(device).cuda_stream)
        with self.cp.cuda.Device(device):
            return int(self.cp.cuda.get_current_stream().ptr)

    def stream_ptr(self, s) -> int:
        return int(s.cuda_stream) if self.name == "torch" else int(s.ptr)

    def new_stream(self, device: int):
        if self.name == "torch":
            return self.t.cuda.Stream(device=device)
        with self.cp.cuda.Device(device):
            return self.cp.cuda.Stream(non_blocking=True)

    def record(self, stream):
        """A new event recorded on `stream` now."""
        if self.name == "torch":
            ev = self.t.cuda.Event()
            ev.record(stream)
            return ev
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev

    def wait(self, stream, event) -> None:
        """`stream`'s later work waits (on the GPU) for `event`; the host does not wait."""
        stream.wait_event(event)

    def device_context(self, device: int):
        """The device made current for CuPy's calls; PyTorch's calls here name their device, so
        for PyTorch nothing is switched (a device switch costs microseconds per lookup)."""
        if self.name == "torch":
            return contextlib.nullcontext()
        return self.cp.cuda.Device(device)


def _same(x):
    return x


def gpu_tier_available() -> tuple[int, str]:
    """(number of visible GPUs, "") when the GPU tier can run here, else (0, the reason).

    It runs where ``_embedlab_core`` was built with CUDA (``CudaEmbeddingCache``), a GPU is
    visible, and PyTorch or CuPy can put arrays on it.
    """
    try:
        from .._native import core
        c = core()
    except Exception as e:  # the reason is reported, never swallowed silently
        return 0, f"the native module does not load ({e})"
    if not getattr(c, "cuda_built", False) or not hasattr(c, "CudaEmbeddingCache"):
        return 0, "EmbedLab was built without CUDA (no CudaEmbeddingCache)"
    n = int(c.cuda_device_count()) if hasattr(c, "cuda_device_count") else 0
    if n == 0:
        return 0, "no CUDA device is visible"
    try:
        DeviceArrays()
    except RuntimeError as e:
        return 0, str(e)
    return n, ""


class _RWLock:
    """Many holders of ``read`` or one of ``write``; a waiting writer holds back new readers."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting = 0

    def acquire_read(self) -> None:
        with self._cond:
            while self._writer or self._waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        with self._cond:
            self._readers -= 1
            if not self._readers:
                self._cond.notify_all()

    @contextlib.contextmanager
    def read(self):
        self.acquire_read()
        try:
            yield
        finally:
            self.release_read()

    @contextlib.contextmanager
    def write(self):
        with self._cond:
            self._waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class GpuCacheTier:
    """The embedding caches of one GPU: a ``CudaEmbeddingCache`` per table (HugeCTR's layout:
    every deployed device has its own caches over the shared CPU tiers).

    Ordering (the kernels' contract, ``embedding_cache.h``: a lookup kernel must not run while a
    write kernel of the same cache runs). Lookups run on the caller's current stream and
    synchronize it before they return (the miss count decides what comes next), so a lookup's
    kernels are finished when it returns; lookups of several threads may overlap each other.
    Writes (insert, update, erase, clear) are enqueued on this device's write stream while no
    lookup is in flight (``_RWLock``), each records an event, and every later lookup's stream
    waits for the last one on the GPU: the host never waits for an insert it did not ask to wait
    for, and no lookup kernel overlaps a write kernel.

    Args:
        device: the CUDA device ordinal.
        static: HugeCTR's static cache (filled at start-up, never updated).
        arrays: the :class:`DeviceArrays` backend.
        ways: set associativity.

    Example:
        >>> t = GpuCacheTier(0, static=False, arrays=DeviceArrays())   # doctest: +SKIP
        >>> t.add_table("hps_et.demo.t0", dim=16, capacity=1024)       # doctest: +SKIP
    """
    name = "cache"

    def __init__(self, device: int, static: bool, arrays: DeviceArrays, ways: int = 8):
        from .._native import core
        self._core = core()
        self.device = int(device)
        self.static = bool(static)
        self.xp = arrays
        self._ways = ways
        self._tables: dict[str, object] = {}
        self._lock = _RWLock()
        self._write_stream = arrays.new_stream(self.device)
        self._write_ptr = arrays.stream_ptr(self._write_stream)
        self._last_write = None         # event of the last write enqueued (a new event each time)
        self._scratch = threading.local()

    def add_table(self, table: str, dim: int, capacity: int) -> None:
        capacity = max(int(capacity), self._ways)
        self._tables[table] = self._core.CudaEmbeddingCache(capacity, dim, ways=self._ways, static=self.static,
                                                            device=self.device)

    def capacity(self, table: str) -> int:
        return int(self._tables[table].capacity)

    def _missing_buffer(self, n: int):
        """A per-thread int64 device buffer of at least n entries (the miss positions' room)."""
        buf = getattr(self._scratch, "missing", None)
        if buf is None or buf.shape[0] < n:
            buf = self.xp.empty((max(n, 1024),), np.int64, self.device)
            self._scratch.missing = buf
        return buf

    def lookup(self, table: str, keys, out):
        """Copies the cached rows of device `keys` into device `out`; returns the miss positions
        (int64, ascending, a device view valid until this thread's next lookup on this device).
        Runs on the current stream of this device and synchronizes it."""
        cache = self._tables[table]
        missing = self._missing_buffer(keys.shape[0])
        ptr = self.xp.current_stream_ptr(self.device)
        sc = self._scratch
        with self._lock.read():
            ev = self._last_write
            # A stream that already waits for this write need not wait again (stream order).
            if ev is not None and getattr(sc, "waited", None) != (ptr, id(ev)):
                self.xp.current_stream(self.device).wait_event(ev)
                sc.waited = (ptr, id(ev))
                sc.event = ev       # keeps it alive, so its id is not reused while remembered
            return cache.lookup(keys, out, stream=ptr, missing=missing)

    def lookup_many(self, tables: list, keys, sizes: list, out, out_offsets: list):
        """The lookups of several tables as one request, with one host synchronization for all
        (the miss counts come back together): table i's keys are ``keys[k_i : k_i + sizes[i]]``
        (``k_i`` the sum of the sizes before it) and its cached rows go to
        ``out[out_offsets[i]:]`` as ``[sizes[i], dim]`` (``keys``, ``out``: 1-D device arrays).
        Returns ``(missing, counts)``: table i's miss positions are
        ``missing[k_i : k_i + counts[i]]`` (a device array valid until this thread's next lookup
        on this device). Runs on the current stream of this device, as :meth:`lookup`."""
        return self.lookup_caches(self.raw_caches(tables), keys, sizes, out, out_offsets)

    def raw_caches(self, tables: list) -> list:
        """The ``CudaEmbeddingCache`` objects of the named tables (what :meth:`lookup_caches`
        takes; a request path looks them up once per model)."""
        return [self._tables[t] for t in tables]

    def lookup_caches(self, caches: list, keys, sizes: list, out, out_offsets: list):
        """:meth:`lookup_many` with the tables given as :meth:`raw_caches` (a list)."""
        sc = self._scratch
        missing = getattr(sc, "missing", None)
        n = keys.shape[0]
        if missing is None or missing.shape[0] < n:
            missing = self._missing_buffer(int(n))
        ptr = self.xp.current_stream_ptr(self.device)
        look = getattr(sc, "many", None)
        if look is None:
            look = sc.many = self._core.CudaCacheLookup(self.device)
        lock = self._lock
        lock.acquire_read()
        try:
            ev = self._last_write
            if ev is not None and getattr(sc, "waited", None) != (ptr, id(ev)):
                self.xp.current_stream(self.device).wait_event(ev)
                sc.waited = (ptr, id(ev))
                sc.event = ev
            cv = self.xp.to_binding
            return missing, look.lookup(caches, cv(keys), sizes, cv(out), out_offsets, cv(missing), ptr)
        finally:
            lock.release_read()

    def insert_many_async(self, items: list, ready, check=None):
        """Enqueues the insertion of several tables' device rows ``[(table, keys, rows), ...]``
        (after event `ready`, where they were produced) on the write stream, under one hold of the
        write order; returns its one event, or None when ``check()`` (called with the order fixed,
        no lookup in flight) says the rows must not go in. The caller keeps keys and rows alive
        until the event has completed."""
        with self._lock.write():
            if check is not None and not check():
                return None
            ws = self._write_stream
            if ready is not None:
                ws.wait_event(ready)
            for table, keys, rows in items:
                self._tables[table].insert(keys, rows, stream=self._write_ptr, sync=False)
            ev = self.xp.record(ws)
            self._last_write = ev
            return ev

    def _write_host(self, table: str, op: str, keys: np.ndarray, values: np.ndarray | None) -> int:
        """insert / update / erase of host rows, on the write stream, waited for; returns the count."""
        with self._lock.write():
            ws = self._write_stream
            k = self.xp.put(np.ascontiguousarray(keys, dtype=np.int64), self.device, stream=ws)
            args = (k,) if values is None else (k, self.xp.put(np.ascontiguousarray(values, np.float32),
                                                                self.device, stream=ws))
            n = getattr(self._tables[table], op)(*args, stream=self._write_ptr)
            self._last_write = self.xp.record(ws)
            return int(n)

    def find(self, table, keys, out):
        """The host interface of the other tiers (tests, tools): host keys -> host rows."""
        xp = self.xp
        with xp.device_context(self.device):
            dk = xp.put(np.ascontiguousarray(keys, np.int64), self.device)
            dout = xp.empty((keys.shape[0], out.shape[1]), np.float32, self.device)
            miss = xp.get(self.lookup(table, dk, dout)).astype(np.int64)
            rows = xp.get(dout)
        hit = np.ones(keys.shape[0], bool)
        hit[miss] = False
        out[hit] = rows[hit]
        return miss

    def insert(self, table, keys, values):
        return self._write_host(table, "insert", keys, values)

    def update(self, table, keys, values) -> int:
        """Overwrites rows already cached (others are not inserted); returns how many."""
        return self._write_host(table, "update", keys, values)

    def erase(self, table, keys):
        return self._write_host(table, "erase", keys, None)

    def size(self, table) -> int:
        with self._lock.write():
            return int(self._tables[table].size(stream=self._write_ptr))

    def clear(self, table=None):
        with self._lock.write():
            for t, c in self._tables.items():
                if table is None or t == table:
                    c.clear(stream=self._write_ptr)
            self._last_write = self.xp.record(self._write_stream)

    def stats(self, table):
        with self._lock.write():
            return self._tables[table].stats(stream=self._write_ptr)

    def close(self):
        with self._lock.write():
            if self._last_write is not None:
                self._last_write.synchronize()
            self._tables.clear()


class HashMapTier:
    """The in-process volatile database (``hash_map`` / ``parallel_hash_map``): HashMapStore.

    ``num_partitions`` partitions per table, each with at most ``overflow_margin`` rows
    (0 = unlimited); on overflow, ``overflow_policy`` evicts down to
    ``overflow_resolution_target`` x ``overflow_margin``.
    """
    name = "volatile"

    def __init__(self, cfg, parallel: bool = True):
        from .._native import core
        self._core = core()
        self._cfg = cfg
        self._parallel = parallel
        self._tables: dict[str, object] = {}
        self.kind = "parallel_hash_map" if parallel else "hash_map"

    def add_table(self, table: str, dim: int, rows_hint: int = 0) -> None:
        c = self._cfg
        self._tables[table] = self._core.HashMapStore(
            dim, num_partitions=c.num_partitions, overflow_margin=c.overflow_margin,
            overflow_policy=c.overflow_policy, overflow_resolution_target=c.overflow_resolution_target,
            parallel=self._parallel)

    def find(self, table, keys, out):
        return np.asarray(self._tables[table].find(keys, out), dtype=np.int64)

    def insert(self, table, keys, values):
        self._tables[table].insert(keys, values)

    def erase(self, table, keys):
        return int(self._tables[table].erase(keys))

    def size(self, table) -> int:
        return int(self._tables[table].size())

    def close(self):
        self._tables.clear()


# ---- Redis -----------------------------------------------------------------------------------

def redis_unavailable_errors() -> tuple:
    """The exception types of redis-py (8.x) that mean the Redis tier cannot serve now.

    * ``ConnectionError``: refused, reset or closed connections, and its subclasses
      ``AuthenticationError`` / ``AuthorizationError`` (a node restarted with another password or
      ACL), ``BusyLoadingError`` (a node loading its data), ``MaxConnectionsError``;
    * ``TimeoutError``: no reply within ``socket_timeout`` (a hung node), or no connection within
      ``socket_connect_timeout``;
    * ``ClusterError``, with ``ClusterDownError`` / ``MasterDownError`` (CLUSTERDOWN and
      MASTERDOWN replies; the client's redirection budget spent), ``TryAgainError`` (a slot in
      migration), ``AskError`` / ``MovedError`` (slots changing owner, still after the slot map
      was re-read), ``ReadOnlyError`` (a write reaching a replica during a fail-over),
      ``NoPermissionError`` (the user's ACL no longer allows the command);
    * ``SlotNotCoveredError`` (a ``RedisClusterException``, which derives from ``Exception``,
      not ``RedisError``);
    * ``OSError``: socket errors that reach the caller unwrapped.

    ``RedisClusterException`` itself (its exact class) means unavailable too, but it cannot be
    listed here, since its other subclasses are misuse (see ``RedisTier._run``).
    """
    import redis.exceptions as E
    return (E.ConnectionError, E.TimeoutError, E.ClusterError, E.TryAgainError, E.AskError, E.ReadOnlyError,
            E.NoPermissionError, E.SlotNotCoveredError, OSError)


class RedisTier:
    """``redis_cluster``: rows in a real Redis (one node or a cluster), through the official client.

    Layout: table ``t`` is spread over ``num_partitions`` Redis hashes ``<t>/p<i>``; key ``k``
    lives in partition ``k mod num_partitions`` under the 8-byte little-endian field ``k``,
    and its value is the row's ``dim`` float32 (4 x dim bytes). Lookups send one pipelined
    ``HMGET`` per partition for every ``max_batch_size`` keys, so a batch costs a few round trips,
    not one per key. A value of the wrong length is treated as a miss and counted in
    ``bad_values`` (logged once per table); it is never returned as a vector.

    In a cluster, a call's commands are grouped by the node that owns their hash's slot (the
    client's slot map): each node's commands are written on one of its connections, then the
    replies are read node by node. (redis-py's ``ClusterPipeline`` does the same, but re-sends
    each command that failed one by one, so a node that accepts connections but never answers
    cost one ``socket_timeout`` per command queued for it: 8 s for one lookup at 2 s and 3
    commands.) A MOVED or ASK reply (slots moving) re-reads the slot map and sends the call
    once more.

    Every error of redis-py that means "Redis cannot serve this now" raises
    :class:`TierUnavailable` (see :func:`redis_unavailable_errors`): refused or reset
    connections, a reply not received within ``socket_timeout`` (a hung node), a failed
    authentication after a restart, a cluster that is down, has a slot without a node, or whose
    nodes cannot be reached at all. The clients do not retry (``Retry(NoBackoff(), 0)``): the
    :class:`~embedlab.hps.ParameterServer` skips the tier and tries it again later, so a lookup waits for a
    hung Redis about one ``socket_timeout`` (1 s by default; a healthy node answers a pipeline of
    ``max_batch_size`` keys in milliseconds). After a failure the next call first re-reads the
    cluster's slot map, asking the node that failed last.

    Replies are parsed by ``hiredis`` (pinned next to ``redis``; the client uses it when installed):
    with redis-py's pure-Python parser a 2,048-key lookup takes about twice as long. Rows are
    copied out with one ``b"".join`` per reply, not one NumPy call per key.
    """
    name = "volatile"
    kind = "redis_cluster"

    def __init__(self, cfg, socket_timeout: float = 1.0):
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self._redis = redis
        self._cfg = cfg
        self._dims: dict[str, int] = {}
        self.bad_values = 0
        self._bad_logged: set[str] = set()
        self._count_lock = threading.Lock()     # lookups call find from several threads
        addrs = cfg.addresses
        self._unavailable = redis_unavailable_errors()
        self.socket_timeout = float(socket_timeout)
        common = dict(password=cfg.password or None,
                      username=(cfg.user_name if cfg.user_name and cfg.user_name != "default" else None),
                      socket_timeout=socket_timeout, socket_connect_timeout=min(socket_timeout, 1.0),
                      retry=Retry(NoBackoff(), 0))
        try:
            probe = redis.Redis(host=addrs[0][0], port=addrs[0][1], **common)
            cluster = len(addrs) > 1 or probe.info("cluster").get("cluster_enabled", 0) == 1
            if cluster:
                probe.close()
                from redis.cluster import ClusterNode, RedisCluster
                # No retries: the cluster client's own default retries a failed command 10 times
                # with back-off, each try waiting up to socket_timeout.
                self._client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in addrs], **common)
            else:
                self._client = probe
            self.cluster = cluster
            self._refresh_after: str | None = None     # the node that failed last, when one did
        except redis.AuthenticationError as e:
            raise TierError(f"HPS volatile_db redis_cluster at {cfg.address}: authentication failed "
                            f"(volatile_db.user_name / password): {e}") from e
        except (redis.RedisError, redis.exceptions.RedisClusterException, *self._unavailable) as e:
            raise TierError(f"HPS volatile_db redis_cluster: cannot reach Redis at {cfg.address} "
                            f"(volatile_db.address): {type(e).__name__}: {e}") from e

    def _hkey(self, table: str, p: int) -> str:
        return f"{table}/p{p}"

    def add_table(self, table: str, dim: int, rows_hint: int = 0) -> None:
        self._dims[table] = dim

    def _partitions(self, keys):
        n = self._cfg.num_partitions
        part = np.mod(keys, n)
        order = np.argsort(part, kind="stable")
        bounds = np.searchsorted(part[order], np.arange(n + 1))
        return order, bounds

    def _pipeline(self):
        return _NodePipelines(self) if self.cluster else self._client.pipeline(transaction=False)

    def _execute_cluster(self, cmds: list) -> list:
        """Runs raw commands (name, key, args...) on the nodes owning their keys; replies in order."""
        c = self._client
        try:
            if self._refresh_after is not None:      # the last call failed: re-read the slot map
                c.nodes_manager.initialize(last_failed_node_name=self._refresh_after or None)
                self._refresh_after = None
            try:
                return self._send_by_node(cmds)
            except self._redis.exceptions.AskError:  # MOVED too: slots changed owner
                c.nodes_manager.initialize()
                return self._send_by_node(cmds)
        except BaseException:
            if self._refresh_after is None:
                self._refresh_after = ""
            raise

    def _send_by_node(self, cmds: list) -> list:
        """Writes every node's commands on one connection each, then reads the replies node by
        node (the nodes work at the same time); the first error raises."""
        c = self._client
        groups: dict[str, tuple] = {}
        for i, args in enumerate(cmds):
            node = c.get_node_from_key(args[1])
            groups.setdefault(node.name, (node, []))[1].append(i)
        out = [None] * len(cmds)
        sent = []           # [redis client of the node, connection, replies still unread]
        node = None
        try:
            for node, idx in groups.values():
                r = c.get_redis_connection(node)
                conn = r.connection_pool.get_connection()
                sent.append([r, conn, True])
                conn.send_packed_command(conn.pack_commands([cmds[i] for i in idx]))
            for (node, idx), entry in zip(groups.values(), sent):
                r, conn, _ = entry
                for i in idx:
                    out[i] = r.parse_response(conn, cmds[i][0])
                entry[2] = False
        except self._unavailable:
            self._refresh_after = node.name if node is not None else ""
            raise
        finally:
            for r, conn, unread in sent:
                if unread:          # a reply left on the socket would answer the next command
                    conn.disconnect()
                r.connection_pool.release(conn)
        return out

    def _unavailable_error(self, e) -> TierUnavailable:
        kind = type(e).__name__
        if e.__cause__ is not None:           # e.g. RedisClusterException from an AuthenticationError
            kind += f" ({type(e.__cause__).__name__})"
        return TierUnavailable(f"Redis at {self._cfg.address}: {kind}: {e}")

    def _run(self, fn):
        try:
            return fn()
        except self._redis.exceptions.OutOfMemoryError as e:
            raise TierFull(f"Redis at {self._cfg.address}: OutOfMemoryError (OOM, maxmemory reached): {e}") from e
        except self._unavailable as e:
            raise self._unavailable_error(e) from e
        except self._redis.exceptions.RedisClusterException as e:
            # The class itself is raised by the cluster client's topology refresh: "Redis Cluster
            # cannot be connected" when no node answers, slot maps that disagree or leave slots
            # uncovered, a node gone from the cluster; otherwise only by calls this tier never
            # makes (commands blocked or not implemented in cluster mode). Its subclasses
            # CrossSlotTransactionError and InvalidPipelineStack are misuse and propagate.
            if type(e) is not self._redis.exceptions.RedisClusterException:
                raise
            raise self._unavailable_error(e) from e

    def find(self, table, keys, out):
        dim = self._dims[table]
        want = 4 * dim
        n = keys.shape[0]
        found = np.zeros(n, dtype=bool)
        if n == 0:
            return np.zeros(0, np.int64)
        order, bounds = self._partitions(keys)
        kb = keys.astype("<i8").tobytes()
        batch = self._cfg.max_batch_size
        # (partition, positions) chunks, grouped into pipelines of about max_batch_size keys.
        chunks = []
        for p in range(self._cfg.num_partitions):
            lo, hi = bounds[p], bounds[p + 1]
            for s in range(lo, hi, batch):
                chunks.append((p, order[s:min(hi, s + batch)]))
        bad = 0
        i = 0
        while i < len(chunks):
            group, count = [], 0
            while i < len(chunks) and (not group or count + len(chunks[i][1]) <= batch):
                group.append(chunks[i]); count += len(chunks[i][1]); i += 1

            def go(group=group):
                pipe = self._pipeline()
                for p, pos in group:
                    pipe.hmget(self._hkey(table, p), [kb[8 * j:8 * j + 8] for j in pos])
                return pipe.execute()
            replies = self._run(go)
            for (p, pos), vals in zip(group, replies):
                bad += _scatter_values(vals, pos, dim, out, found)
        if bad:
            with self._count_lock:
                self.bad_values += bad
                first = table not in self._bad_logged
                self._bad_logged.add(table)
            if first:
                log.warning("HPS redis tier: table %s holds %d value(s) of the wrong length (expected %d bytes "
                            "= %d float32); they are treated as misses", table, bad, want, dim)
        return np.flatnonzero(~found).astype(np.int64)

    def insert(self, table, keys, values):
        dim = self._dims[table]
        values = _check_rows(keys, values, dim, f"redis insert into {table}")
        if keys.shape[0] == 0:
            return
        order, bounds = self._partitions(keys)
        kb = keys.astype("<i8").tobytes()
        vb = values.astype("<f4").tobytes()
        rb = 4 * dim
        batch = self._cfg.max_batch_size

        def go():
            pipe, count = self._pipeline(), 0
            for p in range(self._cfg.num_partitions):
                lo, hi = bounds[p], bounds[p + 1]
                for s in range(lo, hi, batch):
                    pos = order[s:min(hi, s + batch)]
                    pipe.hset(self._hkey(table, p),
                              mapping={kb[8 * j:8 * j + 8]: vb[rb * j:rb * j + rb] for j in pos})
                    count += len(pos)
                    if count >= batch:
                        pipe.execute(); pipe, count = self._pipeline(), 0
            pipe.execute()
        self._run(go)

    def erase(self, table, keys):
        order, bounds = self._partitions(keys)
        kb = keys.astype("<i8").tobytes()

        def go():
            pipe = self._pipeline()
            for p in range(self._cfg.num_partitions):
                pos = order[bounds[p]:bounds[p + 1]]
                if len(pos):
                    pipe.hdel(self._hkey(table, p), *[kb[8 * j:8 * j + 8] for j in pos])
            return sum(int(x) for x in pipe.execute())
        return self._run(go)

    def size(self, table) -> int:
        def go():
            pipe = self._pipeline()
            for p in range(self._cfg.num_partitions):
                pipe.hlen(self._hkey(table, p))
            return sum(int(x) for x in pipe.execute())
        return self._run(go)

    def drop(self, table) -> None:
        def go():
            pipe = self._pipeline()
            for p in range(self._cfg.num_partitions):
                pipe.delete(self._hkey(table, p))
            pipe.execute()
        self._run(go)

    def raw_client(self):
        """The underlying ``redis`` client (tests use it to plant corrupt values)."""
        return self._client

    def close(self):
        try:
            self._client.close()
        except Exception:  # closing a client whose server is gone
            pass


class _NodePipelines:
    """The pipeline interface RedisTier uses (hmget, hset, hdel, hlen, delete, execute) over a
    cluster: the commands are recorded and RedisTier._execute_cluster sends them."""

    def __init__(self, tier: RedisTier):
        self._tier = tier
        self._cmds: list = []

    def hmget(self, key, fields):
        self._cmds.append(("HMGET", key, *fields))

    def hset(self, key, mapping):
        self._cmds.append(("HSET", key, *[x for kv in mapping.items() for x in kv]))

    def hdel(self, key, *fields):
        self._cmds.append(("HDEL", key, *fields))

    def hlen(self, key):
        self._cmds.append(("HLEN", key))

    def delete(self, key):
        self._cmds.append(("DEL", key))

    def execute(self) -> list:
        return self._tier._execute_cluster(self._cmds) if self._cmds else []


# ---- RocksDB ---------------------------------------------------------------------------------

class RocksDBTier:
    """``rocks_db``: the persistent database, a real RocksDB through ``rocksdict``.

    Why rocksdict: it is maintained (regular releases), ships manylinux wheels with RocksDB
    compiled in (nothing to build, no system librocksdb), and exposes column families, write
    batches and multi-get in raw (bytes) mode, which is all this tier needs. (python-rocksdb and
    its forks need a matching system librocksdb and have gone years without a release.)

    Layout: one column family per table (named like the table); key = the 8-byte big-endian
    int64 (so RocksDB's order is the keys' order for non-negative keys), value = ``dim`` float32.
    Lookups are multi-gets of ``max_batch_size`` keys. ``read_only`` opens the database read-only
    (it must exist and already hold the tables); inserts are then refused.

    Tuned for point lookups: a 10-bit-per-key Bloom filter per table file, so a get skips the
    files that do not hold its key; no block compression (float rows do not compress, and every
    read would pay for the attempt); table files read through mmap (uncompressed blocks are used
    in place, not copied into the block cache); one block cache of ``BLOCK_CACHE_BYTES`` for
    the index and filter blocks. A bulk insert (the load from the sparse files, a refresh) ends
    with a flush and a compaction of its table, so lookups search one sorted run instead of the
    memtables and every level-0 file.

    A lookup sorts its keys (neighbouring keys share index and data blocks) and splits them into
    chunks that ``min(persistent_db.num_threads, cores)`` threads fetch at once: rocksdict
    releases the GIL for RocksDB's batched MultiGet, so one thread's multi-get runs while another
    copies its values into the output. Numbers: the documentation's benchmarks page, hps_db.
    """
    BLOCK_CACHE_BYTES = 256 << 20
    MIN_CHUNK = 4096          # keys per multi-get below which splitting a lookup costs more than it saves
    name = "persistent"
    kind = "rocks_db"

    def __init__(self, cfg):
        import rocksdict as rd
        self._rd = rd
        self._cfg = cfg
        self.path = str(Path(cfg.path))
        self.read_only = cfg.read_only
        self._dims: dict[str, int] = {}
        self._cfs: dict[str, object] = {}
        self._lock = threading.Lock()
        self.bad_values = 0
        p = Path(self.path)
        if self.read_only:
            if not (p / "CURRENT").is_file():
                raise TierError(f"HPS persistent_db.path {self.path}: no RocksDB database there "
                                f"(persistent_db.read_only is true, so it must exist)")
            if not os.access(p, os.R_OK | os.X_OK):
                raise TierError(f"HPS persistent_db.path {self.path}: not readable")
        else:
            if p.exists() and not p.is_dir():
                raise TierError(f"HPS persistent_db.path {self.path}: exists and is not a folder")
            parent = p if p.exists() else p.parent
            if not parent.exists() or not os.access(parent, os.W_OK | os.X_OK):
                raise TierError(f"HPS persistent_db.path {self.path}: cannot create or write the RocksDB "
                                f"folder there (check the path and its permissions)")
        self._block_cache = rd.Cache(self.BLOCK_CACHE_BYTES)
        opts = self._options()
        opts.create_if_missing(True)
        opts.set_allow_mmap_reads(True)
        try:
            existing = rd.Rdict.list_cf(self.path, rd.Options(raw_mode=True)) if (p / "CURRENT").is_file() else []
            cfs = {name: self._options() for name in existing if name != "default"}
            access = rd.AccessType.read_only() if self.read_only else rd.AccessType.read_write()
            self._db = rd.Rdict(self.path, opts, column_families=cfs or None, access_type=access)
        except Exception as e:
            raise TierError(f"HPS persistent_db.path {self.path}: cannot open the RocksDB database: {e}") from e
        self._existing = set(existing)
        self.threads = max(1, min(cfg.num_threads, os.cpu_count() or 1))
        self._pool = None

    def _options(self):
        rd = self._rd
        table = rd.BlockBasedOptions()
        table.set_bloom_filter(10, False)
        table.set_block_cache(self._block_cache)
        opts = rd.Options(raw_mode=True)
        opts.set_block_based_table_factory(table)
        opts.set_compression_type(rd.DBCompressionType.none())
        return opts

    def add_table(self, table: str, dim: int, rows_hint: int = 0) -> None:
        self._dims[table] = dim
        with self._lock:
            if table in self._existing:
                self._cfs[table] = self._db.get_column_family(table)
            elif self.read_only:
                raise TierError(f"HPS persistent_db.path {self.path}: read-only database has no column family "
                                f"{table!r} (tables there: {sorted(self._existing - {'default'})})")
            else:
                self._cfs[table] = self._db.create_column_family(table, self._options())
                self._existing.add(table)

    def has_rows(self, table) -> bool:
        it = self._cfs[table].keys()
        for _ in it:
            return True
        return False

    @staticmethod
    def _key_list(keys) -> list:
        return keys.astype(">i8").view("V8").tolist()     # one 8-byte bytes object per key

    def _chunks(self, n: int) -> list[tuple[int, int]]:
        """Multi-get ranges: at most ``max_batch_size`` keys each, four per thread (so one
        thread's Python-side copy overlaps another's multi-get), none under MIN_CHUNK."""
        size = min(self._cfg.max_batch_size, max(self.MIN_CHUNK, -(-n // (4 * self.threads))))
        return [(s, min(n, s + size)) for s in range(0, n, size)]

    def find(self, table, keys, out):
        dim = self._dims[table]
        cf = self._cfs[table]
        n = keys.shape[0]
        found = np.zeros(n, dtype=bool)
        order = np.argsort(keys.view(np.uint64), kind="stable")   # byte order of the key = unsigned order
        kl = self._key_list(keys[order])

        def fetch(r):           # chunks write disjoint rows of out and found
            return _scatter_values(cf.get(kl[r[0]:r[1]]), order[r[0]:r[1]], dim, out, found)

        chunks = self._chunks(n)
        if len(chunks) > 1 and self.threads > 1:
            if self._pool is None:
                with self._lock:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="embedlab-rocksdb")
            bad = sum(self._pool.map(fetch, chunks))
        else:
            bad = sum(map(fetch, chunks))
        if bad:
            with self._lock:
                self.bad_values += bad
            log.warning("HPS rocks_db tier: %d value(s) of the wrong length in %s; treated as misses", bad, table)
        return np.flatnonzero(~found).astype(np.int64)

    def insert(self, table, keys, values, bulk: bool = False):
        """Writes rows (replacing those of the same keys). ``bulk=True`` (a whole table's load)
        then flushes and compacts the table, as the class docstring says."""
        if self.read_only:
            raise TierError(f"HPS persistent_db {self.path} is read_only; rows cannot be written")
        dim = self._dims[table]
        values = _check_rows(keys, values, dim, f"rocks_db insert into {table}")
        kl = self._key_list(keys)
        vb = values.astype("<f4").tobytes()
        rb = 4 * dim
        handle = self._db.get_column_family_handle(table)
        batch = self._cfg.max_batch_size
        for s in range(0, len(kl), batch):
            wb = self._rd.WriteBatch(raw_mode=True)
            wb.set_default_column_family(handle)
            for j in range(s, min(len(kl), s + batch)):
                wb.put(kl[j], vb[rb * j:rb * j + rb])
            self._db.write(wb)
        if bulk and len(kl):
            cf = self._cfs[table]
            cf.flush()
            cf.compact_range(None, None)

    def erase(self, table, keys):
        if self.read_only:
            raise TierError(f"HPS persistent_db {self.path} is read_only; rows cannot be erased")
        cf = self._cfs[table]
        for k in self._key_list(keys):
            cf.delete(k)
        return len(keys)

    def size(self, table) -> int:
        try:
            return int(self._cfs[table].property_int_value("rocksdb.estimate-num-keys") or 0)
        except Exception:
            return -1

    def close(self):
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        with self._lock:
            self._cfs.clear()
            try:
                self._db.close()
            except Exception:
                pass
