"""The Hierarchical Parameter Server: embedding cache -> volatile DB -> persistent DB -> default.

No TensorFlow here: the Triton python backend runs this module in a process without it.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from ..sparse_model import KEY_FILE, VECTOR_FILE, read_sparse_model
from .config import HPSConfig, load_config
from .gpu_path import GpuPath, device_index
from .tiers import (CacheTier, DeviceArrays, GpuCacheTier, HashMapTier, RedisTier, RocksDBTier, TierError, TierFull,
                    TierUnavailable, gpu_tier_available)

log = logging.getLogger("embedlab.hps")

__all__ = ["ParameterServer", "HPSLookupError", "HPSUnavailableError"]

# Servers whose background cache inserter runs. At interpreter exit the inserters are stopped and
# joined before Python finalizes: a daemon thread still inside the compiled cache's insert (GIL
# released) when the interpreter ends is unwound through C++ frames, and the process aborts
# ("terminate called without an active exception", status 134) after the script's work is done.
_with_inserter: "weakref.WeakSet[ParameterServer]" = weakref.WeakSet()


@atexit.register
def _stop_inserters_at_exit() -> None:
    for ps in list(_with_inserter):
        ps._stop_inserter()


class HPSLookupError(ValueError):
    """Bad lookup arguments: unknown model / table id, keys of the wrong dtype or shape, a device
    the model is not deployed on."""


class HPSUnavailableError(RuntimeError):
    """Rows the model holds that no reachable tier has: a lookup of keys the model holds (or may
    hold) while every tier that keeps them is down or has lost them, or an update that no tier
    accepted. Never answered with the default value; the message names the table, the keys and
    the tiers' causes."""


def _device_index(device) -> int:
    """A CUDA device ordinal from an int, "cuda:N" / "gpu:N" / "N", a torch.device or a CuPy Device."""
    return device_index(device, HPSLookupError)


@dataclass
class _TierStats:
    hits: int = 0
    misses: int = 0
    errors: int = 0
    calls: int = 0
    seconds: float = 0.0
    inserted: int = 0
    writes_refused: int = 0
    down_since: float | None = None
    outage_start: float = 0.0
    outages: int = 0
    last_error: str | None = None
    retry_after: float = 0.0
    reseeds: int = 0
    reseeded_rows: int = 0
    reseeding: bool = False

    def as_dict(self):
        down = self.down_since is not None
        return {"hits": self.hits, "misses": self.misses, "errors": self.errors, "calls": self.calls,
                "latency_ms_mean": 1e3 * self.seconds / self.calls if self.calls else 0.0,
                "seconds": self.seconds, "inserted": self.inserted, "writes_refused": self.writes_refused,
                "outages": self.outages, "reseeds": self.reseeds, "reseeded_rows": self.reseeded_rows,
                "reseeding": self.reseeding,
                "available": not down, "last_error": self.last_error,
                "down_seconds": time.monotonic() - self.outage_start if down else 0.0}


def _files_signature(path: str) -> tuple:
    """(size, mtime_ns, inode) of a sparse model's ``key`` and ``emb_vector`` files: tells whether
    the files still hold what was loaded from them."""
    out = []
    for f in (KEY_FILE, VECTOR_FILE):
        st = os.stat(os.path.join(path, f))
        out.append((st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


class _KeySet:
    """A set of int64 keys: a sorted array plus the keys added since it was last merged (8 bytes
    per key). Membership of a batch costs one binary search per key. Guarded by the server's lock."""

    def __init__(self, keys=None):
        self._base = np.unique(np.asarray(keys, np.int64)) if keys is not None else np.zeros(0, np.int64)
        self._added: list[np.ndarray] = []

    def add(self, keys: np.ndarray) -> None:
        self._added.append(np.array(keys, np.int64, copy=True))

    def array(self) -> np.ndarray:
        if self._added:
            self._base = np.unique(np.concatenate([self._base, *self._added]))
            self._added = []
        return self._base

    def contains(self, keys: np.ndarray) -> np.ndarray:
        a = self.array()
        if not a.size:
            return np.zeros(keys.shape[0], bool)
        i = np.minimum(np.searchsorted(a, keys), a.size - 1)
        return a[i] == keys


@dataclass
class _Table:
    model: str
    index: int
    name: str          # hps_et.<model>.<table name>, the key in every tier
    dim: int
    default: float
    rows: int
    cache_capacity: int = 0
    cache_tier: str = "none"     # "gpu", "cpu" or "none"
    devices: tuple = ()          # the deployed devices whose caches hold this table (GPU tier)
    gpu: dict | None = None      # device -> GpuCacheTier (GPU tier), looked up once here for the hot path
    dynamic: bool = False
    threshold: float = 0.0
    sync_inserts: int = 0
    async_inserts: int = 0
    defaults_returned: int = 0
    lookups: int = 0
    keys: int = 0
    path: str = ""
    files_sig: tuple | None = None   # _files_signature of the files last loaded
    # The tiers that hold every row of the table and keep them (a RocksDB, an in-process hash map
    # without overflow that took every row): when one of them answers a lookup, a key it misses
    # is one the model does not hold.
    complete: tuple = ()
    # The model's keys, kept only when no tier of `complete` exists (the full table is only in a
    # tier that can lose rows: Redis, a hash map with overflow_margin): a key missing from every
    # tier is then a default only if it is not in this set.
    held: _KeySet | None = None
    updated: _KeySet = None          # keys written by update() since the files were last loaded
    unavailable: int = 0             # keys of lookups refused with HPSUnavailableError


class _GuardedTier:
    """One tier on the lookup path with its counters and its outage state.

    ``call`` runs a function on the tier without holding the server's lock (a Redis call may
    wait a socket timeout); the state (counters, down or up, rows to forget) changes under that
    lock, briefly. While the tier is down, calls within ``retry_after`` of the last failure skip
    it; after that one caller at a time tries it (the others go on skipping it), and only that
    caller marks it back. Rows updated while it was down (``forget``) are erased from it before
    it is marked back, those remembered during the try included, so it never serves their old
    values once it is up. A read that began before an outage and fails after the tier is back
    counts as an error of that outage, not as a new one.
    """

    def __init__(self, which: str, tier, stats: _TierStats, server: "ParameterServer"):
        self.which, self.tier, self.stats = which, tier, stats
        self._server = server
        self._lock = server._lock
        self._probing = False
        self._dirty: list = []      # (table, keys) to erase from the tier before it serves again
        self._phase = 0             # +1 each time the tier is marked down or back

    @property
    def kind(self) -> str:
        return getattr(self.tier, "kind", self.which)

    def call(self, fn, fallback=None, remember=None):
        """fn() on the tier; on TierUnavailable / TierFull (or skipped while down) returns fallback
        and, when given, remembers the rows ``remember`` = (table, keys) to erase later."""
        st = self.stats
        with self._lock:
            phase = self._phase
            probe = st.down_since is not None
            if probe:
                if self._probing or time.monotonic() - st.down_since < st.retry_after:
                    st.errors += 1
                    if remember is not None:
                        self._dirty.append(remember)
                    return fallback
                self._probing = True
        try:
            if probe:
                # Back from an outage: first forget the rows updated meanwhile (it may hold their
                # old values), then serve from it.
                self._erase_dirty(mark_back=False)
            out = fn()
            if probe:
                self._erase_dirty(mark_back=True)
        except TierFull as e:
            # Full, not down: reads go on from it; the rows refused stay in the tiers below.
            with self._lock:
                if not st.writes_refused:
                    log.warning("HPS %s tier (%s) refused a write (full); lookups stay exact from the tiers "
                                "below, and the refusals are counted in stats()['tiers']['%s']['writes_refused']: "
                                "%s", self.which, self.kind, self.which, e)
                st.writes_refused += 1
                st.last_error = str(e)
                if remember is not None:
                    self._dirty.append(remember)
            return fallback
        except TierUnavailable as e:
            with self._lock:
                st.errors += 1
                st.last_error = str(e)
                if st.down_since is None and phase != self._phase and remember is None:
                    # A read that began before an outage which has ended since (a try found the
                    # tier back meanwhile): its failure belongs to that outage. The tier stays in
                    # use; if it fails again, the next call marks it down.
                    return fallback
                if st.down_since is None:
                    self._phase += 1
                    st.outages += 1
                    st.outage_start = time.monotonic()
                    st.retry_after = self._server.retry_seconds
                    log.warning("HPS %s tier (%s) unavailable, lookups go on without it: %s", self.which,
                                self.kind, e)
                else:
                    # Still down: wait twice as long before the next try (a hung Redis costs the
                    # lookup that tries it a socket timeout).
                    st.retry_after = min(2 * st.retry_after, self._server.max_retry_seconds)
                st.down_since = time.monotonic()
                if remember is not None:
                    self._dirty.append(remember)
            return fallback
        finally:
            if probe:
                with self._lock:
                    self._probing = False
        return out

    def _erase_dirty(self, mark_back: bool) -> None:
        """Erases the remembered rows until none is left; with mark_back, marks the tier back in
        the same critical section that finds the list empty (so no row remembered meanwhile is
        served old). Raises what the tier raises (the rows not erased stay remembered)."""
        while True:
            with self._lock:
                if not self._dirty:
                    st = self.stats
                    if mark_back and st.down_since is not None:
                        log.warning("HPS %s tier (%s) is back after %.1f s", self.which, self.kind,
                                    time.monotonic() - st.outage_start)
                        st.down_since = None
                        self._phase += 1
                        self._server._tier_back(self)
                    return
                dirty, self._dirty = self._dirty, []
            done = 0
            try:
                for name, k in dirty:
                    self.tier.erase(name, k)
                    done += 1
            except BaseException:
                with self._lock:
                    self._dirty[:0] = dirty[done:]
                raise

    def forget(self, name: str, keys: np.ndarray) -> None:
        """The tier did not take new rows for keys (down, or full): it must not answer their old
        rows. Erased now when it can be (a full Redis still deletes), else before it serves again."""
        self.call(lambda: self.tier.erase(name, keys), fallback=False, remember=(name, keys.copy()))

    def find(self, name: str, keys: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, bool]:
        """tier.find, timed and counted: (missing positions, answered). When the tier is skipped
        or fails, every position is missing and answered is False (its misses say nothing about
        which keys the model holds)."""
        t0 = time.perf_counter()
        missing = self.call(lambda: self.tier.find(name, keys, out), fallback=None)
        dt = time.perf_counter() - t0
        answered = missing is not None
        if missing is None:
            missing = np.arange(keys.shape[0], dtype=np.int64)
            hits = 0
        else:
            hits = keys.shape[0] - missing.shape[0]
        with self._lock:
            st = self.stats
            st.seconds += dt
            st.calls += 1
            st.hits += hits
            st.misses += missing.shape[0]
        return missing, answered


class _WriteGate:
    """Orders the writes into the tiers below the cache. Writers (update, refresh) hold it
    alone, one at a time; a lookup's upward insertion into the volatile DB holds it shared, and
    never waits for it: when a writer holds or wants it, the insertion is skipped (its rows may
    be older than the writer's; they stay in the tier below)."""

    def __init__(self):
        self._cond = threading.Condition(threading.Lock())
        self._writers = threading.Lock()
        self._shared = 0
        self._writer = False

    @contextlib.contextmanager
    def exclusive(self):
        with self._writers:
            with self._cond:
                self._writer = True
                while self._shared:
                    self._cond.wait()
            try:
                yield
            finally:
                with self._cond:
                    self._writer = False

    @contextlib.contextmanager
    def shared_or_skip(self):
        """Yields True while held shared, False (not held) when a writer holds or wants it."""
        with self._cond:
            if self._writer:
                ok = False
            else:
                self._shared += 1
                ok = True
        try:
            yield ok
        finally:
            if ok:
                with self._cond:
                    self._shared -= 1
                    if not self._shared:
                        self._cond.notify_all()


class ParameterServer:
    """HugeCTR's HPS over EmbedLab's tiers, configured by the HPS JSON.

    Lookup order per table: embedding cache (if ``gpucache``) -> volatile DB (``hash_map`` /
    ``parallel_hash_map`` / ``redis_cluster``) -> persistent DB (``rocks_db``) -> the table's
    ``default_value_for_each_table``. Rows found in a lower tier move up:

    * into the cache: when this batch's cache hit rate is below ``hit_rate_threshold`` they are
      inserted before ``lookup`` returns; above it a background thread inserts them (the call
      returns first), HugeCTR's asynchronous insertion;
    * into the volatile DB, for rows found only in the persistent DB, when
      ``cache_missed_embeddings`` is true.

    Where the cache lives (HugeCTR's layout): where EmbedLab's CUDA kernels are built, a GPU is
    visible and PyTorch or CuPy can use it, each ``gpucache`` model gets one GPU embedding cache
    (``CudaEmbeddingCache``) per table on every device of its ``deployed_device_list``, over the
    shared volatile and persistent DBs; ``lookup(..., device=d)`` takes host or GPU keys and
    returns the rows on device ``d``, and the hits never leave it. Elsewhere the cache is in host
    memory. ``stats()["models"]`` and the config report say which each model got.

    Start-up loads each table's ``key`` / ``emb_vector`` folder: the persistent DB gets every row
    (unless ``read_only``), the volatile DB the first ``initial_cache_rate`` of them, a static
    cache as many as fit. Keys the model does not hold get the default value and are counted.

    A tier that fails at run time (Redis killed, hung, restarted with another password) is logged
    once, counted in ``stats()`` with the cause (``last_error``), and skipped: lookups go on from
    the tiers that remain. It is tried again after ``retry_seconds``, then after twice as long
    each time it is still down (up to ``max_retry_seconds``: a hung Redis costs the lookup that
    tries it a socket timeout; while one lookup tries it, the others go on without it), and
    logged again when it is back; rows updated while it was down are erased from it before it
    serves again (it may still hold their old values). A volatile DB that comes back (Redis
    restarted empty, or down when the server started) is re-seeded in the background with what
    it held after start-up (``initial_cache_rate`` of each table, read again from the sparse
    files), chunk by chunk between updates, skipping keys updated since the files were loaded;
    lookups never wait for it (``stats()["tiers"]["volatile"]``: ``reseeding``, ``reseeds``,
    ``reseeded_rows``; :meth:`wait_reseed`). A Redis at ``maxmemory`` (``noeviction``) that
    refuses writes is full, not down: reads go on from it, the refusals are counted in
    ``writes_refused`` and logged once. A tier that cannot be set up at start-up (an unreadable
    RocksDB path, Redis unreachable) raises :class:`~embedlab.hps.tiers.TierError` naming it.

    The default value is only for keys the model does not hold. Each table needs a tier that
    holds every row: the persistent DB, or the volatile DB with ``initial_cache_rate`` 1 that
    took every row; start-up raises :class:`~embedlab.hps.tiers.TierError` when none does (a
    full or unreachable Redis with no persistent DB). When the persistent DB or an in-process
    hash map (without overflow eviction) holds every row and answers, a key it misses is not
    the model's. When only Redis holds them (no persistent DB), Redis may lose rows (killed,
    restarted empty, full), so the server keeps the model's keys (loaded from the sparse files,
    plus keys added by accepted updates: 8 bytes per key) and tells a key the model does not
    hold (default) from one whose row is gone. A lookup with keys the model holds (or may hold,
    when the tiers that hold every row did not answer) that no reachable tier has raises
    :class:`HPSUnavailableError`; an update that no tier accepted raises it too.

    Threads: ``lookup`` may be called from any number of threads; no lock is held while a tier
    is asked, so a lookup waiting on Redis holds up no other (one that the cache answers returns
    at once). ``update`` and ``refresh`` run one at a time. A lookup returns, for each key, its
    row from before or after an update that runs meanwhile, and after ``update`` returns every
    lookup started later sees the new rows: rows read while an update or refresh ran are not
    moved up (into the cache, now or by the background thread, or into the volatile DB), so no
    tier gets back a row older than the last update.

    Args:
        ps_config: the HPS JSON file, a dict with its content, or an :class:`HPSConfig`.
        retry_seconds: how long a failed tier is skipped before it is tried again (0: every
            lookup tries it).
        max_retry_seconds: the longest it is skipped while an outage lasts.
        gpu_cache: None puts ``gpucache`` models' caches on their GPUs where the GPU tier can run
            (else in host memory); True requires it (:class:`~embedlab.hps.tiers.TierError`
            naming the reason where it cannot run); False keeps every cache in host memory.

    Example:
        >>> import json, numpy as np
        >>> from embedlab.sparse_model import write_sparse_model
        >>> _ = write_sparse_model("demo.model", np.arange(10), np.arange(20, dtype=np.float32).reshape(10, 2))
        >>> with open("hps.json", "w") as f:
        ...     json.dump({"models": [{"model": "demo", "sparse_files": ["demo.model"],
        ...                             "embedding_vecsize_per_table": [2]}]}, f)
        >>> ps = ParameterServer("hps.json")
        >>> ps.lookup("demo", 0, np.array([1, 5, 7])).tolist()
        [[2.0, 3.0], [10.0, 11.0], [14.0, 15.0]]
        >>> ps.close()
    """

    def __init__(self, ps_config, retry_seconds: float = 0.5, max_retry_seconds: float = 8.0,
                 gpu_cache: bool | None = None):
        if gpu_cache not in (None, True, False):
            raise ValueError(f"ParameterServer: gpu_cache must be None (auto), True or False, got {gpu_cache!r}")
        for name, v in (("retry_seconds", retry_seconds), ("max_retry_seconds", max_retry_seconds)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(f"ParameterServer: {name} must be a number >= 0, got {v!r}")
        if max_retry_seconds < retry_seconds:
            raise ValueError(f"ParameterServer: max_retry_seconds ({max_retry_seconds}) must be >= retry_seconds "
                             f"({retry_seconds})")
        self.config: HPSConfig = load_config(ps_config)
        self.report = list(self.config.report)
        self.retry_seconds = float(retry_seconds)
        self.max_retry_seconds = float(max_retry_seconds)
        # Guards the counters, the tiers' outage state and the epoch; never held across a call into
        # the volatile or persistent DB (lookups run side by side; a hung Redis holds up only the
        # lookups that wait for it).
        self._lock = threading.Lock()
        self._gate = _WriteGate()
        self._tables: dict[tuple[str, int], _Table] = {}
        self._stats = {"cache": _TierStats(), "volatile": _TierStats(), "persistent": _TierStats()}
        self._closed = False
        # Odd while update() / refresh() writes, bumped at its start and end. A row read by a
        # lookup moves up (into the cache, now or in the background, or into the volatile DB)
        # only if the epoch is the even value it was when the lookup began: no write overlapped
        # the read, so the row is not older than one the tiers already hold.
        self._epoch = 0
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._worker: threading.Thread | None = None
        self._worker_lock = threading.Lock()
        # Background re-seeding of the volatile DB when it comes back from an outage: the newest
        # request's number (an older run stops at its next chunk) and the threads to join.
        self._reseed_gen = 0
        self._reseed_threads: list[threading.Thread] = []
        cfg = self.config
        self.cache: CacheTier | None = None
        self.volatile = None
        self.persistent = None
        self._caches: dict[str, CacheTier] = {}
        # The GPU tier: a GpuCacheTier per (embedding_cache_type, device), its counters per device.
        self._gpu_caches: dict[tuple[str, int], GpuCacheTier] = {}
        self._gpu_stats: dict[int, dict] = {}
        self._gpu_models: dict[str, list[int]] = {}
        self._xp: DeviceArrays | None = None
        # The GPU tier's request path (gpu_path.py): lookups, miss handling, cache inserts.
        self._gpu = GpuPath(self)
        self._paths_below: dict[str, list[_GuardedTier]] = {}
        self._g_volatile: _GuardedTier | None = None
        self._g_persistent: _GuardedTier | None = None
        self._paths: dict[str, list[_GuardedTier]] = {}
        try:
            vt = cfg.volatile_db.type
            if vt in ("hash_map", "parallel_hash_map"):
                self.volatile = HashMapTier(cfg.volatile_db, parallel=(vt == "parallel_hash_map"))
            elif vt == "redis_cluster":
                self.volatile = RedisTier(cfg.volatile_db)
            if cfg.persistent_db.type == "rocks_db":
                self.persistent = RocksDBTier(cfg.persistent_db)
            self._place_caches(gpu_cache)
            caches = {m.embedding_cache_type for m in cfg.models if m.gpucache and m.model not in self._gpu_models}
            self._caches = {t: CacheTier(static=(t == "static")) for t in caches}
            g_caches = {t: _GuardedTier("cache", c, self._stats["cache"], self) for t, c in self._caches.items()}
            if self.volatile is not None:
                self._g_volatile = _GuardedTier("volatile", self.volatile, self._stats["volatile"], self)
            if self.persistent is not None:
                self._g_persistent = _GuardedTier("persistent", self.persistent, self._stats["persistent"], self)
            for m in cfg.models:
                # The tiers a lookup of this model walks, top down.
                below = [g for g in (self._g_volatile, self._g_persistent) if g is not None]
                path = [g_caches[m.embedding_cache_type]] if m.embedding_cache_type in g_caches and m.gpucache \
                    and m.model not in self._gpu_models else []
                self._paths[m.model] = path + below
                self._paths_below[m.model] = below
            for m in cfg.models:
                self._load_model(m)
        except BaseException:
            self.close()
            raise

    # ---- start-up ---------------------------------------------------------------------------
    def _place_caches(self, gpu_cache) -> None:
        """Puts each ``gpucache`` model's caches on its ``deployed_device_list`` (the GPU tier)
        where CUDA kernels are built and a GPU is visible, else in host memory; says which in
        the report (``stats()["config_report"]``) and in ``stats()["models"]``."""
        cfg = self.config
        wanted = [m for m in cfg.models if m.gpucache]
        if not wanted:
            return
        if gpu_cache is False:
            ngpu, why = 0, "ParameterServer(gpu_cache=False)"
        else:
            ngpu, why = gpu_tier_available()
            if gpu_cache is True and not ngpu:
                raise TierError(f"HPS: gpu_cache=True but the GPU embedding cache cannot run here: {why}")
        for m in wanted:
            i = cfg.models.index(m)
            if not ngpu:
                self.report.append(f"models[{i}] ({m.model}): embedding cache in host memory, "
                                   f"deployed_device_list has no effect ({why})")
                continue
            bad = [d for d in m.deployed_device_list if d >= ngpu]
            if bad:
                raise TierError(f"HPS: models[{i}].deployed_device_list names device(s) {bad}, but "
                                f"{ngpu} GPU(s) are visible (devices 0..{ngpu - 1})")
            if self._xp is None:
                self._xp = DeviceArrays()
            devs = list(dict.fromkeys(m.deployed_device_list))
            self._gpu_models[m.model] = devs
            for d in devs:
                key = (m.embedding_cache_type, d)
                if key not in self._gpu_caches:
                    self._gpu_caches[key] = GpuCacheTier(d, static=(m.embedding_cache_type == "static"),
                                                         arrays=self._xp)
                    self._gpu_stats.setdefault(d, {"stats": _TierStats(), "sync_inserts": 0, "async_inserts": 0,
                                                   "inserts_skipped": 0})
            self.report.append(f"models[{i}] ({m.model}): embedding cache on GPU device(s) {devs} "
                               f"(CudaEmbeddingCache, {m.embedding_cache_type}, one per table per device)")

    def _cache_for(self, m):
        return self._caches.get(m.embedding_cache_type) if m.gpucache else None

    def _gpu_caches_for(self, m) -> list[GpuCacheTier]:
        return [self._gpu_caches[(m.embedding_cache_type, d)] for d in self._gpu_models.get(m.model, [])]

    def _volatile_keeps_rows(self) -> bool:
        """True when the volatile DB keeps what it took (an in-process hash map without overflow
        eviction); False for Redis (it can be killed, restarted empty, or refuse writes when full)
        and for a hash map that evicts above ``overflow_margin``."""
        vc = self.config.volatile_db
        return vc.type in ("hash_map", "parallel_hash_map") and not vc.overflow_margin

    def _volatile_desc(self) -> str:
        vc = self.config.volatile_db
        return f"volatile_db {vc.type}" + (f" at {vc.address}" if vc.type == "redis_cluster" else "")

    def _load_model(self, m, reload: bool = False) -> int:
        """Loads a model's sparse files into the tiers (at start-up, or ``refresh``).

        Decides per table which tiers hold every row (``_Table.complete``); where only a tier
        that can lose rows (Redis) holds them, keeps the model's keys (``_Table.held``) so that a
        key missing from every tier is told apart from a key the model does not hold.

        Raises:
            TierError: at start-up, when no tier holds every row of a table (a full or
                unreachable Redis with no persistent DB, ``initial_cache_rate`` below 1 with no
                persistent DB).
            HPSUnavailableError: on ``refresh``, when no tier took a table's new rows.
        """
        loaded = 0
        refused = []
        for t, (path, dim) in enumerate(zip(m.sparse_files, m.embedding_vecsize_per_table)):
            sig = _files_signature(path)
            sm = read_sparse_model(path, dim=dim)
            name = f"hps_et.{m.model}.{m.embedding_table_names[t]}"
            keys = np.ascontiguousarray(sm.keys, dtype=np.int64)
            vecs = np.ascontiguousarray(sm.vectors, dtype=np.float32)
            n = keys.shape[0]
            cache = self._cache_for(m)
            gcaches = self._gpu_caches_for(m)
            if not reload:
                tab = _Table(m.model, t, name, dim, m.default_value_for_each_table[t], n)
                tab.cache_tier = "gpu" if gcaches else ("cpu" if cache is not None else "none")
                tab.devices = tuple(g.device for g in gcaches)
                tab.gpu = {g.device: g for g in gcaches}
                tab.dynamic = m.embedding_cache_type == "dynamic"
                tab.threshold = m.hit_rate_threshold
                if self.volatile is not None:
                    self.volatile.add_table(name, dim, n)
                if self.persistent is not None:
                    self.persistent.add_table(name, dim, n)
                if m.embedding_cache_type == "static":
                    cap = n  # a static cache holds the whole table (HugeCTR's static table)
                else:
                    cap = max(1, int(math.ceil(m.gpucacheper * n)))
                if cache is not None:
                    cache.add_table(name, dim, cap)
                    tab.cache_capacity = cache.capacity(name)
                for g in gcaches:
                    g.add_table(name, dim, cap)
                    tab.cache_capacity = g.capacity(name)
            else:
                tab = self._tables[(m.model, t)]
            vc = self.config.volatile_db
            k = 0
            vol_all = False     # the volatile DB took every row of the table
            if self.volatile is not None and (vc.initialize_after_startup or reload):
                k = n if reload else int(math.floor(vc.initial_cache_rate * n + 1e-9))
                took = self._g_volatile.call(lambda: self.volatile.insert(name, keys[:k], vecs[:k]),
                                             fallback=False) is not False
                if not took and reload:
                    self._g_volatile.forget(name, keys)
                vol_all = took and k == n
            pc = self.config.persistent_db
            if self.persistent is not None and not self.persistent.read_only and (pc.initialize_after_startup or reload):
                self.persistent.insert(name, keys, vecs, bulk=True)
            complete = tuple(g for g, ok in ((self._g_persistent, self.persistent is not None),
                                             (self._g_volatile, vol_all and self._volatile_keeps_rows())) if ok)
            if not complete and not vol_all:
                if self.volatile is None:
                    why = "no volatile_db"
                elif k < n:
                    why = (f"{self._volatile_desc()} takes {k} of them (initial_cache_rate="
                           f"{vc.initial_cache_rate}, initialize_after_startup={vc.initialize_after_startup})")
                else:
                    why = f"{self._volatile_desc()} did not take them ({self._stats['volatile'].last_error})"
                if not reload:
                    raise TierError(f"HPS: no tier can hold table {name} ({n} rows from {path}): {why}, and "
                                    "persistent_db is disabled. Give the volatile DB room for every row (Redis "
                                    "maxmemory), set initial_cache_rate to 1, or enable a persistent_db (rocks_db)")
                refused.append(f"{name} ({why})")
            with self._lock:
                tab.rows = n
                tab.path = path
                tab.files_sig = sig
                tab.complete = complete
                tab.held = None if complete else _KeySet(keys)
                tab.updated = _KeySet()
                self._tables[(m.model, t)] = tab
            for c in ([cache] if cache is not None else []) + gcaches:
                if m.embedding_cache_type == "static" and not reload:
                    c.insert(name, keys, vecs)
                elif reload:
                    if m.embedding_cache_type == "static":
                        c.clear(name)
                        c.insert(name, keys, vecs)
                    else:
                        c.update(name, keys, vecs)
            loaded += n
        if refused:
            raise HPSUnavailableError(f"HPS refresh of model {m.model!r}: no tier took the new rows of "
                                      f"{'; '.join(refused)}, and persistent_db is disabled; lookups of their "
                                      "keys raise HPSUnavailableError until a refresh or update succeeds")
        return loaded

    # ---- helpers ----------------------------------------------------------------------------
    def _table(self, model, table_id) -> _Table:
        if not isinstance(model, str):
            raise HPSLookupError(f"HPS: model must be a model name (str), got {model!r}")
        if isinstance(table_id, bool) or not isinstance(table_id, (int, np.integer)):
            raise HPSLookupError(f"HPS: table_id must be an int, got {table_id!r}")
        tab = self._tables.get((model, int(table_id)))
        if tab is None:
            models = sorted({k[0] for k in self._tables})
            if model not in models:
                raise HPSLookupError(f"HPS: unknown model {model!r}; this server holds {models}")
            n = sum(1 for k in self._tables if k[0] == model)
            raise HPSLookupError(f"HPS: model {model!r} has no table_id {table_id} (it has tables 0..{n - 1})")
        return tab

    def _keys(self, keys) -> np.ndarray:
        a = np.asarray(keys)
        if a.dtype.kind not in "iu":
            raise HPSLookupError(f"HPS: keys must be integers (int64, or int32 without supportlonglong), "
                                 f"got dtype {a.dtype}")
        if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise HPSLookupError("HPS: keys hold values above the int64 range")
        if a.ndim != 1:
            raise HPSLookupError(f"HPS: keys must be 1-D, got shape {a.shape}")
        if not self.config.supportlonglong and a.size and (a.min() < -2**31 or a.max() >= 2**31):
            raise HPSLookupError("HPS: supportlonglong is false but keys hold values outside int32")
        return np.ascontiguousarray(a, dtype=np.int64)

    # ---- public API -------------------------------------------------------------------------
    def lookup(self, model: str, table_id: int, keys, return_defaulted: bool = False, device=None):
        """The rows of ``keys`` in table ``table_id`` of ``model``.

        Args:
            model: a model name of the config.
            table_id: index into the model's ``sparse_files``.
            keys: 1-D integer keys (duplicates allowed): a host array (NumPy, a list) or a GPU
                array (a torch.cuda tensor, a CuPy array, any CUDA DLPack tensor or capsule, such
                as a TensorFlow GPU tensor's), int64 (or int32).
            return_defaulted: also return which keys got the default value.
            device: where the rows go: None for the keys' own place (host keys -> a NumPy array,
                GPU keys -> an array on their GPU), or a CUDA device (0, "cuda:1", a
                torch.device) -> an array on it, in the keys' framework (PyTorch for host keys
                where it is installed, else CuPy). A model on the GPU tier must be deployed on
                that device (``deployed_device_list``); host keys with ``device=None`` are served
                by the cache of its first deployed device.

        Returns:
            float32 ``[len(keys), dim]``; keys found in no tier get the table's default value
            (counted per key, duplicates included, in ``stats()``'s ``defaults_returned``). With
            ``return_defaulted``: ``(vectors, defaulted)``, ``defaulted`` a bool ``[len(keys)]``
            (on the same device as the vectors) that is True where the row is the default value
            because no tier holds the key.

        Raises:
            HPSLookupError: unknown model or table, keys not 1-D integers, a device the model is
                not deployed on, GPU keys on another device than ``device``.
            HPSUnavailableError: keys the model holds whose rows no reachable tier has (Redis,
                the only tier holding them, down, restarted empty or refused their update; or the
                tiers holding every row did not answer). Counted in ``stats()``'s
                ``unavailable_keys``; retry once the tier is back.

        On the GPU tier, the cache hits never leave the GPU; the misses' keys are copied to the
        host once, looked up in the tiers below in one batch, and their rows copied back in one
        copy; the call synchronizes the current stream of the device once (twice with misses),
        and a host result costs one more copy.
        """
        if self._closed:
            raise RuntimeError("HPS: the ParameterServer is closed")
        tab = self._table(model, table_id)
        fw = DeviceArrays.framework(keys)
        if tab.cache_tier == "gpu":
            return self._gpu.lookup_one(tab, keys, fw, device, return_defaulted)
        if fw or device is not None:
            return self._lookup_host_for_device(tab, keys, fw, device, return_defaulted)
        return self._lookup_host(tab, self._keys(keys), return_defaulted)

    def lookup_many(self, model: str, keys, return_defaulted: bool = False, device=None, sizes=None):
        """The rows of several tables of ``model`` as one request (what Triton's ``hps_embedding``
        model and the lookup layer ask for: one batch of keys per table).

        Args:
            model: a model name of the config.
            keys: one 1-D integer key array per table: a list or tuple (entry i for table_id i)
                or a dict ``{table_id: keys}``; each as :meth:`lookup` takes them (host or GPU).
                With ``sizes``: one 1-D array (host or GPU) of every table's keys end to end,
                table 0's first (HugeCTR's Triton HPS backend's ``KEYS``).
            return_defaulted: also return, per table, which keys got the default value.
            device: as :meth:`lookup`; GPU keys must all be on one device.
            sizes: None, or the number of keys of each table of the model, in table order
                (HugeCTR's ``NUMKEYS``): host integers (a list or NumPy array), one per table,
                summing to ``len(keys)``; 0 for a table not asked.

        Returns:
            The rows in the form of ``keys`` (a list, or a dict by table id), each as
            :meth:`lookup` returns them; with ``return_defaulted``, ``(rows, defaulted)`` with
            ``defaulted`` in the same form. With ``sizes``: one float32 1-D array of
            ``sum(sizes[i] * dim_i)`` values, table i's rows ``[sizes[i], dim_i]`` row-major
            after table i-1's, no gaps (HugeCTR's Triton ``OUTPUT`` layout), and ``defaulted``
            one bool array of ``len(keys)``; where they go follows :meth:`lookup`'s rule.

        Raises:
            HPSLookupError: as :meth:`lookup`, GPU keys of one request on different devices,
                and ``sizes`` that are not one count >= 0 per table summing to ``len(keys)``.
            HPSUnavailableError: as :meth:`lookup`.

        On the GPU tier the whole request costs one host synchronization: every table's cache
        lookup is enqueued on the current stream of the device and their miss counts come back
        together; the misses of all tables are then copied to the host in one copy, looked up in
        the tiers below (table by table) and their rows copied back in one copy. Host keys go to
        the device in one copy, and host rows come back in one copy. The rows of one request
        are views of one device buffer. When every table's keys are int64 arrays of the
        backend's framework (PyTorch where it is installed) or int64 NumPy arrays, the request
        path's Python work is a few attribute reads per table and a constant rest; the ``sizes``
        form is the cheapest (no per-table arrays in or out). Elsewhere (the CPU tier) the
        tables are looked up one by one.

        Example:
            >>> rows = ps.lookup_many("m", [keys_t0, keys_t1])          # doctest: +SKIP
            >>> rows = ps.lookup_many("m", {0: k0, 3: k3}, device=0)     # doctest: +SKIP
            >>> flat = ps.lookup_many("m", torch.cat([k0, k1]), sizes=[len(k0), len(k1)])  # doctest: +SKIP
        """
        if self._closed:
            raise RuntimeError("HPS: the ParameterServer is closed")
        if sizes is not None:
            return self._lookup_flat(model, keys, sizes, return_defaulted, device)
        if isinstance(keys, dict):
            ids, ks = list(keys.keys()), list(keys.values())
            plan = self._gpu.plan(model, tuple(ids))
        elif isinstance(keys, (list, tuple)):
            ids, ks = None, keys if isinstance(keys, list) else list(keys)
            plan = self._gpu.plan_list(model, len(ks))
        else:
            raise HPSLookupError(f"HPS: lookup_many takes keys as a list (one array per table) or a dict "
                                 f"{{table_id: keys}}, got {type(keys).__name__}")
        if plan.gpu:
            rows, flags = self._gpu.lookup_many_list(plan, ks, device, return_defaulted)
        else:
            ids = list(range(len(ks))) if ids is None else ids
            res = [self.lookup(model, i, k, return_defaulted=return_defaulted, device=device) for i, k in zip(ids, ks)]
            rows = [r[0] for r in res] if return_defaulted else res
            flags = [r[1] for r in res] if return_defaulted else None
        if isinstance(keys, dict):
            rows = dict(zip(ids, rows))
            flags = dict(zip(ids, flags)) if return_defaulted else None
        return (rows, flags) if return_defaulted else rows

    def _lookup_flat(self, model, keys, sizes, return_defaulted: bool, device):
        """``lookup_many(..., sizes=)``: the GPU tier serves it as one request; the CPU tier
        table by table, the rows then put end to end."""
        plan = self._gpu.plan_all(model)
        if plan.gpu:
            return self._gpu.lookup_flat(plan, keys, sizes, device, return_defaulted)
        fw = DeviceArrays.framework(keys)
        xp = self._need_xp() if fw else None
        k = self._gpu.device_keys(xp, keys) if fw else self._keys(keys)
        ns = self._gpu.check_sizes(plan, sizes, int(k.shape[0]))
        parts, o = [], 0
        for n in ns:
            parts.append(k[o:o + n])
            o += n
        res = self.lookup_many(model, parts, return_defaulted=True, device=device)
        rows = [r.reshape(-1) for r in res[0]]
        if not fw and device is None:
            flat, flags = np.concatenate(rows), np.concatenate(res[1])
        else:
            xp = self._need_xp()
            flat, flags = xp.cat(rows), xp.cat(res[1])
            flat, flags = xp.export_array(flat, fw), xp.export_array(flags, fw)
        return (flat, flags) if return_defaulted else flat

    def _walk(self, tab: _Table, ukeys: np.ndarray, path: list, epoch: int):
        """Looks unique keys up in `path` (the tiers, top down), each tier asked for the keys the
        tiers above it did not hold; fills defaults; moves rows up into the volatile DB. Returns
        (rows, missing: positions found nowhere, missed: per tier the positions it did not hold).

        A key found nowhere gets the default only when the model does not hold it: when a tier
        that holds every row of the table (``tab.complete``) answered, or, where only Redis holds
        them, when the key is not one of the model's (``tab.held``). Otherwise raises
        :class:`HPSUnavailableError`."""
        u = ukeys.shape[0]
        out = np.empty((u, tab.dim), np.float32)
        missing = np.arange(u, dtype=np.int64)
        missed = []
        complete_answered = False
        for g in path:
            whole = missing.shape[0] == u
            dst = out if whole else np.empty((missing.shape[0], tab.dim), np.float32)
            m, answered = g.find(tab.name, ukeys if whole else ukeys[missing], dst)
            if answered and g in tab.complete:
                complete_answered = True
            if not whole:
                got = np.ones(missing.shape[0], bool)
                got[m] = False
                out[missing[got]] = dst[got]
            missing = missing[m]
            missed.append(missing)
            if not missing.size:
                break
        if missing.size and not complete_answered:
            self._check_not_held(tab, ukeys[missing], path)
        if missing.size:
            out[missing] = tab.default
        # Upward insertion into the volatile DB: the rows it missed that the persistent DB held.
        for g, below in zip(path, missed):
            if g is self._g_volatile and below is not missing and below.size:
                pos = below[~np.isin(below, missing, assume_unique=True)] if missing.size else below
                if pos.size:
                    self._insert_volatile(tab, ukeys[pos], out[pos], epoch)
        return out, missing, missed

    def _check_not_held(self, tab: _Table, keys: np.ndarray, path: list) -> None:
        """Raises HPSUnavailableError when some of ``keys`` (found in no tier, and no tier holding
        every row answered) are held by the model, or may be (no key set kept)."""
        with self._lock:
            held = None if tab.held is None else tab.held.contains(keys)
        bad = keys if held is None else keys[held]
        if not bad.size:
            return
        causes = []
        for g in path:
            if g.which == "cache":
                continue
            with self._lock:
                down, err = g.stats.down_since is not None, g.stats.last_error
            desc = self._volatile_desc() if g.which == "volatile" else f"persistent_db {g.kind}"
            causes.append(f"{desc}: " + (f"unavailable ({err})" if down else
                                         "does not have them" + (f" (last error: {err})" if err else "")))
        with self._lock:
            tab.unavailable += int(bad.shape[0])
        what = ("are held by the model" if held is not None else
                "may be held by the model (the tiers that hold every row did not answer)")
        raise HPSUnavailableError(
            f"HPS: model {tab.model!r} table {tab.index} ({tab.name}): {bad.shape[0]} key(s) {what} but no "
            f"reachable tier has their rows [{'; '.join(causes) or 'no tier below the cache'}]; e.g. keys "
            f"{bad[:5].tolist()}. They are not answered with the default value; the lookup can be retried "
            "once the tier is back (it is re-seeded in the background)")

    def _lookup_host(self, tab: _Table, keys: np.ndarray, return_defaulted: bool):
        """The CPU tier: host keys -> host rows."""
        n = keys.shape[0]
        if n == 0:
            empty = np.zeros((0, tab.dim), np.float32)
            return (empty, np.zeros(0, bool)) if return_defaulted else empty
        ukeys, inverse = np.unique(keys, return_inverse=True)
        u = ukeys.shape[0]
        mcfg = self.config.model(tab.model)
        path = self._paths[tab.model]
        with self._lock:
            tab.lookups += 1
            tab.keys += n
            epoch = self._epoch
        out, missing, missed = self._walk(tab, ukeys, path, epoch)
        defaulted = None
        if missing.size:
            unique_defaulted = np.zeros(u, bool)
            unique_defaulted[missing] = True
            defaulted = unique_defaulted[inverse]
            with self._lock:
                tab.defaults_returned += int(np.count_nonzero(defaulted))
        # Into a dynamic cache: the rows it missed that a tier below held.
        if path and path[0].which == "cache" and mcfg.embedding_cache_type == "dynamic" and missed[0].size:
            below = missed[0]
            pos = below[~np.isin(below, missing, assume_unique=True)] if missing.size else below
            if pos.size:
                self._insert_cache(path[0].tier, tab, ukeys[pos], out[pos], epoch,
                                   sync=(1.0 - below.shape[0] / u) < mcfg.hit_rate_threshold)
        if return_defaulted:
            return out[inverse], (defaulted if defaulted is not None else np.zeros(n, bool))
        return out[inverse]

    def _need_xp(self) -> DeviceArrays:
        if self._xp is None:
            ngpu, why = gpu_tier_available()
            if not ngpu:
                raise HPSLookupError(f"HPS: GPU keys or a device were given, but no GPU can be used here: {why}")
            self._xp = DeviceArrays()
        return self._xp

    def _device_keys(self, xp: DeviceArrays, keys):
        """GPU keys as this backend's contiguous int64 1-D array (checked)."""
        return self._gpu.device_keys(xp, keys)

    def _lookup_host_for_device(self, tab, keys, fw, device, return_defaulted):
        """A model without the GPU tier asked with GPU keys or for a device: served by the CPU
        tier, the keys and rows copied across."""
        xp = self._need_xp()
        if fw:
            k = self._device_keys(xp, keys)
            d = xp.device_of(k) if device is None else _device_index(device)
            hk = xp.get(k)
        else:
            d = _device_index(device)
            hk = self._keys(keys)
        res = self._lookup_host(tab, hk, return_defaulted)
        with xp.device_context(d):
            if return_defaulted:
                return (xp.export_array(xp.put(res[0], d), fw), xp.export_array(xp.put(res[1], d), fw))
            return xp.export_array(xp.put(res, d), fw)

    def _current(self, epoch: int) -> bool:
        """True when no update / refresh ran or runs since a lookup saw ``epoch`` (under _lock)."""
        return epoch % 2 == 0 and epoch == self._epoch

    def _insert_volatile(self, tab, k, v, epoch) -> None:
        """Rows found only in the persistent DB, into the volatile DB (``cache_missed_embeddings``)."""
        if not self.config.volatile_db.cache_missed_embeddings:
            return
        with self._gate.shared_or_skip() as held:
            if not held:
                return
            with self._lock:
                current = self._current(epoch)
            if current and self._g_volatile.call(lambda: self.volatile.insert(tab.name, k, v),
                                                 fallback=False) is not False:
                with self._lock:
                    self._stats["volatile"].inserted += int(k.size)

    def _insert_cache(self, cache, tab, k, v, epoch, sync: bool) -> None:
        """Rows found below a dynamic cache, into it: before lookup returns when this batch's hit
        rate is below ``hit_rate_threshold``, else by the background thread."""
        if sync:
            with self._lock:
                if self._current(epoch):
                    cache.insert(tab.name, k, v)
                    tab.sync_inserts += int(k.size)
                    self._stats["cache"].inserted += int(k.size)
        else:
            self._enqueue(cache, tab, k, v, epoch)

    def _enqueue(self, cache, tab, k, v, epoch):
        self._enqueue_call((cache, tab, k, v, epoch))

    def _enqueue_call(self, item) -> None:
        """Queues a background insertion: (cache, tab, keys, rows, epoch) of the CPU cache, or a
        function of the GPU tier."""
        with self._worker_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._insert_worker, name="hps-cache-insert", daemon=True)
                self._worker.start()
                _with_inserter.add(self)
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            # The background inserter is behind; HugeCTR drops such insertions too (the rows stay
            # in the lower tiers and come up on a later miss).
            pass

    def _insert_worker(self):
        while True:
            item = self._queue.get()
            if item is None:
                self._queue.task_done()
                return
            if callable(item):
                try:
                    if not self._closed:
                        item()
                except Exception as e:  # never kill the worker; report
                    log.warning("HPS background GPU cache insertion failed: %s", e)
                finally:
                    self._queue.task_done()
                continue
            cache, tab, k, v, epoch = item
            try:
                with self._lock:
                    if not self._closed and self._current(epoch):
                        cache.insert(tab.name, k, v)
                        tab.async_inserts += int(k.size)
                        self._stats["cache"].inserted += int(k.size)
            except Exception as e:  # never kill the worker; report
                log.warning("HPS background cache insertion failed for %s: %s", tab.name, e)
            finally:
                self._queue.task_done()

    def _tier_back(self, g: _GuardedTier) -> None:
        """Called (under _lock) when a tier is marked back after an outage: a volatile DB is
        re-seeded in the background (see :meth:`_reseed`); a newer request stops an older run."""
        if g is not self._g_volatile or self._closed:
            return
        self._reseed_gen += 1
        g.stats.reseeding = True
        th = threading.Thread(target=self._reseed, args=(self._reseed_gen,), name="hps-reseed", daemon=True)
        self._reseed_threads = [t for t in self._reseed_threads if t.is_alive()] + [th]
        th.start()

    def _reseed(self, gen: int, chunk: int = 8192) -> None:
        """Writes into the volatile DB what it holds after start-up (each table's first
        ``initial_cache_rate`` rows, read again from its sparse files) after an outage: it may
        have been restarted empty, or been down when the server started.

        Runs in the background: lookups go on meanwhile (from the tiers below; those that need
        the rows while only Redis holds them raise HPSUnavailableError until they are back).
        Each chunk is written holding the write gate alone, so it never interleaves with an
        update or refresh, and skips the keys updated since the files were loaded (their rows
        in the tiers are newer than the files'). A table whose files changed on disk since they
        were loaded is skipped (``refresh`` loads them). Stops when the tier fails again (the
        next time it is back starts a new run), when it is full, or when the server closes."""
        vc = self.config.volatile_db
        g = self._g_volatile
        st = g.stats
        t0 = time.monotonic()
        rows = tables = 0
        done = False
        try:
            if not vc.initialize_after_startup:
                done = True
                return
            for tab in list(self._tables.values()):
                sig = tab.files_sig
                if sig is None:
                    continue
                try:
                    sm = read_sparse_model(tab.path, dim=tab.dim, mmap=True)
                except Exception as e:  # noqa: BLE001 (reported; the other tables go on)
                    log.warning("HPS re-seed of the volatile tier: cannot read %s for %s: %s", tab.path, tab.name, e)
                    continue
                n = sm.keys.shape[0]
                k = int(math.floor(vc.initial_cache_rate * n + 1e-9))
                for s0 in range(0, k, chunk):
                    try:
                        now = _files_signature(tab.path)
                    except OSError:
                        now = None
                    with self._gate.exclusive():
                        with self._lock:
                            if self._closed or gen != self._reseed_gen:
                                return
                            changed = now != sig or tab.files_sig != sig
                            upd = tab.updated.array()
                        if changed:
                            log.warning("HPS re-seed of the volatile tier: the files of %s (%s) changed since they "
                                        "were loaded; its rows are not re-seeded (refresh() loads them)",
                                        tab.name, tab.path)
                            break
                        ck = np.ascontiguousarray(sm.keys[s0:min(k, s0 + chunk)], dtype=np.int64)
                        cv = np.ascontiguousarray(sm.vectors[s0:min(k, s0 + chunk)], dtype=np.float32)
                        if upd.size:
                            keep = ~np.isin(ck, upd)
                            ck, cv = ck[keep], cv[keep]
                        if ck.size and g.call(lambda: self.volatile.insert(tab.name, ck, cv),
                                              fallback=False) is False:
                            log.warning("HPS re-seed of the volatile tier (%s) stopped after %d rows: %s",
                                        g.kind, rows, st.last_error)
                            return
                        rows += int(ck.size)
                tables += 1
            done = True
            log.warning("HPS volatile tier (%s) re-seeded: %d rows of %d table(s) in %.1f s", g.kind, rows, tables,
                        time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 (a background thread: reported, never raised)
            log.warning("HPS re-seed of the volatile tier (%s) failed after %d rows: %s", g.kind, rows, e)
        finally:
            with self._lock:
                st.reseeded_rows += rows
                if done:
                    st.reseeds += 1
                if gen == self._reseed_gen:
                    st.reseeding = False

    def wait_reseed(self, timeout: float | None = None) -> bool:
        """Blocks until the background re-seeding of the volatile DB started so far has ended;
        returns False if it still runs after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        for th in list(self._reseed_threads):
            th.join(None if end is None else max(0.0, end - time.monotonic()))
            if th.is_alive():
                return False
        return True

    def _stop_inserter(self) -> None:
        """Stops the background cache inserter and re-seeding: queued insertions are dropped (the
        rows stay in the tiers below), the one running ends, the threads are joined."""
        self._closed = True
        with self._lock:
            self._reseed_gen += 1
        for th in list(getattr(self, "_reseed_threads", [])):
            if th is not threading.current_thread():
                th.join(timeout=30)
        w = self._worker
        if w is not None and w.is_alive():
            self._queue.put(None)       # the worker skips what is queued before it once closed
            w.join(timeout=30)
        _with_inserter.discard(self)

    def wait_background(self) -> None:
        """Blocks until the background cache insertions queued so far are done."""
        self._queue.join()

    def update(self, model: str, table_id: int, keys, vectors) -> int:
        """Writes rows into every tier (online update); returns the number of keys.

        The volatile DB and the persistent DB (unless ``read_only``) get the rows; the cache
        (every deployed device's, on the GPU tier) overwrites the rows it already holds (a
        ``static`` cache cannot be updated: error). ``keys`` and ``vectors`` are host arrays.

        Args:
            model: a model name of the config.
            table_id: index into the model's ``sparse_files``.
            keys: 1-D integer keys, no duplicates (new keys are added to the table).
            vectors: float ``[len(keys), dim]``.

        Returns:
            The number of keys written.

        Raises:
            HPSLookupError: bad arguments, or a ``static`` cache.
            HPSUnavailableError: no tier took the rows (the volatile DB refused them, full or
                down, and there is no writable persistent DB); their old rows are erased from
                the volatile DB and the caches, so lookups of these keys raise until an update
                or a refresh succeeds, and are never answered with an old row or the default.

        Example:
            >>> ps.update("demo", 0, np.array([1, 5]), np.ones((2, 2)))   # doctest: +SKIP
            2
        """
        tab = self._table(model, table_id)
        keys = self._keys(keys)
        vectors = np.asarray(vectors)
        if vectors.dtype.kind != "f":
            raise HPSLookupError(f"HPS update: vectors must be float, got dtype {vectors.dtype}")
        if vectors.shape != (keys.shape[0], tab.dim):
            raise HPSLookupError(f"HPS update: vectors must be [{keys.shape[0]}, {tab.dim}] for table "
                                 f"{table_id} of {model!r}, got {vectors.shape}")
        if np.unique(keys).shape[0] != keys.shape[0]:
            raise HPSLookupError("HPS update: keys hold duplicates (which row would win is undefined)")
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        mcfg = self.config.model(model)
        cache = self._cache_for(mcfg)
        gcaches = self._gpu_caches_for(mcfg)
        if (cache is not None or gcaches) and mcfg.embedding_cache_type == "static":
            raise HPSLookupError(f"HPS update: model {model!r} uses embedding_cache_type 'static', "
                                 "which cannot be updated; use 'dynamic'")
        with self._writing():
            accepted = False
            if self.persistent is not None and not self.persistent.read_only:
                self.persistent.insert(tab.name, keys, vectors)
                accepted = True
            if self.volatile is not None:
                if self._g_volatile.call(lambda: self.volatile.insert(tab.name, keys, vectors),
                                         fallback=False) is False:
                    self._g_volatile.forget(tab.name, keys)
                else:
                    accepted = True
            with self._lock:
                # Rows written since the files were loaded: a re-seed from the files skips them.
                tab.updated.add(keys)
                if accepted and tab.held is not None:
                    tab.held.add(keys)
            if not accepted:
                # No tier below the caches took the rows, and the volatile DB forgets their old
                # ones (it may hold part of the new ones): so do the caches, and lookups of these
                # keys raise until an update or refresh succeeds.
                for c in ([cache] if cache is not None else []) + gcaches:
                    c.erase(tab.name, keys)
                st = self._stats["volatile"]
                raise HPSUnavailableError(
                    f"HPS update of model {model!r} table {table_id} ({tab.name}): no tier took the "
                    f"{keys.shape[0]} row(s): "
                    + (f"{self._volatile_desc()} refused them ({st.last_error})" if self.volatile is not None
                       else "no volatile_db")
                    + (", persistent_db is read_only" if self.persistent is not None else
                       ", persistent_db is disabled")
                    + "; lookups of these keys raise HPSUnavailableError until an update or refresh succeeds")
            if cache is not None:
                cache.update(tab.name, keys, vectors)
            for g in gcaches:
                g.update(tab.name, keys, vectors)
        return int(keys.shape[0])

    def refresh(self, model: str) -> int:
        """Reloads the model's sparse files into the tiers (rows changed on disk); returns rows read."""
        m = self.config.model(model)
        with self._writing():
            return self._load_model(m, reload=True)

    @contextlib.contextmanager
    def _writing(self):
        """One writer at a time, with the epoch odd while it writes (see ``_epoch``)."""
        with self._gate.exclusive():
            with self._lock:
                self._epoch += 1
            try:
                yield
            finally:
                with self._lock:
                    self._epoch += 1

    def table_info(self, model: str, table_id: int) -> dict:
        tab = self._table(model, table_id)
        return {"name": tab.name, "dim": tab.dim, "rows": tab.rows, "default": tab.default,
                "cache_capacity": tab.cache_capacity, "cache_tier": tab.cache_tier, "devices": list(tab.devices)}

    def stats(self) -> dict:
        """Per-tier hits, misses, errors, calls, mean latency, inserts, ``writes_refused`` (writes a
        full tier refused, such as a Redis at ``maxmemory``) and availability (``available``,
        ``outages``, ``down_seconds`` of the current outage, ``last_error``: the cause of the last
        failure, such as ``Redis at ...: TimeoutError: Timeout reading from socket``), plus per-table
        counts (lookups, keys, defaults returned, sync/async cache inserts, ``cache_tier``) and the
        config report. ``tiers["cache"]["devices"]`` holds the GPU tier's counters per device
        (``"cuda:0"``: hits, misses, inserted, sync/async inserts, inserts skipped because an update
        ran meanwhile), ``tiers["cache"]`` their totals with the CPU cache's; ``models`` says which
        tier each model's cache got (``"gpu"`` with its devices, ``"cpu"``, ``"none"``)."""
        with self._lock:
            tiers = {k: v.as_dict() for k, v in self._stats.items()}
            c = tiers["cache"]
            for g in self._gpu_stats.values():
                gs = g["stats"]
                c["hits"] += gs.hits
                c["misses"] += gs.misses
                c["calls"] += gs.calls
                c["seconds"] += gs.seconds
            if c["calls"]:
                c["latency_ms_mean"] = 1e3 * c["seconds"] / c["calls"]
            tiers["cache"]["kind"] = ",".join(sorted(set(self._caches) | {t for t, _ in self._gpu_caches})) or "disabled"
            tiers["cache"]["devices"] = {
                f"cuda:{d}": {**g["stats"].as_dict(), "sync_inserts": g["sync_inserts"],
                              "async_inserts": g["async_inserts"], "inserts_skipped": g["inserts_skipped"]}
                for d, g in sorted(self._gpu_stats.items())}
            tiers["volatile"]["kind"] = getattr(self.volatile, "kind", "disabled")
            tiers["persistent"]["kind"] = getattr(self.persistent, "kind", "disabled")
            tiers["volatile"]["bad_values"] = getattr(self.volatile, "bad_values", 0)
            tiers["persistent"]["bad_values"] = getattr(self.persistent, "bad_values", 0)
            tables = {f"{t.model}/{t.index}": {"name": t.name, "dim": t.dim, "rows": t.rows,
                                               "cache_capacity": t.cache_capacity, "cache_tier": t.cache_tier,
                                               "devices": list(t.devices), "lookups": t.lookups,
                                               "keys": t.keys, "defaults_returned": t.defaults_returned,
                                               "unavailable_keys": t.unavailable,
                                               "sync_cache_inserts": t.sync_inserts,
                                               "async_cache_inserts": t.async_inserts}
                      for t in self._tables.values()}
            models = {m.model: {"cache_tier": ("gpu" if m.model in self._gpu_models else
                                               "cpu" if m.gpucache else "none"),
                                "devices": list(self._gpu_models.get(m.model, []))} for m in self.config.models}
            return {"tiers": tiers, "tables": tables, "models": models, "config_report": list(self.report),
                    "config": self.config.source}

    def close(self) -> None:
        """Stops the background inserter and closes the tiers (idempotent)."""
        if getattr(self, "_did_close", False):
            return
        self._did_close = True
        self._stop_inserter()
        gp = getattr(self, "_gpu", None)
        if gp is not None:
            gp.close()
        for tier in [getattr(self, "volatile", None), getattr(self, "persistent", None),
                     *getattr(self, "_caches", {}).values(), *getattr(self, "_gpu_caches", {}).values()]:
            if tier is not None:
                try:
                    tier.close()
                except Exception:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
