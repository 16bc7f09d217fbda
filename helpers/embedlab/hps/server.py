"""The Hierarchical Parameter Server: embedding cache -> volatile DB -> persistent DB -> default.

No TensorFlow here: the Triton python backend runs this module in a process without it.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import math
import queue
import threading
import time
import weakref
from dataclasses import dataclass

import numpy as np

from ..sparse_model import read_sparse_model
from .config import HPSConfig, load_config
from .tiers import CacheTier, HashMapTier, RedisTier, RocksDBTier, TierFull, TierUnavailable

log = logging.getLogger("embedlab.hps")

__all__ = ["ParameterServer", "HPSLookupError"]

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
    """Bad lookup arguments: unknown model / table id, keys of the wrong dtype or shape."""


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

    def as_dict(self):
        down = self.down_since is not None
        return {"hits": self.hits, "misses": self.misses, "errors": self.errors, "calls": self.calls,
                "latency_ms_mean": 1e3 * self.seconds / self.calls if self.calls else 0.0,
                "seconds": self.seconds, "inserted": self.inserted, "writes_refused": self.writes_refused,
                "outages": self.outages,
                "available": not down, "last_error": self.last_error,
                "down_seconds": time.monotonic() - self.outage_start if down else 0.0}


@dataclass
class _Table:
    model: str
    index: int
    name: str          # hps_et.<model>.<table name>, the key in every tier
    dim: int
    default: float
    rows: int
    cache_capacity: int = 0
    sync_inserts: int = 0
    async_inserts: int = 0
    defaults_returned: int = 0
    lookups: int = 0
    keys: int = 0


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

    def find(self, name: str, keys: np.ndarray, out: np.ndarray) -> np.ndarray:
        """tier.find, timed and counted; all positions missing when the tier is skipped or fails."""
        t0 = time.perf_counter()
        missing = self.call(lambda: self.tier.find(name, keys, out), fallback=None)
        dt = time.perf_counter() - t0
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
        return missing


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

    Start-up loads each table's ``key`` / ``emb_vector`` folder: the persistent DB gets every row
    (unless ``read_only``), the volatile DB the first ``initial_cache_rate`` of them, a static
    cache as many as fit. Keys found nowhere get the default value and are counted.

    A tier that fails at run time (Redis killed, hung, restarted with another password) is logged
    once, counted in ``stats()`` with the cause (``last_error``), and skipped: lookups go on from
    the tiers that remain. It is tried again after ``retry_seconds``, then after twice as long
    each time it is still down (up to ``max_retry_seconds``: a hung Redis costs the lookup that
    tries it a socket timeout; while one lookup tries it, the others go on without it), and
    logged again when it is back; rows updated while it was down are erased from it before it
    serves again (it may still hold their old values). A tier that cannot be set up at start-up
    (an unreadable RocksDB path, Redis unreachable) raises :class:`~embedlab.hps.tiers.TierError`
    naming it.

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

    def __init__(self, ps_config, retry_seconds: float = 0.5, max_retry_seconds: float = 8.0):
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
        cfg = self.config
        self.cache: CacheTier | None = None
        self.volatile = None
        self.persistent = None
        self._caches: dict[str, CacheTier] = {}
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
            caches = {m.embedding_cache_type for m in cfg.models if m.gpucache}
            self._caches = {t: CacheTier(static=(t == "static")) for t in caches}
            g_caches = {t: _GuardedTier("cache", c, self._stats["cache"], self) for t, c in self._caches.items()}
            if self.volatile is not None:
                self._g_volatile = _GuardedTier("volatile", self.volatile, self._stats["volatile"], self)
            if self.persistent is not None:
                self._g_persistent = _GuardedTier("persistent", self.persistent, self._stats["persistent"], self)
            for m in cfg.models:
                # The tiers a lookup of this model walks, top down.
                path = [g_caches[m.embedding_cache_type]] if m.gpucache else []
                self._paths[m.model] = path + [g for g in (self._g_volatile, self._g_persistent) if g is not None]
            for m in cfg.models:
                self._load_model(m)
        except BaseException:
            self.close()
            raise

    # ---- start-up ---------------------------------------------------------------------------
    def _cache_for(self, m):
        return self._caches.get(m.embedding_cache_type) if m.gpucache else None

    def _load_model(self, m, reload: bool = False) -> int:
        loaded = 0
        for t, (path, dim) in enumerate(zip(m.sparse_files, m.embedding_vecsize_per_table)):
            sm = read_sparse_model(path, dim=dim)
            name = f"hps_et.{m.model}.{m.embedding_table_names[t]}"
            keys = np.ascontiguousarray(sm.keys, dtype=np.int64)
            vecs = np.ascontiguousarray(sm.vectors, dtype=np.float32)
            n = keys.shape[0]
            cache = self._cache_for(m)
            if not reload:
                tab = _Table(m.model, t, name, dim, m.default_value_for_each_table[t], n)
                if self.volatile is not None:
                    self.volatile.add_table(name, dim, n)
                if self.persistent is not None:
                    self.persistent.add_table(name, dim, n)
                if cache is not None:
                    if m.embedding_cache_type == "static":
                        cap = n  # a static cache holds the whole table (HugeCTR's static table)
                    else:
                        cap = max(1, int(math.ceil(m.gpucacheper * n)))
                    cache.add_table(name, dim, cap)
                    tab.cache_capacity = cache.capacity(name)
                self._tables[(m.model, t)] = tab
            else:
                self._tables[(m.model, t)].rows = n
            vc = self.config.volatile_db
            if self.volatile is not None and (vc.initialize_after_startup or reload):
                k = n if reload else int(math.floor(vc.initial_cache_rate * n + 1e-9))
                if self._g_volatile.call(lambda: self.volatile.insert(name, keys[:k], vecs[:k]),
                                         fallback=False) is False and reload:
                    self._g_volatile.forget(name, keys)
            pc = self.config.persistent_db
            if self.persistent is not None and not self.persistent.read_only and (pc.initialize_after_startup or reload):
                self.persistent.insert(name, keys, vecs, bulk=True)
            if cache is not None:
                if m.embedding_cache_type == "static" and not reload:
                    cache.insert(name, keys, vecs)
                elif reload:
                    if m.embedding_cache_type == "static":
                        cache.clear(name)
                        cache.insert(name, keys, vecs)
                    else:
                        cache.update(name, keys, vecs)
            loaded += n
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
    def lookup(self, model: str, table_id: int, keys, return_defaulted: bool = False):
        """The rows of ``keys`` in table ``table_id`` of ``model``.

        Args:
            model: a model name of the config.
            table_id: index into the model's ``sparse_files``.
            keys: 1-D integer array (duplicates allowed).
            return_defaulted: also return which keys got the default value.

        Returns:
            float32 ``[len(keys), dim]``; keys found in no tier get the table's default value
            (counted per key, duplicates included, in ``stats()``'s ``defaults_returned``). With
            ``return_defaulted``: ``(vectors, defaulted)``, ``defaulted`` a bool ``[len(keys)]``
            that is True where the row is the default value because no tier holds the key.
        """
        if self._closed:
            raise RuntimeError("HPS: the ParameterServer is closed")
        tab = self._table(model, table_id)
        keys = self._keys(keys)
        n = keys.shape[0]
        if n == 0:
            empty = np.zeros((0, tab.dim), np.float32)
            return (empty, np.zeros(0, bool)) if return_defaulted else empty
        ukeys, inverse = np.unique(keys, return_inverse=True)
        u = ukeys.shape[0]
        out = np.empty((u, tab.dim), np.float32)
        mcfg = self.config.model(model)
        path = self._paths[model]
        with self._lock:
            tab.lookups += 1
            tab.keys += n
            epoch = self._epoch
        # Walk the tiers top down; each is asked for the keys the tiers above it did not hold.
        missing = np.arange(u, dtype=np.int64)
        missed = []                 # per tier: the positions it was asked for and did not hold
        for g in path:
            whole = missing.shape[0] == u
            dst = out if whole else np.empty((missing.shape[0], tab.dim), np.float32)
            m = g.find(tab.name, ukeys if whole else ukeys[missing], dst)
            if not whole:
                got = np.ones(missing.shape[0], bool)
                got[m] = False
                out[missing[got]] = dst[got]
            missing = missing[m]
            missed.append(missing)
            if not missing.size:
                break
        defaulted = None
        if missing.size:
            out[missing] = tab.default
            unique_defaulted = np.zeros(u, bool)
            unique_defaulted[missing] = True
            defaulted = unique_defaulted[inverse]
            with self._lock:
                tab.defaults_returned += int(np.count_nonzero(defaulted))
        # Upward insertion, bottom up: a tier gets the rows that it missed and a tier below held.
        for g, below in reversed(list(zip(path, missed))):
            if below is missing or not below.size:
                continue
            pos = below[~np.isin(below, missing, assume_unique=True)] if missing.size else below
            if pos.size:
                if g is self._g_volatile:
                    self._insert_volatile(tab, ukeys[pos], out[pos], epoch)
                elif g.which == "cache" and mcfg.embedding_cache_type == "dynamic":
                    self._insert_cache(g.tier, tab, ukeys[pos], out[pos], epoch,
                                       sync=(1.0 - missed[0].shape[0] / u) < mcfg.hit_rate_threshold)
        if return_defaulted:
            return out[inverse], (defaulted if defaulted is not None else np.zeros(n, bool))
        return out[inverse]

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
        if self._worker is None or not self._worker.is_alive():
            self._worker = threading.Thread(target=self._insert_worker, name="hps-cache-insert", daemon=True)
            self._worker.start()
            _with_inserter.add(self)
        try:
            self._queue.put_nowait((cache, tab, k, v, epoch))
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

    def _stop_inserter(self) -> None:
        """Stops the background cache inserter: queued insertions are dropped (the rows stay in
        the tiers below), the one running ends, the thread is joined."""
        self._closed = True
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
        overwrites the rows it already holds (a ``static`` cache cannot be updated: error).
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
        if cache is not None and mcfg.embedding_cache_type == "static":
            raise HPSLookupError(f"HPS update: model {model!r} uses embedding_cache_type 'static', "
                                 "which cannot be updated; use 'dynamic'")
        with self._writing():
            if self.persistent is not None and not self.persistent.read_only:
                self.persistent.insert(tab.name, keys, vectors)
            if self.volatile is not None:
                if self._g_volatile.call(lambda: self.volatile.insert(tab.name, keys, vectors),
                                         fallback=False) is False:
                    self._g_volatile.forget(tab.name, keys)
            if cache is not None:
                cache.update(tab.name, keys, vectors)
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
                "cache_capacity": tab.cache_capacity}

    def stats(self) -> dict:
        """Per-tier hits, misses, errors, calls, mean latency, inserts, ``writes_refused`` (writes a
        full tier refused, such as a Redis at ``maxmemory``) and availability (``available``,
        ``outages``, ``down_seconds`` of the current outage, ``last_error``: the cause of the last
        failure, such as ``Redis at ...: TimeoutError: Timeout reading from socket``), plus per-table
        counts (lookups, keys, defaults returned, sync/async cache inserts) and the config report."""
        with self._lock:
            tiers = {k: v.as_dict() for k, v in self._stats.items()}
            tiers["cache"]["kind"] = ",".join(sorted(self._caches)) or "disabled"
            tiers["volatile"]["kind"] = getattr(self.volatile, "kind", "disabled")
            tiers["persistent"]["kind"] = getattr(self.persistent, "kind", "disabled")
            tiers["volatile"]["bad_values"] = getattr(self.volatile, "bad_values", 0)
            tiers["persistent"]["bad_values"] = getattr(self.persistent, "bad_values", 0)
            tables = {f"{t.model}/{t.index}": {"name": t.name, "dim": t.dim, "rows": t.rows,
                                               "cache_capacity": t.cache_capacity, "lookups": t.lookups,
                                               "keys": t.keys, "defaults_returned": t.defaults_returned,
                                               "sync_cache_inserts": t.sync_inserts,
                                               "async_cache_inserts": t.async_inserts}
                      for t in self._tables.values()}
            return {"tiers": tiers, "tables": tables, "config_report": list(self.report),
                    "config": self.config.source}

    def close(self) -> None:
        """Stops the background inserter and closes the tiers (idempotent)."""
        if getattr(self, "_did_close", False):
            return
        self._did_close = True
        self._stop_inserter()
        for tier in [getattr(self, "volatile", None), getattr(self, "persistent", None),
                     *getattr(self, "_caches", {}).values()]:
            if tier is not None:
                try:
                    tier.close()
                except Exception:
                    pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
