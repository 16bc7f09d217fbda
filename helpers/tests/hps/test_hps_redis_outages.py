"""The redis_cluster tier failing under lookups, with real redis-server processes in cluster mode on
127.0.0.1: every node killed (a cluster of one and of three), one node of three killed, a node
restarted empty, a node that accepts connections but never answers (SIGSTOP), a wrong password
after a restart. Through each: every answer exact (cache -> RocksDB -> default), no lookup hangs,
stats() naming the outage, and the tier back in use once Redis is."""
from __future__ import annotations

import logging
import signal

import numpy as np
import pytest

from embedlab.hps import ParameterServer
from embedlab.services.redis_server import RedisCluster

from hps_testing import LookupLoad, OneNodeCluster, Table, cluster_ok, needs_native_tiers, wait_for

pytestmark = needs_native_tiers

def _running(c):
    """Starts cluster c, yields it, then resumes any SIGSTOPped node so that stop() can end it."""
    c.start()
    yield c
    for n in c.nodes:
        if n.proc is not None and n.proc.poll() is None:
            n.proc.send_signal(signal.SIGCONT)
    c.stop()


@pytest.fixture(params=["one_node", "three_nodes"])
def cluster(request):
    yield from _running(OneNodeCluster() if request.param == "one_node" else RedisCluster(3))


@pytest.fixture()
def three(request):
    yield from _running(RedisCluster(3))


@pytest.fixture()
def one():
    c = OneNodeCluster()
    c.start()
    yield c
    c.stop()


def _server(c, tmp_path, gpucache=False):
    tab = Table(tmp_path / "t", n=3000, dim=8)
    cfg = {"volatile_db": {"type": "redis_cluster", "address": c.address, "password": c.password,
                           "num_partitions": 6, "max_batch_size": 256, "cache_missed_embeddings": True},
           "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
           "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
                       "gpucache": gpucache, "gpucacheper": 0.2, "default_value_for_each_table": [-2.0]}]}
    ps = ParameterServer(cfg, retry_seconds=0.2)
    assert ps.volatile.cluster
    return ps, tab


def _vol(ps) -> dict:
    return ps.stats()["tiers"]["volatile"]


def _outage(ps, load, cause: str):
    """Waits until the tier is reported down with `cause` in its last error, lets lookups go on
    without it, and checks the stats."""
    wait_for(lambda: not _vol(ps)["available"] and cause.lower() in (_vol(ps)["last_error"] or "").lower(),
             30, f"the volatile tier to be reported unavailable ({cause})")
    load.wait_lookups(10)
    st = _vol(ps)
    assert st["available"] is False and st["outages"] == 1 and st["errors"] > 0, st
    assert st["down_seconds"] > 0 and st["last_error"].startswith(f"Redis at {ps.config.volatile_db.address}")
    return st


def _back(ps, load):
    """Waits until the tier answers lookups again (found rows are written back into it by
    cache_missed_embeddings, so its hits grow)."""
    hits = _vol(ps)["hits"]
    wait_for(lambda: _vol(ps)["available"] and _vol(ps)["hits"] > hits, 40,
             "the volatile tier to be in use again")
    load.wait_lookups(5)


def _check_run(ps, load, caplog):
    assert not load.errors, load.errors[:3]
    assert load.count > 30
    # No lookup hangs: one waits at most for its own try of the tier, bounded by the tier's socket
    # timeout (while one lookup tries a tier that is down, the others go on without it).
    bound = 2 * ps.volatile.socket_timeout + 1.0
    assert max(load.durations) < bound, f"a lookup took {max(load.durations):.1f} s (bound {bound} s)"
    st = ps.stats()
    assert st["tiers"]["volatile"]["available"] is True and st["tiers"]["volatile"]["outages"] == 1
    assert st["tiers"]["persistent"]["hits"] > 0                 # RocksDB answered during the outage
    assert st["tables"]["m/0"]["defaults_returned"] > 0           # absent keys got the default
    msgs = [r.getMessage() for r in caplog.records if r.name == "embedlab.hps"]
    assert sum("unavailable" in m for m in msgs) == 1, msgs       # logged once per outage
    assert sum("is back" in m for m in msgs) == 1, msgs


def test_every_node_killed(cluster, tmp_path, caplog):
    ps, tab = _server(cluster, tmp_path)
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"), LookupLoad(ps, tab, "m", default=-2.0) as load:
        load.wait_lookups(5)
        assert _vol(ps)["hits"] > 0
        for n in cluster.nodes:
            n.kill()
        _outage(ps, load, "connect")
        for n in cluster.nodes:
            n.start()                                   # back, empty (nothing is persisted)
        wait_for(lambda: cluster_ok(cluster.nodes), 30, "the restarted cluster")
        _back(ps, load)
    _check_run(ps, load, caplog)
    assert sum(n.client().dbsize() for n in cluster.nodes) > 0     # rows written back into Redis
    ps.close()


def test_one_node_of_three_killed_rows_updated_meanwhile_not_stale(three, tmp_path, caplog):
    ps, tab = _server(three, tmp_path)
    upd_keys = tab.keys[:40]                      # the lookup threads never read these
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"), \
            LookupLoad(ps, tab, "m", keys=tab.keys[40:], default=-2.0) as load:
        load.wait_lookups(5)
        three.nodes[1].kill()
        _outage(ps, load, "connect")
        new = np.full((40, 8), 5.0, np.float32)
        ps.update("m", 0, upd_keys, new)          # RocksDB gets them; the surviving nodes keep old rows
        assert np.array_equal(ps.lookup("m", 0, upd_keys), new)
        three.nodes[1].start()
        wait_for(lambda: cluster_ok(three.nodes), 30, "the cluster with the node back")
        _back(ps, load)
        assert np.array_equal(ps.lookup("m", 0, upd_keys), new)   # not the old rows the tier held
    _check_run(ps, load, caplog)
    ps.close()


def test_node_restarted_empty(three, tmp_path, caplog):
    ps, tab = _server(three, tmp_path, gpucache=True)
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"), LookupLoad(ps, tab, "m", default=-2.0) as load:
        load.wait_lookups(5)
        node = three.nodes[2]
        assert node.client().dbsize() > 0
        node.kill()
        _outage(ps, load, "connect")
        node.start()                                    # empty: its rows are gone
        assert node.client().dbsize() == 0
        wait_for(lambda: cluster_ok(three.nodes), 30, "the cluster with the node back")
        _back(ps, load)
        # its rows come from RocksDB (exact) and are written back into it
        wait_for(lambda: node.client().dbsize() > 0, 20, "rows written back into the restarted node")
    _check_run(ps, load, caplog)
    ps.close()


def test_node_that_never_answers(three, tmp_path, caplog):
    """SIGSTOP: the kernel still accepts connections, Redis never replies. A lookup waits about
    one socket timeout, then goes on without the tier; while the node stays hung it is tried
    less and less often (retry_seconds doubling up to max_retry_seconds)."""
    ps, tab = _server(three, tmp_path)
    node = three.nodes[0]
    try:
        with caplog.at_level(logging.WARNING, logger="embedlab.hps"), \
                LookupLoad(ps, tab, "m", default=-2.0) as load:
            load.wait_lookups(5)
            node.proc.send_signal(signal.SIGSTOP)
            _outage(ps, load, "timeout")
            node.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: cluster_ok(three.nodes), 30, "the cluster with the node answering again")
            _back(ps, load)
    finally:
        node.proc.send_signal(signal.SIGCONT)
    _check_run(ps, load, caplog)
    ps.close()


def test_wrong_password_after_restart(one, tmp_path, caplog):
    ps, tab = _server(one, tmp_path)
    node = one.nodes[0]
    right = node.password
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"), LookupLoad(ps, tab, "m", default=-2.0) as load:
        load.wait_lookups(5)
        node.password = "not-the-configured-one"
        node.restart()                                   # comes back requiring another password
        _outage(ps, load, "AuthenticationError")
        node.password = right
        node.restart()
        wait_for(lambda: cluster_ok(one.nodes), 30, "the node with the right password")
        _back(ps, load)
    _check_run(ps, load, caplog)
    ps.close()


def test_retry_interval_doubles_while_the_tier_stays_down(tmp_path, caplog):
    """A tier that keeps failing is tried after retry_seconds, then after twice as long each time,
    up to max_retry_seconds; when it works again it is back at once, and the interval resets."""
    import time

    from embedlab.hps.tiers import TierUnavailable
    tab = Table(tmp_path / "t", n=200, dim=4)
    cfg = {"volatile_db": {"type": "hash_map"}, "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
           "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [4],
                       "gpucache": False}]}
    with pytest.raises(ValueError, match="max_retry_seconds"):
        ParameterServer(cfg, retry_seconds=1.0, max_retry_seconds=0.5)
    ps = ParameterServer(cfg, retry_seconds=0.05, max_retry_seconds=0.4)
    real_find, tries, down = ps.volatile.find, [], [True]

    def find(table, keys, out):
        tries.append(time.monotonic())
        if down[0]:
            raise TierUnavailable("test: down")
        return real_find(table, keys, out)
    ps.volatile.find = find
    q = tab.keys[:10]
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        end = time.monotonic() + 2.5
        while time.monotonic() < end:
            assert np.array_equal(ps.lookup("m", 0, q), tab.vectors[:10])     # RocksDB answers
            time.sleep(0.005)
        gaps = np.diff(tries)
        want = np.minimum(0.05 * 2.0 ** np.arange(len(gaps)), 0.4)
        assert len(gaps) >= 6 and np.all(gaps >= want - 0.005), (gaps, want)
        assert np.all(gaps < 0.4 + 0.3), gaps                # never skipped much past max_retry_seconds
        assert _vol(ps)["last_error"] == "test: down" and _vol(ps)["outages"] == 1
        down[0] = False
        wait_for(lambda: ps.lookup("m", 0, q) is not None and _vol(ps)["available"], 1.0, "the tier back")
        n = len(tries)
        ps.lookup("m", 0, q)
        assert len(tries) == n + 1                            # in use again for every lookup
    assert sum("is back" in r.getMessage() for r in caplog.records) == 1
    ps.close()


@pytest.fixture(scope="module")
def one_module():
    c = OneNodeCluster()
    c.start()
    yield c
    c.stop()


def _errors():
    import redis.exceptions as E
    unavailable = [E.ConnectionError("Connection refused"), E.TimeoutError("Timeout reading from socket"),
                   E.AuthenticationError("invalid username-password pair"), E.BusyLoadingError("LOADING"),
                   E.ClusterDownError("CLUSTERDOWN"), E.MasterDownError("MASTERDOWN"), E.ClusterError("TTL exhausted"),
                   E.TryAgainError("TRYAGAIN"), E.MovedError("3999 127.0.0.1:6381"), E.ReadOnlyError("READONLY"),
                   E.NoPermissionError("NOPERM"), E.SlotNotCoveredError("Slot 5 is not covered"),
                   E.RedisClusterException("Redis Cluster cannot be connected"), ConnectionResetError(104, "reset")]
    misuse = [E.ResponseError("WRONGTYPE"), E.DataError("bad argument"), E.CrossSlotTransactionError("cross slot"),
              E.InvalidPipelineStack("stack")]
    return [(e, True) for e in unavailable] + [(e, False) for e in misuse]


@pytest.mark.parametrize("error, unavailable", _errors(), ids=lambda x: type(x).__name__ if isinstance(x, Exception) else "")
def test_which_redis_errors_mean_unavailable(one_module, error, unavailable):
    """Every redis-py error that means "cannot serve now" becomes TierUnavailable (the server then
    skips the tier); misuse and wrong replies propagate as they are."""
    from embedlab.hps.config import VolatileDBConfig
    from embedlab.hps.tiers import RedisTier, TierUnavailable
    t = RedisTier(VolatileDBConfig(type="redis_cluster", address=one_module.address, password=one_module.password,
                                   num_partitions=2))
    t.add_table("hps_et.e.t", 2)
    out = np.zeros((3, 2), np.float32)
    assert t.find("hps_et.e.t", np.arange(3), out).tolist() == [0, 1, 2]     # works; nothing stored

    def fail(cmds):
        raise error
    t._send_by_node = fail
    if unavailable:
        with pytest.raises(TierUnavailable, match=type(error).__name__):
            t.find("hps_et.e.t", np.arange(3), out)
    else:
        with pytest.raises(type(error)):
            t.find("hps_et.e.t", np.arange(3), out)
    t.close()
