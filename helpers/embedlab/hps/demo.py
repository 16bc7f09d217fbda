"""The tiers at work (notebook 05, part 7): cache hit rate against cache size on a Zipf stream, and
one stream through cache -> hash_map, cache -> Redis -> RocksDB (Redis killed halfway) and RocksDB
alone, with per-batch latency and an exactness check against the sparse files.

No TensorFlow here.
"""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..sparse_model import read_sparse_model
from .server import ParameterServer

log = logging.getLogger("embedlab.hps")

__all__ = ["zipf_stream", "hit_rate_vs_cache_size", "top_k_hit_rate", "StreamRun", "run_stream", "tier_walk"]


def zipf_stream(keys: np.ndarray, n_batches: int, batch: int, alpha: float = 1.05, seed: int = 0) -> list:
    """``n_batches`` batches of ``batch`` keys drawn from ``keys`` with Zipf(alpha) popularity
    (a random key order decides which keys are popular)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(keys))
    ranks = np.arange(1, len(keys) + 1, dtype=np.float64)
    p = ranks ** -alpha
    p /= p.sum()
    return [keys[order[rng.choice(len(keys), size=batch, p=p)]] for _ in range(n_batches)]


def _model(name, sparse_dir, dim, **kw):
    m = {"model": name, "sparse_files": [str(Path(sparse_dir).resolve())], "embedding_vecsize_per_table": [dim],
         "embedding_table_names": ["t"], "default_value_for_each_table": [0.0]}
    m.update(kw)
    return m


def hit_rate_vs_cache_size(sparse_dir, stream, fractions=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
                           warmup_batches: int = 5) -> dict:
    """Cache hit rate over the stream (after ``warmup_batches``) for each ``gpucacheper`` in
    ``fractions``; the volatile tier is a ``hash_map`` holding every row, insertions synchronous.

    Returns:
        ``{"fraction": [...], "hit_rate": [...], "capacity": [...]}``.
    """
    sm = read_sparse_model(sparse_dir)
    out = {"fraction": [], "hit_rate": [], "capacity": []}
    for f in fractions:
        cfg = {"volatile_db": {"type": "hash_map"}, "persistent_db": {"type": "disabled"},
               "models": [_model("zipf", sparse_dir, sm.dim, gpucache=True, gpucacheper=float(f),
                                 hit_rate_threshold=1.5)]}
        with ParameterServer(cfg) as ps:
            for b in stream[:warmup_batches]:
                ps.lookup("zipf", 0, b)
            s0 = ps.stats()["tiers"]["cache"]
            for b in stream[warmup_batches:]:
                ps.lookup("zipf", 0, b)
            s1 = ps.stats()["tiers"]["cache"]
            hits, misses = s1["hits"] - s0["hits"], s1["misses"] - s0["misses"]
            out["fraction"].append(float(f))
            out["hit_rate"].append(hits / max(1, hits + misses))
            out["capacity"].append(ps.table_info("zipf", 0)["cache_capacity"])
    return out


def top_k_hit_rate(stream, capacities, warmup_batches: int = 5) -> list:
    """The hit rate a cache of each capacity would reach if it held the stream's most frequent
    keys from the start (a frequency oracle no online cache can beat on an i.i.d. stream)."""
    keys = np.concatenate(stream[warmup_batches:])
    _, counts = np.unique(keys, return_counts=True)
    cum = np.concatenate([[0], np.cumsum(np.sort(counts)[::-1])]) / len(keys)
    return [float(cum[min(int(c), len(cum) - 1)]) for c in capacities]


@dataclass
class StreamRun:
    """Per-batch latency (ms) and exactness of one stream through one tier stack."""
    name: str
    latency_ms: list = field(default_factory=list)
    exact: list = field(default_factory=list)
    events: dict = field(default_factory=dict)      # batch index -> what happened ("redis killed", ...)
    stats: dict = field(default_factory=dict)


def run_stream(name: str, ps: ParameterServer, model: str, stream, oracle_vectors, key_to_row, on_batch=None) -> StreamRun:
    """Looks every batch up, timing it and comparing it with the sparse file's rows."""
    run = StreamRun(name)
    for i, b in enumerate(stream):
        if on_batch is not None:
            ev = on_batch(i)
            if ev:
                run.events[i] = ev
        t0 = time.perf_counter()
        got = ps.lookup(model, 0, b)
        run.latency_ms.append(1e3 * (time.perf_counter() - t0))
        run.exact.append(bool(np.array_equal(got, oracle_vectors[key_to_row(b)])))
    run.stats = ps.stats()
    return run


def tier_walk(sparse_dir, stream, workdir=None, gpucacheper: float = 0.05, kill_at: float = 0.5,
              restart_at: float | None = 0.8, use_native: bool = True) -> list:
    """The same stream through three stacks: cache -> hash_map; cache -> Redis -> RocksDB with Redis
    killed at ``kill_at`` of the stream (and restarted at ``restart_at``); RocksDB alone.

    Redis is a local ``redis-server`` started (and stopped) here, on 127.0.0.1 with a password.
    ``use_native=False`` leaves out the compiled cache and hash map (for builds without them).

    Returns:
        A list of :class:`StreamRun`.
    """
    from .redis import start_redis
    sm = read_sparse_model(sparse_dir)
    keys, vecs = sm.keys, sm.vectors
    order = np.argsort(keys)
    sorted_keys = keys[order]

    def key_to_row(b):
        return order[np.searchsorted(sorted_keys, b)]

    work = Path(workdir or tempfile.mkdtemp(prefix="embedlab-hps-walk-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    cache = dict(gpucache=use_native, gpucacheper=gpucacheper)
    if use_native:
        cfg = {"volatile_db": {"type": "hash_map"}, "persistent_db": {"type": "disabled"},
               "models": [_model("walk", sparse_dir, sm.dim, **cache)]}
        with ParameterServer(cfg) as ps:
            runs.append(run_stream("cache -> hash_map", ps, "walk", stream, vecs, key_to_row))
    r = start_redis()
    try:
        cfg = {"volatile_db": {"type": "redis_cluster", "address": r.address, "password": r.password,
                               "num_partitions": 8, "initial_cache_rate": 1.0, "cache_missed_embeddings": True},
               "persistent_db": {"type": "rocks_db", "path": str(work / "rocksdb_redis")},
               "models": [_model("walk", sparse_dir, sm.dim, **cache)]}
        n = len(stream)
        kill_i, restart_i = int(kill_at * n), (int(restart_at * n) if restart_at is not None else None)

        def on_batch(i):
            if i == kill_i:
                r.kill()
                return "redis killed"
            if restart_i is not None and i == restart_i:
                r.start()
                return "redis restarted (empty)"
            return None
        # retry_seconds=0: every lookup tries Redis again while it is down (a refused connection
        # costs well under a millisecond here), so the first lookup after the restart finds it
        # back, however fast the batches go. A server would wait longer between tries.
        with ParameterServer(cfg, retry_seconds=0.0) as ps:
            runs.append(run_stream("cache -> Redis -> RocksDB" if use_native else "Redis -> RocksDB",
                                   ps, "walk", stream, vecs, key_to_row, on_batch))
    finally:
        r.stop()
    cfg = {"volatile_db": {"type": "disabled"}, "persistent_db": {"type": "rocks_db", "path": str(work / "rocksdb_only")},
           "models": [_model("walk", sparse_dir, sm.dim, gpucache=False)]}
    with ParameterServer(cfg) as ps:
        runs.append(run_stream("RocksDB only", ps, "walk", stream, vecs, key_to_row))
    return runs
