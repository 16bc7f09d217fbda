"""Shared pieces of the HPS tests: random tables with a NumPy dict oracle, Redis fixtures."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab.sparse_model import write_sparse_model


class Table:
    """A random table (unique int64 keys, negative ones included) written as key/emb_vector,
    with a dict oracle."""

    def __init__(self, path, n=2000, dim=16, rng=None, key_space=2**40):
        self.rng = np.random.default_rng(rng)
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
    from embedlab._native import core
    c = core()
    return hasattr(c, "EmbeddingCache") and hasattr(c, "HashMapStore")


needs_native_tiers = pytest.mark.skipif(
    not native_tiers(), reason="this build has no compiled EmbeddingCache / HashMapStore (csrc/core/embedding_cache.h, "
                               "hash_map_store) yet")


@pytest.fixture(scope="module")
def redis_server():
    from embedlab.hps.redis import start_redis
    r = start_redis()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def redis_cluster():
    from embedlab.hps.redis import start_redis_cluster
    c = start_redis_cluster(3)
    yield c
    c.stop()
