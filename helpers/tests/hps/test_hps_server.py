"""ParameterServer: every tier stack against a NumPy dict oracle, upward insertion, hit_rate_threshold,
updates, refresh, bad input, and no TensorFlow in the server's process."""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from embedlab.hps import HPSLookupError, ParameterServer
from embedlab.sparse_model import SparseModelError, write_sparse_model

from hps_testing import Table, needs_native_tiers, redis_server  # noqa: F401 (fixture)


def _cfg(tabs, volatile=None, persistent=None, gpucache=False, **model):
    models = {}
    for (mname, tname), tab in tabs.items():
        m = models.setdefault(mname, {"model": mname, "sparse_files": [], "embedding_vecsize_per_table": [],
                                      "embedding_table_names": [], "default_value_for_each_table": [],
                                      "gpucache": gpucache, **model})
        m["sparse_files"].append(str(tab.path))
        m["embedding_vecsize_per_table"].append(tab.dim)
        m["embedding_table_names"].append(tname)
        m["default_value_for_each_table"].append(float(len(m["sparse_files"])) / 4)
    return {"volatile_db": volatile or {"type": "disabled"}, "persistent_db": persistent or {"type": "disabled"},
            "models": list(models.values())}


def _tables(tmp_path, rng):
    return {("m1", "a"): Table(tmp_path / "a", n=int(rng.integers(300, 2000)), dim=16, rng=rng),
            ("m1", "b"): Table(tmp_path / "b", n=int(rng.integers(300, 2000)), dim=5, rng=rng),
            ("m2", "a"): Table(tmp_path / "c", n=int(rng.integers(300, 2000)), dim=32, rng=rng)}


STACKS = {
    "rocks_db": dict(persistent="rocks"),
    "redis+rocks_db": dict(volatile="redis", persistent="rocks"),
    "redis(part)+rocks_db": dict(volatile="redis", persistent="rocks", initial_cache_rate=0.3),
    "cache+hash_map": dict(volatile="hash_map", gpucache=True, native=True),
    "cache+parallel_hash_map+rocks_db": dict(volatile="parallel_hash_map", persistent="rocks", gpucache=True,
                                             native=True, initial_cache_rate=0.5),
    "static cache+hash_map": dict(gpucache=True, static=True, native=True, volatile="hash_map"),
    **{f"hash_map({policy})+rocks_db": dict(volatile="hash_map", persistent="rocks", native=True, overflow=policy)
       for policy in ("evict_random", "evict_least_used", "evict_oldest")},
}


@pytest.mark.parametrize("stack", list(STACKS))
def test_stack_against_oracle(stack, tmp_path, request, rng):
    s = STACKS[stack]
    if s.get("native"):
        from hps_testing import native_tiers
        if not native_tiers():
            pytest.skip("this build has no compiled EmbeddingCache / HashMapStore")
    tabs = _tables(tmp_path, rng)
    vol = per = None
    if s.get("volatile") == "redis":
        r = request.getfixturevalue("redis_server")
        vol = {"type": "redis_cluster", "address": r.address, "password": r.password, "num_partitions": 3,
               "initial_cache_rate": s.get("initial_cache_rate", 1.0), "cache_missed_embeddings": True}
    elif s.get("volatile"):
        vol = {"type": s["volatile"], "initial_cache_rate": s.get("initial_cache_rate", 1.0), "num_partitions": 4}
        if s.get("overflow"):
            vol.update(overflow_margin=100, overflow_policy=s["overflow"], overflow_resolution_target=0.5)
    if s.get("persistent") == "rocks":
        per = {"type": "rocks_db", "path": str(tmp_path / "db")}
    model = {"gpucacheper": 0.3}
    if s.get("static"):
        model["embedding_cache_type"] = "static"
    ps = ParameterServer(_cfg(tabs, vol, per, gpucache=s.get("gpucache", False), **model))
    try:
        for _ in range(3):
            for (mname, tname), tab in tabs.items():
                tid = ["a", "b"].index(tname)
                default = (tid + 1) / 4
                q = tab.query(int(rng.integers(1, 3000)), absent=int(rng.integers(1, 20)))
                got = ps.lookup(mname, tid, q)
                assert got.dtype == np.float32 and got.shape == (len(q), tab.dim)
                assert np.array_equal(got, tab.expect(q, default)), (stack, mname, tname)
        ps.wait_background()
        st = ps.stats()
        assert all(t["defaults_returned"] > 0 for t in st["tables"].values())
        if s.get("gpucache"):
            assert st["tiers"]["cache"]["hits"] > 0
        if vol is not None and not s.get("overflow") and s.get("initial_cache_rate", 1.0) == 1.0:
            assert st["tiers"]["volatile"]["hits"] > 0
        assert ps.lookup("m1", 0, np.zeros(0, np.int64)).shape == (0, 16)
        if s.get("overflow"):   # every partition of every table stays within overflow_margin
            for t in ("hps_et.m1.a", "hps_et.m1.b", "hps_et.m2.a"):
                assert ps.volatile.size(t) <= 4 * 100
    finally:
        ps.close()


def test_defaults_counted_and_bad_input(tmp_path, rng):
    tabs = _tables(tmp_path, rng)
    ps = ParameterServer(_cfg(tabs, persistent={"type": "rocks_db", "path": str(tmp_path / "db")}))
    absent = tabs[("m1", "a")].absent_keys(7)
    assert np.array_equal(ps.lookup("m1", 0, absent), np.full((7, 16), 0.25, np.float32))
    assert ps.stats()["tables"]["m1/0"]["defaults_returned"] == 7
    with pytest.raises(HPSLookupError, match="dtype float64"):
        ps.lookup("m1", 0, np.array([1.0, 2.0]))
    with pytest.raises(HPSLookupError, match=r"1-D, got shape \(2, 2\)"):
        ps.lookup("m1", 0, np.zeros((2, 2), np.int64))
    with pytest.raises(HPSLookupError, match="unknown model 'zz'"):
        ps.lookup("zz", 0, absent)
    with pytest.raises(HPSLookupError, match="no table_id 2"):
        ps.lookup("m1", 2, absent)
    with pytest.raises(HPSLookupError, match=r"vectors must be \[2, 16\]"):
        ps.update("m1", 0, absent[:2], np.zeros((2, 15), np.float32))
    ps.close()


def test_truncated_or_mismatched_sparse_files_name_the_file(tmp_path):
    tab = Table(tmp_path / "t", n=100, dim=8)
    cfg = _cfg({("m", "t"): tab}, persistent={"type": "rocks_db", "path": str(tmp_path / "db")})
    with open(tab.path / "emb_vector", "r+b") as f:
        f.truncate(8 * 100 * 4 - 4)
    with pytest.raises(SparseModelError, match="emb_vector"):
        ParameterServer(cfg)
    write_sparse_model(tab.path, tab.keys, np.zeros((100, 16), np.float32))     # dim 16, config says 8
    with pytest.raises(SparseModelError, match="dim"):
        ParameterServer(cfg)


@pytest.mark.parametrize("native", [False, True])
def test_update_and_refresh(native, tmp_path, redis_server, rng):
    from hps_testing import native_tiers
    if native and not native_tiers():
        pytest.skip("this build has no compiled EmbeddingCache / HashMapStore")
    tab = Table(tmp_path / "t", n=500, dim=8, rng=rng)
    vol = ({"type": "hash_map"} if native else
           {"type": "redis_cluster", "address": redis_server.address, "password": redis_server.password})
    cfg = _cfg({("u", "t"): tab}, volatile=vol, persistent={"type": "rocks_db", "path": str(tmp_path / "db")},
               gpucache=native, gpucacheper=1.0)
    ps = ParameterServer(cfg)
    q = tab.keys[:50]
    ps.lookup("u", 0, q)                                    # warms the cache (native)
    new = rng.standard_normal((20, 8)).astype(np.float32)
    assert ps.update("u", 0, q[:20], new) == 20
    ref = tab.expect(q)
    ref[:20] = new
    assert np.array_equal(ps.lookup("u", 0, q), ref)
    # rewrite the sparse files, then refresh: every tier answers the new rows
    vec2 = tab.vectors + 1.0
    write_sparse_model(tab.path, tab.keys, vec2)
    assert ps.refresh("u") == 500
    assert np.array_equal(ps.lookup("u", 0, tab.keys), vec2)
    ps.close()


@needs_native_tiers
@pytest.mark.parametrize("threshold, sync", [(1.5, True), (0.0, False)])
def test_hit_rate_threshold(threshold, sync, tmp_path):
    tab = Table(tmp_path / "t", n=1000, dim=8)
    cfg = _cfg({("h", "t"): tab}, volatile={"type": "hash_map"}, gpucache=True, gpucacheper=1.0,
               hit_rate_threshold=threshold)
    ps = ParameterServer(cfg, gpu_cache=False)       # inspects the host cache
    q = tab.keys[:100]      # 100 keys in 125 sets of 8 ways: no set overflows
    assert np.array_equal(ps.lookup("h", 0, q), tab.expect(q))
    t = ps.stats()["tables"]["h/0"]
    if sync:   # below the threshold: inserted before lookup returned
        assert t["sync_cache_inserts"] == 100 and t["async_cache_inserts"] == 0
        assert ps._caches["dynamic"].size("hps_et.h.t") == 100
    else:      # at/above it: a background thread inserts
        ps.wait_background()
        t = ps.stats()["tables"]["h/0"]
        assert t["sync_cache_inserts"] == 0 and t["async_cache_inserts"] == 100
    before = ps.stats()["tiers"]["cache"]["hits"]
    assert np.array_equal(ps.lookup("h", 0, q), tab.expect(q))
    assert ps.stats()["tiers"]["cache"]["hits"] - before == 100
    ps.close()


def test_concurrent_lookups_exact(tmp_path, redis_server):
    tab = Table(tmp_path / "t", n=2000, dim=16)
    cfg = _cfg({("c", "t"): tab}, volatile={"type": "redis_cluster", "address": redis_server.address,
                                            "password": redis_server.password, "initial_cache_rate": 0.5,
                                            "cache_missed_embeddings": True},
               persistent={"type": "rocks_db", "path": str(tmp_path / "db")})
    ps = ParameterServer(cfg)
    bad = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(15):
            q = tab.keys[rng.integers(0, 2000, int(rng.integers(1, 400)))]
            if not np.array_equal(ps.lookup("c", 0, q), tab.expect(q)):
                bad.append(seed)
    th = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not bad
    ps.close()


def test_server_does_not_import_tensorflow(tmp_path):
    tab = Table(tmp_path / "t", n=50, dim=4)
    code = f"""
import sys, numpy as np
import embedlab.hps as hps
ps = hps.ParameterServer({_cfg({("n", "t"): tab}, persistent={"type": "rocks_db", "path": str(tmp_path / "db")})!r})
ps.lookup("n", 0, np.arange(5))
assert "tensorflow" not in sys.modules, "tensorflow was imported"
print("no-tf-ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert "no-tf-ok" in r.stdout, r.stderr[-2000:]


@needs_native_tiers
def test_update_never_loses_to_a_queued_background_insert(tmp_path, rng):
    tab = Table(tmp_path / "t", n=1000, dim=8, rng=rng)
    cfg = _cfg({("a", "t"): tab}, volatile={"type": "hash_map"}, gpucache=True, gpucacheper=1.0,
               hit_rate_threshold=0.0)                       # every insertion goes to the background thread
    ps = ParameterServer(cfg)
    for _ in range(5):
        q = tab.keys[rng.choice(1000, 60, replace=False)]
        ps.lookup("a", 0, q)                                 # queues (key, old row) insertions
        new = rng.standard_normal((60, 8)).astype(np.float32)
        ps.update("a", 0, q, new)                            # races the queued insertions
        ps.wait_background()
        assert np.array_equal(ps.lookup("a", 0, q), new)
        for k, v in zip(q, new):
            tab.oracle[int(k)] = v
    ps.close()


def test_init_once_per_file_and_shutdown(tmp_path):
    import json

    import embedlab.hps as hps
    tab = Table(tmp_path / "t", n=20, dim=4)
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(_cfg({("i", "t"): tab}, persistent={"type": "rocks_db", "path": str(tmp_path / "db")})))
    try:
        assert hps.Init(8, str(path)) == "OK"
        ps = hps.get_server(str(path))
        assert hps.init(8, str(path)) == "OK" and hps.get_server() is ps and hps.get_server(str(path)) is ps
        assert np.array_equal(ps.lookup("i", 0, tab.keys), tab.vectors)
    finally:
        hps.shutdown()
    assert hps.servers() == {}
    with pytest.raises(RuntimeError, match="no parameter server"):
        hps.get_server()
