"""Shared pieces of the HPS tests: random tables with a NumPy dict oracle, Redis fixtures."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

import reference
from embedlab.sparse_model import write_sparse_model

_tables_made: dict[str, int] = {}


def _test_rng() -> np.random.Generator:
    """A Generator from the run's seed, the running test's id and how many this test drew before
    (so a test replays alone with EMBEDLAB_TEST_SEED, and its tables differ from each other)."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    n = _tables_made[test] = _tables_made.get(test, -1) + 1
    return np.random.default_rng([reference.RUN_SEED, zlib.crc32(test.encode()), n])


class Table:
    """A random table (unique int64 keys, negative ones included) written as key/emb_vector,
    with a dict oracle. ``rng``: a Generator or a seed; by default one from the run's seed and
    the running test (see ``_test_rng``)."""

    def __init__(self, path, n=2000, dim=16, rng=None, key_space=2**40):
        self.rng = _test_rng() if rng is None else np.random.default_rng(rng)
        k = np.unique(self.rng.integers(-key_space, key_space, 2 * n + 16, dtype=np.int64))
        self.keys = self.rng.permutation(k)[:n]
        self.vectors = self.rng.standard_normal((n, dim)).astype(np.float32)
        self.dim = dim
        self.path = write_sparse_model(path, self.keys, self.vectors)
        self.oracle = {int(k): v for k, v in zip(self.keys, self.vectors)}

    def absent_keys(self, m):
        out = []
        while len(out) < m:
            k = int(self.rng.integers(-2**62, 2**62))
            if k not in self.oracle:
                out.append(k)
        return np.array(out, np.int64)

    def query(self, m, absent=0, dup=True):
        """m present keys (with duplicates) plus `absent` keys found nowhere, shuffled."""
        q = self.keys[self.rng.integers(0, len(self.keys), m)] if dup else self.rng.choice(self.keys, m, replace=False)
        q = np.concatenate([q, self.absent_keys(absent)])
        self.rng.shuffle(q)
        return q

    def expect(self, q, default=0.0):
        return np.stack([self.oracle.get(int(k), np.full(self.dim, default, np.float32)) for k in q]) \
            if len(q) else np.zeros((0, self.dim), np.float32)


def native_tiers() -> bool:
    from embedlab import core
    c = core()
    return hasattr(c, "EmbeddingCache") and hasattr(c, "HashMapStore")


needs_native_tiers = pytest.mark.skipif(
    not native_tiers(), reason="this build has no compiled EmbeddingCache / HashMapStore (csrc/core/embedding_cache.h, "
                               "hash_map_store) yet")


@pytest.fixture(scope="module")
def redis_server():
    from embedlab.services.redis_server import start_redis
    r = start_redis()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def redis_cluster():
    from embedlab.services.redis_server import start_redis_cluster
    c = start_redis_cluster(3)
    yield c
    c.stop()


# ---- Redis outages under lookups ---------------------------------------------------------------

def wait_for(pred, timeout: float, what: str, step: float = 0.05):
    """Polls pred() until it is true; fails the test naming `what` after `timeout` seconds."""
    import time
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def cluster_ok(nodes) -> bool:
    return all("cluster_state:ok" in n.cli("cluster", "info", check=False) for n in nodes if n.running)


class OneNodeCluster:
    """A Redis cluster of one master (cluster mode, every slot assigned to it); ``redis-cli
    --cluster create`` needs three, so the slots are added by hand. Same interface as
    :class:`embedlab.services.redis_server.RedisCluster` (nodes, address, password, start, stop)."""

    def __init__(self):
        from embedlab.services.redis_server import RedisServer
        self.nodes = [RedisServer(cluster=True)]
        self.password = self.nodes[0].password

    @property
    def address(self) -> str:
        return self.nodes[0].address

    def start(self):
        n = self.nodes[0].start()
        n.cli("cluster", "addslotsrange", "0", "16383")
        wait_for(lambda: cluster_ok(self.nodes), 20, "the one-node cluster to reach cluster_state:ok")
        return self

    def stop(self):
        self.nodes[0].stop()


class LookupLoad:
    """Threads that look up random keys (present with duplicates, and absent ones) through a
    ParameterServer without pause and check every answer against the table's oracle. Records
    wrong answers, exceptions, and each lookup's duration."""

    def __init__(self, ps, tab, model: str, threads: int = 2, keys=None, default: float = 0.0):
        import threading
        self.ps, self.tab, self.model, self.default = ps, tab, model, default
        self.keys = tab.keys if keys is None else keys
        self.errors: list[str] = []
        self.durations: list[float] = []
        self.count = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._seeds = tab.rng.integers(0, 2**63, threads)
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)]

    def _run(self, i):
        import time
        rng = np.random.default_rng(self._seeds[i])
        while not self._stop.is_set():
            q = np.concatenate([self.keys[rng.integers(0, len(self.keys), int(rng.integers(1, 400)))],
                                self.tab.absent_keys(2)])
            t0 = time.monotonic()
            try:
                got = self.ps.lookup(self.model, 0, q)
                ok = np.array_equal(got, self.tab.expect(q, self.default))
                err = None if ok else f"wrong rows for {len(q)} keys"
            except Exception as e:  # noqa: BLE001 (the test reports it)
                err = f"{type(e).__module__}.{type(e).__name__}: {e}"
            with self._lock:
                self.durations.append(time.monotonic() - t0)
                self.count += 1
                if err:
                    self.errors.append(err)

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self._threads), "a lookup thread hangs"

    def wait_lookups(self, n: int, timeout: float = 30):
        """Waits until n more lookups have completed."""
        start = self.count
        wait_for(lambda: self.count >= start + n, timeout, f"{n} more lookups")
