"""Tier faults with a real redis-server (one-node cluster on 127.0.0.1): a key the model holds is
never answered with the default value, and a volatile tier that comes back gets its rows again.

* Redis as the only tier, full (``maxmemory 2mb``, ``noeviction``): start-up fails naming the
  table and the OOM; an update it refuses raises, and lookups of those keys raise too.
* Redis as the only tier, killed: lookups of held keys raise (absent keys still get the default);
  restarted empty, it is re-seeded in the background and answers exactly again.
* Redis over RocksDB, restarted empty or down when the server starts: re-seeded in the
  background, without the rows updated meanwhile.
"""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from embedlab.hps import HPSConfigError, HPSUnavailableError, ParameterServer, TierError, load_config

from hps_testing import OneNodeCluster, Table, cluster_ok, needs_native_tiers, wait_for


@pytest.fixture()
def one():
    c = OneNodeCluster().start()
    yield c
    c.stop()


def _cfg(c, tab, persistent=None, **volatile):
    return {"volatile_db": {"type": "redis_cluster", "address": c.address, "password": c.password,
                            "num_partitions": 4, "max_batch_size": 512, **volatile},
            "persistent_db": persistent or {"type": "disabled"},
            "models": [{"model": "m", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [tab.dim],
                        "gpucache": False, "default_value_for_each_table": [-2.0]}]}


def _vol(ps) -> dict:
    return ps.stats()["tiers"]["volatile"]


def _looks_up_until_back(ps, tab, q):
    """Looks up (absent keys only, which never raise) until the tier is marked back, then waits for
    its re-seeding to end."""
    absent = tab.absent_keys(3)
    wait_for(lambda: ps.lookup("m", 0, absent) is not None and _vol(ps)["available"], 30, "the tier back")
    assert ps.wait_reseed(60), "the re-seeding did not end"


# ---- Redis as the only tier --------------------------------------------------------------------

def test_redis_only_and_full_fails_at_startup(one, tmp_path):
    node = one.nodes[0].client()
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", "2mb")
    tab = Table(tmp_path / "t", n=20000, dim=16, rng=3)
    with pytest.raises(TierError, match=r"no tier can hold table hps_et\.m\.sparse_embedding0 .*OOM"):
        ParameterServer(_cfg(one, tab, cache_missed_embeddings=True), retry_seconds=0.2)


@needs_native_tiers
def test_redis_only_update_refused_raises_and_never_defaults(one, tmp_path):
    tab = Table(tmp_path / "t", n=1500, dim=8, rng=5)
    ps = ParameterServer(_cfg(one, tab), retry_seconds=0.2)
    try:
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        node = one.nodes[0].client()
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", str(int(node.info("memory")["used_memory"]) // 2))  # over it: writes refused
        keys = tab.keys[:600]
        with pytest.raises(HPSUnavailableError, match=r"no tier took the 600 row\(s\).*OOM"):
            ps.update("m", 0, keys, np.ones((600, 8), np.float32))
        # The refused keys: an error, never the default (nor a mix of old and new rows).
        with pytest.raises(HPSUnavailableError, match=r"600 key\(s\) are held by the model"):
            ps.lookup("m", 0, keys)
        assert ps.stats()["tables"]["m/0"]["unavailable_keys"] == 600
        # The others and absent keys are exact; absent keys get the default.
        q = np.concatenate([tab.keys[600:], tab.absent_keys(5)])
        np.testing.assert_array_equal(ps.lookup("m", 0, q), tab.expect(q, default=-2.0))
        # Room again: the update goes through and the rows are served.
        node.config_set("maxmemory", "0")
        ps.update("m", 0, keys, np.ones((600, 8), np.float32))
        np.testing.assert_array_equal(ps.lookup("m", 0, keys), np.ones((600, 8), np.float32))
    finally:
        ps.close()


@needs_native_tiers
def test_redis_only_killed_raises_then_reseeded_after_restart(one, tmp_path, caplog):
    tab = Table(tmp_path / "t", n=3000, dim=8, rng=9)
    ps = ParameterServer(_cfg(one, tab), retry_seconds=0.1)
    try:
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        new = np.full((10, 8), 7.0, np.float32)
        ps.update("m", 0, tab.keys[:10], new)          # only Redis holds these rows
        one.nodes[0].kill()
        with pytest.raises(HPSUnavailableError, match="held by the model"):
            ps.lookup("m", 0, tab.keys[100:200])
        absent = tab.absent_keys(4)                    # the server knows these are not the model's
        np.testing.assert_array_equal(ps.lookup("m", 0, absent), np.full((4, 8), -2.0, np.float32))
        with pytest.raises(HPSUnavailableError):
            ps.update("m", 0, tab.keys[10:20], new)
        one.nodes[0].start()                           # back, empty
        wait_for(lambda: cluster_ok(one.nodes), 30, "the restarted node")
        with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
            _looks_up_until_back(ps, tab, tab.keys)
        # Every row of the files but those updated since they were loaded (their newer rows were
        # lost with Redis: they raise, never the files' older rows nor the default).
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys[20:]), tab.vectors[20:])
        with pytest.raises(HPSUnavailableError):
            ps.lookup("m", 0, tab.keys[:20])
        st = _vol(ps)
        assert st["reseeds"] == 1 and st["reseeding"] is False and st["reseeded_rows"] == 3000 - 20, st
        assert any("re-seeded: 2980 rows" in r.getMessage() for r in caplog.records), caplog.text
    finally:
        ps.close()


# ---- Redis over RocksDB --------------------------------------------------------------------------

@needs_native_tiers
def test_volatile_restarted_empty_is_reseeded_without_rows_updated_meanwhile(one, tmp_path):
    tab = Table(tmp_path / "t", n=3000, dim=8, rng=13)
    ps = ParameterServer(_cfg(one, tab, persistent={"type": "rocks_db", "path": str(tmp_path / "db")},
                              initial_cache_rate=0.5), retry_seconds=0.1)
    try:
        name = "hps_et.m.sparse_embedding0"
        assert ps.volatile.size(name) == 1500
        one.nodes[0].kill()
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)     # from RocksDB
        assert not _vol(ps)["available"]
        upd = tab.keys[:50]                               # in the re-seeded half
        new = np.full((50, 8), 3.0, np.float32)
        ps.update("m", 0, upd, new)                       # RocksDB takes it; Redis is down
        one.nodes[0].start()
        wait_for(lambda: cluster_ok(one.nodes), 30, "the restarted node")
        assert one.nodes[0].client().dbsize() == 0
        _looks_up_until_back(ps, tab, tab.keys)
        assert ps.volatile.size(name) == 1500 - 50        # the first half, less the updated keys
        out = np.zeros((50, 8), np.float32)
        assert ps.volatile.find(name, upd, out).size == 50    # no old row of an updated key
        hits = _vol(ps)["hits"]
        want = tab.vectors.copy()
        want[:50] = new
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), want)
        assert _vol(ps)["hits"] - hits == 1500 - 50       # Redis serves again
        st = _vol(ps)
        assert st["reseeds"] == 1 and st["reseeded_rows"] == 1500 - 50, st
    finally:
        ps.close()


@needs_native_tiers
def test_volatile_down_at_startup_is_seeded_when_it_comes_back(one, tmp_path, caplog):
    """Redis pauses its writes (CLIENT PAUSE WRITE, as a cluster that is not ready yet): the
    start-up's insert times out, the server starts from RocksDB, and once Redis answers again
    the rows it should hold are loaded in the background."""
    tab = Table(tmp_path / "t", n=2000, dim=8, rng=17)
    one.nodes[0].cli("client", "pause", "2500", "write")
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        ps = ParameterServer(_cfg(one, tab, persistent={"type": "rocks_db", "path": str(tmp_path / "db")}),
                             retry_seconds=0.2)
    try:
        assert _vol(ps)["outages"] == 1 and one.nodes[0].client().dbsize() == 0
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        wait_for(lambda: ps.lookup("m", 0, tab.keys[:5]) is not None
                 and ps.volatile.size("hps_et.m.sparse_embedding0") == 2000, 20, "the volatile tier seeded")
        assert ps.wait_reseed(30)
        hits = _vol(ps)["hits"]
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        assert _vol(ps)["hits"] - hits == 2000
        assert _vol(ps)["reseeds"] >= 1
    finally:
        ps.close()


# ---- HPS config errors name the file -------------------------------------------------------------

def test_config_not_utf8_and_field_errors_name_the_file(tmp_path):
    p = tmp_path / "hps.json"
    p.write_bytes(b'{"models": [{"model": "m\xff", "sparse_files": ["/x"], "embedding_vecsize_per_table": [4]}]}')
    with pytest.raises(HPSConfigError, match=rf"HPS config {p}: not UTF-8 text: byte 0xff at offset 24") as e:
        load_config(p)
    assert isinstance(e.value.__cause__, UnicodeDecodeError)
    p.write_text(json.dumps({"models": [{"model": "m", "sparse_files": ["/x"], "embedding_vecsize_per_table": [4],
                                         "gpucacheper": 2.0}]}))
    with pytest.raises(HPSConfigError, match=rf"^HPS config {p.resolve()}: models\[0\]\.gpucacheper must be"):
        load_config(p)
    with pytest.raises(HPSConfigError, match=r"^HPS config: models\[0\]\.gpucacheper"):   # a dict: no file
        load_config(json.loads(p.read_text()))
