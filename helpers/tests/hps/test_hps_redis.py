"""The redis_cluster tier against a real redis-server (single node and a 3-node cluster) that the
tests start, kill and restart."""
import logging
import threading
import time

import numpy as np
import pytest

from embedlab.hps import ParameterServer
from embedlab.hps.config import VolatileDBConfig
from embedlab.hps.tiers import RedisTier, TierError

from hps_testing import Table, needs_native_tiers, redis_cluster, redis_server  # noqa: F401 (fixtures)


def _tier(r, **kw):
    kw.setdefault("num_partitions", 5)
    return RedisTier(VolatileDBConfig(type="redis_cluster", address=r.address, password=r.password, **kw))


@pytest.mark.parametrize("server", ["redis_server", "redis_cluster"])
def test_redis_tier_against_oracle(server, request, tmp_path, rng):
    r = request.getfixturevalue(server)
    tab = Table(tmp_path / "t", n=int(rng.integers(500, 3000)), dim=int(rng.choice([3, 16, 64])), rng=rng)
    name = f"hps_et.test{rng.integers(1 << 30)}.t"
    t = _tier(r, max_batch_size=int(rng.integers(50, 400)))     # several pipelines per call
    assert t.cluster == (server == "redis_cluster")
    t.add_table(name, tab.dim)
    t.insert(name, tab.keys, tab.vectors)
    assert t.size(name) == len(tab.keys)
    # rows are spread over num_partitions hashes, key k in partition k mod 5
    client = t.raw_client()
    lens = [client.hlen(f"{name}/p{p}") for p in range(5)]
    assert lens == [int(np.sum(np.mod(tab.keys, 5) == p)) for p in range(5)]
    q = tab.query(1500, absent=100)
    out = np.full((len(q), tab.dim), np.nan, np.float32)
    missing = t.find(name, q, out)
    present = np.array([int(k) in tab.oracle for k in q])
    assert np.array_equal(missing, np.flatnonzero(~present))
    assert np.array_equal(out[present], tab.expect(q)[present])
    assert np.isnan(out[~present]).all()
    assert t.erase(name, tab.keys[:7]) == 7 and t.size(name) == len(tab.keys) - 7
    t.drop(name)
    t.close()


def test_wrong_length_value_is_a_reported_miss(redis_server, tmp_path, caplog):
    tab = Table(tmp_path / "t", n=50, dim=8)
    t = _tier(redis_server)
    t.add_table("hps_et.bad.t", 8)
    t.insert("hps_et.bad.t", tab.keys, tab.vectors)
    k = int(tab.keys[3])
    t.raw_client().hset(f"hps_et.bad.t/p{k % 5}", k.to_bytes(8, "little", signed=True), b"\x01" * 31)
    out = np.zeros((5, 8), np.float32)
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        missing = t.find("hps_et.bad.t", tab.keys[:5], out)
        t.find("hps_et.bad.t", tab.keys[:5], out)
    assert missing.tolist() == [3] and t.bad_values == 2
    assert sum("wrong length" in r.message for r in caplog.records) == 1     # logged once per table
    t.drop("hps_et.bad.t")


def test_password_and_address_errors(redis_server):
    with pytest.raises(TierError, match="authentication"):
        RedisTier(VolatileDBConfig(type="redis_cluster", address=redis_server.address, password="wrong"))
    with pytest.raises(TierError, match="volatile_db.address"):
        RedisTier(VolatileDBConfig(type="redis_cluster", address="127.0.0.1:1", password="x"))
    # no password at all: the server refuses (it was started with requirepass)
    with pytest.raises(TierError):
        RedisTier(VolatileDBConfig(type="redis_cluster", address=redis_server.address, password=""))


@needs_native_tiers
def test_redis_killed_under_load_lookups_stay_exact(tmp_path, caplog):
    from embedlab.services.redis_server import start_redis
    r = start_redis()
    try:
        tab = Table(tmp_path / "t", n=3000, dim=16)
        cfg = {"volatile_db": {"type": "redis_cluster", "address": r.address, "password": r.password,
                               "num_partitions": 4, "max_batch_size": 512, "cache_missed_embeddings": True},
               "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
               "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [16],
                           "gpucache": True, "gpucacheper": 0.1, "default_value_for_each_table": [-1.0]}]}
        ps = ParameterServer(cfg, retry_seconds=0.2)
        errors, done, results = [], threading.Event(), [0]

        def load(seed):
            rng = np.random.default_rng(seed)
            while not done.is_set():
                q = tab.query(int(rng.integers(1, 600)), absent=3)
                try:
                    got = ps.lookup("m", 0, q)
                    if not np.array_equal(got, tab.expect(q, -1.0)):
                        errors.append("wrong rows")
                    results[0] += 1
                except Exception as e:  # noqa: BLE001 (the test reports it)
                    errors.append(repr(e))

        with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
            threads = [threading.Thread(target=load, args=(s,)) for s in tab.rng.integers(0, 2**63, 2)]
            for th in threads:
                th.start()
            time.sleep(0.5)
            r.kill()                                   # crash, under load
            time.sleep(1.0)
            during = ps.stats()["tiers"]["volatile"]
            r.start()                                  # back, empty (nothing persisted)
            time.sleep(1.0)
            done.set()
            for th in threads:
                th.join()
        assert not errors, errors[:3]
        assert results[0] > 10
        st = ps.stats()["tiers"]
        assert during["available"] is False and during["errors"] > 0 and during["outages"] == 1
        assert st["volatile"]["available"] is True and st["volatile"]["outages"] == 1
        assert sum("unavailable" in rec.message for rec in caplog.records) == 1     # logged once
        assert sum("is back" in rec.message for rec in caplog.records) == 1
        # reconnected: rows found in RocksDB were written back into the restarted Redis
        assert r.client().dbsize() > 0
        assert ps.stats()["tables"]["m/0"]["defaults_returned"] > 0
        assert st["cache"]["hits"] > 0 and st["persistent"]["hits"] > 0     # cache + RocksDB answered
        ps.close()
    finally:
        r.stop()


def test_cluster_node_killed_lookups_stay_exact(redis_cluster, tmp_path):
    tab = Table(tmp_path / "t", n=2000, dim=8)
    cfg = {"volatile_db": {"type": "redis_cluster", "address": redis_cluster.address,
                           "password": redis_cluster.password, "num_partitions": 6},
           "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
           "models": [{"model": "c", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
                       "gpucache": False}]}
    ps = ParameterServer(cfg, retry_seconds=0.1)
    q = tab.query(1000, absent=5)
    assert np.array_equal(ps.lookup("c", 0, q), tab.expect(q))
    assert ps.stats()["tiers"]["volatile"]["hits"] > 0
    redis_cluster.nodes[1].kill()
    for _ in range(3):
        assert np.array_equal(ps.lookup("c", 0, q), tab.expect(q))
        time.sleep(0.15)
    assert ps.stats()["tiers"]["volatile"]["errors"] > 0
    ps.close()


def test_rows_updated_during_an_outage_are_not_served_stale(tmp_path):
    import signal

    from embedlab.services.redis_server import start_redis
    r = start_redis()
    try:
        tab = Table(tmp_path / "t", n=200, dim=4)
        cfg = {"volatile_db": {"type": "redis_cluster", "address": r.address, "password": r.password},
               "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
               "models": [{"model": "s", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [4],
                           "gpucache": False}]}
        ps = ParameterServer(cfg, retry_seconds=1.0)
        q = tab.keys[:10]
        assert np.array_equal(ps.lookup("s", 0, q), tab.vectors[:10])
        r.proc.send_signal(signal.SIGSTOP)          # Redis hangs, keeping the old rows
        assert np.array_equal(ps.lookup("s", 0, q), tab.vectors[:10])   # times out: RocksDB answers
        assert ps.stats()["tiers"]["volatile"]["available"] is False
        new = np.full((10, 4), 7.0, np.float32)
        ps.update("s", 0, q, new)                   # Redis skipped while down; RocksDB gets the rows
        r.proc.send_signal(signal.SIGCONT)          # back, still holding the old rows
        time.sleep(1.1)                             # past retry_seconds: Redis is tried again
        assert np.array_equal(ps.lookup("s", 0, q), new)
        assert ps.stats()["tiers"]["volatile"]["available"] is True
        ps.close()
    finally:
        r.proc.send_signal(signal.SIGCONT)
        r.stop()
