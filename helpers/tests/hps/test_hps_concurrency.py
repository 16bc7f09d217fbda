"""ParameterServer under concurrent callers, with a real redis-server and a real RocksDB.

* A lookup waiting on a hung Redis (SIGSTOP: connections accepted, no reply) does not hold up a
  concurrent lookup that the embedding cache answers.
* Lookups racing updates never return a row older than the last update that finished before
  they started, nor newer than the last one started before they returned, and after the race
  no tier holds an old row of any key: upward insertions (into the cache, synchronous and in
  the background, and into Redis from RocksDB) never bring an overwritten row back.
* The counters of stats() add up to the work done by all the threads.
"""
from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from embedlab.hps import ParameterServer
from embedlab.services.redis_server import RedisServer

from hps_testing import Table, needs_native_tiers

pytestmark = needs_native_tiers


@pytest.fixture()
def redis_node():
    r = RedisServer().start()
    yield r
    if r.proc is not None and r.proc.poll() is None:
        r.proc.send_signal(signal.SIGCONT)
    r.stop()


def _config(tab, redis_node, tmp_path, **model):
    return {"volatile_db": {"type": "redis_cluster", "address": redis_node.address, "password": redis_node.password,
                            "num_partitions": 3, "max_batch_size": 256, "cache_missed_embeddings": True,
                            "initial_cache_rate": model.pop("initial_cache_rate", 1.0)},
            "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
            "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [tab.dim],
                        "gpucache": True, "default_value_for_each_table": [-1.0], **model}]}


def test_hung_redis_does_not_block_a_lookup_the_cache_answers(redis_node, tmp_path, rng):
    tab = Table(tmp_path / "t", n=500, dim=8, rng=rng)
    ps = ParameterServer(_config(tab, redis_node, tmp_path, embedding_cache_type="static"),
                         gpu_cache=False)     # inspects the host cache
    try:
        timeout = ps.volatile.socket_timeout
        # The keys the static cache holds (a key whose set was full at start-up is not in it).
        miss = ps._caches["static"].find("hps_et.m.sparse_embedding0", tab.keys, np.empty((500, 8), np.float32))
        hot = np.delete(tab.keys, miss)
        assert hot.size > 400
        before = ps.stats()["tiers"]["volatile"]["calls"]
        assert np.array_equal(ps.lookup("m", 0, hot), tab.expect(hot))
        assert ps.stats()["tiers"]["volatile"]["calls"] == before          # the cache answered alone
        absent = tab.absent_keys(5)           # miss the cache: Redis is asked
        in_redis = threading.Event()
        real_find = ps.volatile.find

        def find(table, keys, out):           # the real Redis call, with its start made visible
            in_redis.set()
            return real_find(table, keys, out)
        ps.volatile.find = find
        slow: dict = {}

        def slow_lookup():
            t0 = time.monotonic()
            slow["rows"] = ps.lookup("m", 0, absent)
            slow["seconds"] = time.monotonic() - t0
        redis_node.proc.send_signal(signal.SIGSTOP)
        th = threading.Thread(target=slow_lookup, daemon=True)
        th.start()
        assert in_redis.wait(10), "the lookup of absent keys never reached Redis"
        t0 = time.monotonic()
        for _ in range(5):
            q = rng.choice(hot, 100)
            assert np.array_equal(ps.lookup("m", 0, q), tab.expect(q))
        fast = time.monotonic() - t0
        # The cache answered five lookups while the other one still waited for Redis.
        assert th.is_alive(), (f"the cache-hit lookups took {fast:.2f} s and returned only after the lookup "
                               f"waiting on the hung Redis had ended")
        assert fast < timeout / 2, f"five cache-hit lookups took {fast:.2f} s next to a hung Redis"
        th.join(10 * timeout)
        redis_node.proc.send_signal(signal.SIGCONT)
        assert not th.is_alive()
        assert slow["seconds"] >= 0.8 * timeout      # it did wait for the socket timeout
        assert np.array_equal(slow["rows"], np.full((5, 8), -1.0, np.float32))
        st = ps.stats()["tiers"]["volatile"]
        assert st["available"] is False and "Timeout" in st["last_error"]
    finally:
        redis_node.proc.send_signal(signal.SIGCONT)
        ps.close()


def _rows(keys: np.ndarray, version: np.ndarray, dim: int) -> np.ndarray:
    """Row of key k at a version: column 0 the version, the others a function of the key (so a
    row of another key, or a torn one, is seen)."""
    base = (keys.astype(np.float64) % 9973)[:, None] + np.arange(1, dim, dtype=np.float64)[None, :] / 8
    return np.concatenate([version[:, None].astype(np.float32), base.astype(np.float32)], axis=1)


@pytest.mark.parametrize("threshold", [0.5, 1.5])
def test_lookups_racing_updates_never_stale(redis_node, tmp_path, rng, threshold):
    n, dim = 400, 6
    tab = Table(tmp_path / "t", n=n, dim=dim, rng=rng)
    keys = tab.keys
    from embedlab.sparse_model import write_sparse_model
    write_sparse_model(tab.path, keys, _rows(keys, np.zeros(n), dim))
    # Half of the rows start in Redis, a cache for a third of them: rows move up on every miss.
    ps = ParameterServer(_config(tab, redis_node, tmp_path, gpucacheper=0.3, initial_cache_rate=0.5,
                                 hit_rate_threshold=threshold), retry_seconds=0.0,
                         gpu_cache=False)     # inspects the host cache
    real_insert = ps.volatile.insert

    delays = np.random.default_rng(rng.integers(2**31))

    def insert(table, k, v):                  # a slow network: writes land 0-10 ms later
        time.sleep(0.01 * delays.random())
        return real_insert(table, k, v)
    ps.volatile.insert = insert
    started = np.zeros(n, np.int64)       # version of the last update begun, per key
    done = np.zeros(n, np.int64)          # version of the last update finished, per key
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[str] = []
    work = {"lookups": 0, "keys": 0, "unique": 0}
    seeds = rng.integers(0, 2**31, 4)

    def writer(seed):
        r = np.random.default_rng(seed)
        version = 0
        while not stop.is_set() and version < 200:
            version += 1
            pos = r.choice(n, int(r.integers(1, 40)), replace=False)
            with lock:
                started[pos] = version
            ps.update("m", 0, keys[pos], _rows(keys[pos], np.full(pos.size, version), dim))
            with lock:
                done[pos] = version

    def reader(seed):
        r = np.random.default_rng(seed)
        while not stop.is_set():
            pos = r.integers(0, n, int(r.integers(1, 120)))
            with lock:
                low = done[pos].copy()
            got = ps.lookup("m", 0, keys[pos])
            with lock:
                high = started[pos].copy()
                work["lookups"] += 1
                work["keys"] += pos.size
                work["unique"] += np.unique(pos).size
            v = got[:, 0].astype(np.int64)
            if not np.array_equal(got[:, 1:], _rows(keys[pos], v, dim)[:, 1:]):
                errors.append("a row of another key")
            elif np.any(v < low):
                errors.append(f"stale: version {v[v < low][:3]} after {low[v < low][:3]} was written")
            elif np.any(v > high):
                errors.append("a version never written")

    threads = [threading.Thread(target=writer, args=(seeds[0],))] + \
              [threading.Thread(target=reader, args=(s,)) for s in seeds[1:]]
    for t in threads:
        t.start()
    threads[0].join(60)
    stop.set()
    for t in threads[1:]:
        t.join(60)
    try:
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors[:5]
        assert done.max() > 0 and work["lookups"] > 20
        final = _rows(keys, done, dim)
        # Rows read while an update ran were not moved up; with no update now, they are.
        assert np.array_equal(ps.lookup("m", 0, keys), final)
        ps.wait_background()
        # No tier holds an overwritten row: each answers the last version or nothing.
        for which, tier in (("cache", ps._caches["dynamic"]), ("volatile", ps.volatile)):
            out = np.zeros((n, dim), np.float32)
            miss = tier.find("hps_et.m.sparse_embedding0", keys, out)
            held = np.ones(n, bool)
            held[miss] = False
            assert held.any(), which
            assert np.array_equal(out[held], final[held]), f"the {which} tier holds old rows"
        for _ in range(2):                    # and through lookups, the cache warm
            assert np.array_equal(ps.lookup("m", 0, keys), final)
        st = ps.stats()
        t = st["tables"]["m/0"]
        assert t["lookups"] == work["lookups"] + 3 and t["keys"] == work["keys"] + 3 * n
        c = st["tiers"]["cache"]
        assert c["calls"] == work["lookups"] + 3
        assert c["hits"] + c["misses"] == work["unique"] + 3 * n
        assert t["defaults_returned"] == 0
    finally:
        ps.close()
