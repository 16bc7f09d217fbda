"""A Redis that is full (``maxmemory`` reached, policy ``noeviction``) refuses the write-back of rows
found in RocksDB (``cache_missed_embeddings``) with an OOM reply. That is no outage: reads still
work. Lookups must stay exact, the refusal must be counted and logged once, and the tier must stay
in use for what it holds."""
from __future__ import annotations

import logging

import numpy as np

from embedlab.hps import ParameterServer

from hps_testing import OneNodeCluster, Table, needs_native_tiers

pytestmark = needs_native_tiers


def test_full_redis_refuses_write_back_lookups_stay_exact(tmp_path, caplog):
    c = OneNodeCluster().start()
    try:
        tab = Table(tmp_path / "t", n=4000, dim=16, rng=7)
        cfg = {"volatile_db": {"type": "redis_cluster", "address": c.address, "password": c.password,
                               "num_partitions": 4, "max_batch_size": 256, "cache_missed_embeddings": True},
               "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
               "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [16],
                           "gpucache": False, "default_value_for_each_table": [-2.0]}]}
        ps = ParameterServer(cfg, retry_seconds=0.2)
        node = c.nodes[0].client()
        node.flushall()                       # Redis starts empty: every row is only in RocksDB
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", str(used + 64 * 1024))   # room for a few hundred rows only
        with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
            for i in range(0, 4000, 500):
                q = np.concatenate([tab.keys[i:i + 500], tab.absent_keys(3)])
                got = ps.lookup("m", 0, q)
                np.testing.assert_array_equal(got, tab.expect(q, default=-2.0))
        st = ps.stats()["tiers"]["volatile"]
        assert st["available"] is True and st["outages"] == 0, st
        assert st["writes_refused"] > 0 and "OOM" in st["last_error"], st
        assert 0 < node.dbsize()                       # what fitted was written back ...
        # ... and is read from Redis again
        hits = st["hits"]
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        assert ps.stats()["tiers"]["volatile"]["hits"] > hits
        msgs = [r.getMessage() for r in caplog.records if r.name == "embedlab.hps"]
        assert sum("refused" in m for m in msgs) == 1, msgs     # logged once, not per lookup
        ps.close()
    finally:
        c.stop()


def test_update_refused_by_full_redis_leaves_no_stale_row(tmp_path):
    """An online update that a full Redis refuses: RocksDB takes the new rows, and Redis, which
    still holds the old ones, must not answer them any more."""
    c = OneNodeCluster().start()
    try:
        tab = Table(tmp_path / "t", n=500, dim=8, rng=11)
        cfg = {"volatile_db": {"type": "redis_cluster", "address": c.address, "password": c.password,
                               "num_partitions": 4, "cache_missed_embeddings": True},
               "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
               "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
                           "gpucache": False}]}
        ps = ParameterServer(cfg, retry_seconds=0.2)
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)   # all written back
        node = c.nodes[0].client()
        assert node.dbsize() > 0
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", str(int(node.info("memory")["used_memory"]) // 2))   # over it: every write refused
        keys = tab.keys[:100]
        new = -tab.vectors[:100] - 1.0
        ps.update("m", 0, keys, new)
        st = ps.stats()["tiers"]["volatile"]
        assert st["writes_refused"] >= 1 and st["available"] is True, st
        np.testing.assert_array_equal(ps.lookup("m", 0, keys), new)           # not Redis's old rows
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys[100:]), tab.vectors[100:])
        ps.close()
    finally:
        c.stop()
