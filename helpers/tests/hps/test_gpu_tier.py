"""The HPS GPU tier: one CudaEmbeddingCache per table per deployed device, over the CPU tiers.

The GPU-tier server must return the same bits as the CPU-tier server built from the same JSON,
for the same key stream: Zipf and uniform keys with repeats, absent keys (defaults), int64 keys
at both ends of the range, host and device keys, with updates and refreshes between lookups and
caches small enough to evict. Under lookups from several threads while updates run, every row is
one the key held, and a lookup that starts after an update returns sees the new rows. On two
GPUs, each device's caches hold their own working set and answer alike. A device the model is
not deployed on is a clear error.

The GPU tests skip, with the reason, where the module has no CUDA kernels, no GPU is visible or
neither PyTorch nor CuPy can use it; the last tests check the CPU fallback where that is so.
"""
import threading

import numpy as np
import pytest

from embedlab.hps import HPSLookupError, ParameterServer, TierError
from embedlab.hps.tiers import gpu_tier_available
from embedlab.sparse_model import write_sparse_model

import gpu_arrays

needs_cache = pytest.mark.needs_gpu("CudaEmbeddingCache")
I64 = np.iinfo(np.int64)


class Tab:
    """A random table whose keys include both ends of int64, 0 and -1; values encode (key, version)."""

    def __init__(self, path, rng, n, dim):
        k = np.unique(np.concatenate([rng.integers(I64.min, I64.max, 2 * n, dtype=np.int64),
                                      rng.integers(-50, 50, 64),
                                      [I64.min, I64.min + 1, I64.max, I64.max - 1, 0, -1]]))
        edge = np.array([I64.min, I64.min + 1, I64.max, I64.max - 1, 0, -1], np.int64)
        rest = rng.permutation(np.setdiff1d(k, edge))[: n - edge.size]
        self.keys = rng.permutation(np.concatenate([edge, rest]))
        self.dim, self.path, self.rng = dim, path, rng
        self.vectors = rng.standard_normal((n, dim)).astype(np.float32)
        write_sparse_model(path, self.keys, self.vectors)

    def absent(self, m):
        a = self.rng.integers(I64.min, I64.max, m, dtype=np.int64)
        return a[~np.isin(a, self.keys)]

    def stream(self, m, dist):
        """m keys: Zipf(1.1) or uniform over the table's keys, 3 % absent keys, the int64 ends."""
        if dist == "zipf":
            idx = (self.rng.zipf(1.1, m) - 1) % self.keys.size
        else:
            idx = self.rng.integers(0, self.keys.size, m)
        q = np.concatenate([self.keys[idx], self.absent(max(1, m // 32)), [I64.min, I64.max]])
        return self.rng.permutation(q)


def _json(tabs, cache_type="dynamic", per=0.05, devices=(0,), thr=0.9, initial_rate=1.0):
    return {"volatile_db": {"type": "parallel_hash_map", "initial_cache_rate": initial_rate},
            "persistent_db": {"type": "disabled"},
            "models": [{"model": "m", "sparse_files": [str(t.path) for t in tabs],
                        "embedding_table_names": [f"t{i}" for i in range(len(tabs))],
                        "embedding_vecsize_per_table": [t.dim for t in tabs],
                        "default_value_for_each_table": [0.25 * (i + 1) for i in range(len(tabs))],
                        "deployed_device_list": list(devices), "gpucache": True, "gpucacheper": per,
                        "hit_rate_threshold": thr, "embedding_cache_type": cache_type}]}


def _bits(a):
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _dev():
    _, dev, _ = gpu_arrays.core_and_device("CudaEmbeddingCache")
    return dev


def _gpu_count():
    return gpu_tier_available()[0]


@needs_cache
@pytest.mark.parametrize("cache_type", ["dynamic", "static"])
@pytest.mark.parametrize("dist", ["zipf", "uniform"])
def test_same_bits_as_cpu_tier(tmp_path, rng, cache_type, dist):
    tabs = [Tab(tmp_path / "a", rng, 6000, 16), Tab(tmp_path / "b", rng, 3000, 128), Tab(tmp_path / "c", rng, 2000, 5)]
    js = _json(tabs, cache_type, per=0.05, thr=0.5)
    dev = _dev()
    with ParameterServer(js, gpu_cache=True) as g, ParameterServer(js, gpu_cache=False) as c:
        assert g.stats()["models"]["m"] == {"cache_tier": "gpu", "devices": [0]}
        assert c.stats()["models"]["m"]["cache_tier"] == "cpu"
        for step in range(36):
            t = step % len(tabs)
            q = tabs[t].stream(int(rng.integers(1, 6000)), dist)
            want, wdef = c.lookup("m", t, q, return_defaulted=True)
            how = step % 3
            if how == 0:        # host keys, host rows
                got, gdef = g.lookup("m", t, q, return_defaulted=True)
            else:               # device keys (the test's framework), rows on the device
                got, gdef = g.lookup("m", t, dev.put(q), return_defaulted=True, device=0 if how == 1 else None)
                got, gdef = dev.get(got), dev.get(gdef)
            assert got.shape == want.shape and got.dtype == np.float32
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"step {step}, table {t}")
            np.testing.assert_array_equal(gdef, wdef)
            assert wdef.any(), "the stream holds absent keys"
            if step % 7 == 6 and cache_type == "dynamic":
                k = tabs[t].rng.choice(tabs[t].keys, 500, replace=False)
                v = rng.standard_normal((500, tabs[t].dim)).astype(np.float32)
                assert g.update("m", t, k, v) == c.update("m", t, k, v) == 500
                np.testing.assert_array_equal(_bits(g.lookup("m", t, k)), _bits(v))
            if step % 11 == 10:
                tabs[t].vectors = rng.standard_normal(tabs[t].vectors.shape).astype(np.float32)
                write_sparse_model(tabs[t].path, tabs[t].keys, tabs[t].vectors)
                assert g.refresh("m") == c.refresh("m")
                np.testing.assert_array_equal(_bits(g.lookup("m", t, tabs[t].keys)), _bits(tabs[t].vectors))
        g.wait_background()
        st = g.stats()
        d0 = st["tiers"]["cache"]["devices"]["cuda:0"]
        assert d0["hits"] > 0 and d0["misses"] > 0
        if cache_type == "dynamic":
            assert d0["sync_inserts"] + d0["async_inserts"] > 0
            ev = sum(g._gpu_caches[("dynamic", 0)].stats(f"hps_et.m.t{i}")["evictions"] for i in range(3))
            assert ev > 0, "the caches (5 % of the rows) must have evicted"


@needs_cache
def test_async_inserts_above_threshold_and_sync_below(tmp_path, rng):
    tab = Tab(tmp_path / "a", rng, 4000, 16)
    with ParameterServer(_json([tab], per=0.5, thr=0.5), gpu_cache=True) as ps:
        ps.lookup("m", 0, tab.keys[:1000])                   # all misses: hit rate 0 < 0.5, sync
        st = ps.stats()["tables"]["m/0"]
        assert st["sync_cache_inserts"] == 1000 and st["async_cache_inserts"] == 0
        q = np.concatenate([tab.keys[:900], tab.keys[1000:1100]])   # about 90 % hits: asynchronous
        m0 = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]["misses"]
        np.testing.assert_array_equal(ps.lookup("m", 0, q), tab.vectors[np.r_[0:900, 1000:1100]])
        missed = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]["misses"] - m0
        assert 100 <= missed <= 150, "the 100 new keys, and the few the sets could not hold"
        ps.wait_background()
        assert ps.stats()["tables"]["m/0"]["async_cache_inserts"] == missed
        d0 = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]
        before = d0["hits"]
        ps.lookup("m", 0, tab.keys[1000:1100])
        assert ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]["hits"] >= before + 90


@needs_cache
def test_concurrent_lookups_with_updates(tmp_path, rng):
    """Threads look up (host and device keys) while the main thread updates a hot key set in
    versions: every row returned is one of the versions its key held; after each update returns,
    a new lookup sees that version exactly."""
    tab = Tab(tmp_path / "a", rng, 8000, 32)
    hot = tab.keys[:400]
    versions = [tab.vectors[:400]]
    dev = _dev()
    errors = []
    stop = threading.Event()
    pos = {int(k): i for i, k in enumerate(tab.keys)}
    lock = threading.Lock()

    with ParameterServer(_json([tab], per=0.1, thr=0.95), gpu_cache=True) as ps:
        def reader(seed):
            r = np.random.default_rng(seed)
            i = 0
            while not stop.is_set() and not errors:
                q = np.concatenate([hot[r.integers(0, 400, 300)], tab.keys[r.integers(0, tab.keys.size, 700)]])
                try:
                    rows = ps.lookup("m", 0, q) if i % 2 else dev.get(ps.lookup("m", 0, dev.put(q), device=0))
                except Exception as e:  # reported by the main thread
                    errors.append(repr(e))
                    return
                with lock:
                    vs = list(versions)
                for j, k in enumerate(q):
                    p = pos[int(k)]
                    if p < 400:
                        if not any(np.array_equal(rows[j], v[p]) for v in vs):
                            errors.append(f"hot key {k}: a row it never held")
                    elif not np.array_equal(rows[j], tab.vectors[p]):
                        errors.append(f"key {k}: wrong row")
                i += 1

        threads = [threading.Thread(target=reader, args=(int(s),)) for s in rng.integers(0, 2**31, 4)]
        for t in threads:
            t.start()
        try:
            for v in range(1, 9):
                new = rng.standard_normal((400, 32)).astype(np.float32)
                with lock:
                    versions.append(new)
                ps.update("m", 0, hot, new)
                np.testing.assert_array_equal(ps.lookup("m", 0, hot), new)
                np.testing.assert_array_equal(dev.get(ps.lookup("m", 0, dev.put(hot), device=0)), new)
        finally:
            stop.set()
            for t in threads:
                t.join()
        assert not errors, errors[:5]
        ps.wait_background()
        np.testing.assert_array_equal(ps.lookup("m", 0, hot), versions[-1])


@needs_cache
def test_undeployed_device_is_a_clear_error(tmp_path, rng):
    tab = Tab(tmp_path / "a", rng, 500, 8)
    dev = _dev()
    with ParameterServer(_json([tab], devices=(0,)), gpu_cache=True) as ps:
        with pytest.raises(HPSLookupError, match=r"deployed on GPU device\(s\) \[0\].*device 1 is not"):
            ps.lookup("m", 0, tab.keys[:10], device=1)
        with pytest.raises(HPSLookupError, match="device must be a CUDA device"):
            ps.lookup("m", 0, tab.keys[:10], device="tpu")
        with pytest.raises(HPSLookupError, match="int64"):
            ps.lookup("m", 0, dev.put(np.zeros(3, np.float32)))
        out = ps.lookup("m", 0, tab.keys[:10], device="cuda:0")
        np.testing.assert_array_equal(dev.get(out), tab.vectors[:10])
    with pytest.raises(TierError, match="deployed_device_list names device"):
        ParameterServer(_json([tab], devices=(0, 64)), gpu_cache=True)


@needs_cache
def test_two_devices_hold_their_own_working_sets(tmp_path, rng):
    if _gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs, {_gpu_count()} visible")
    import torch
    tab = Tab(tmp_path / "a", rng, 20000, 16)
    a, b = tab.keys[:2000], tab.keys[10000:12000]
    js = _json([tab], per=0.2, devices=(0, 1), thr=0.0)   # threshold 0: every insert is asynchronous
    with ParameterServer(js, gpu_cache=True) as ps, ParameterServer(js, gpu_cache=False) as cpu:
        for _ in range(3):
            for d, ws in ((0, a), (1, b)):
                q = ws[rng.integers(0, ws.size, 3000)]
                got = ps.lookup("m", 0, torch.from_numpy(q).to(f"cuda:{d}"))
                assert got.device.index == d
                np.testing.assert_array_equal(_bits(got.cpu().numpy()), _bits(cpu.lookup("m", 0, q)))
        ps.wait_background()
        c0, c1 = ps._gpu_caches[("dynamic", 0)], ps._gpu_caches[("dynamic", 1)]
        name = "hps_et.m.t0"
        buf = np.empty((2000, 16), np.float32)
        # A set-associative cache of 4,000 slots holds nearly all of a 2,000-key working set.
        assert c0.find(name, a, buf).size < 100 and c1.find(name, b, buf).size < 100
        assert c0.find(name, b, buf).size == 2000 and c1.find(name, a, buf).size == 2000, \
            "each device's cache must hold only its own working set"
        both = np.concatenate([a[:500], b[:500]])
        r0 = ps.lookup("m", 0, both, device=0).cpu().numpy()
        r1 = ps.lookup("m", 0, both, device=1).cpu().numpy()
        np.testing.assert_array_equal(_bits(r0), _bits(r1))
        new = rng.standard_normal((1000, 16)).astype(np.float32)
        ps.update("m", 0, both, new)                          # reaches both devices' caches
        for d in (0, 1):
            np.testing.assert_array_equal(ps.lookup("m", 0, both, device=d).cpu().numpy(), new)
        st = ps.stats()["tiers"]["cache"]["devices"]
        assert st["cuda:0"]["hits"] > 0 and st["cuda:1"]["hits"] > 0
        assert st["cuda:0"]["async_inserts"] > 0 and st["cuda:1"]["async_inserts"] > 0


@pytest.mark.skipif(_gpu_count() > 0, reason="checks the CPU fallback; this machine can run the GPU tier")
def test_without_gpu_the_cpu_cache_serves_and_says_so(tmp_path, rng):
    tab = Tab(tmp_path / "a", rng, 500, 8)
    with ParameterServer(_json([tab])) as ps:
        assert ps.stats()["models"]["m"] == {"cache_tier": "cpu", "devices": []}
        assert any("embedding cache in host memory" in r for r in ps.stats()["config_report"])
        np.testing.assert_array_equal(ps.lookup("m", 0, tab.keys), tab.vectors)
        with pytest.raises(HPSLookupError, match="no GPU can be used here"):
            ps.lookup("m", 0, tab.keys[:3], device=0)
    with pytest.raises(TierError, match="gpu_cache=True but the GPU embedding cache cannot run here"):
        ParameterServer(_json([tab]), gpu_cache=True)


# ---- many tables, one request (lookup_many) -------------------------------------------------

def _many_keys(tabs, rng, dist, empty=None):
    """One key stream per table (sizes differ; table `empty` gets no keys)."""
    return [np.zeros(0, np.int64) if i == empty else t.stream(int(rng.integers(1, 4000)), dist)
            for i, t in enumerate(tabs)]


@needs_cache
@pytest.mark.parametrize("cache_type", ["dynamic", "static"])
@pytest.mark.parametrize("dist", ["zipf", "uniform"])
def test_lookup_many_same_bits_as_cpu_tier_and_per_table(tmp_path, rng, cache_type, dist):
    """lookup_many on the GPU tier returns, table by table, the bits of the CPU-tier server and of
    the GPU server's own per-table lookup: host and device keys, list and dict forms, an empty
    table, absent keys, through evictions, with updates and refreshes between requests."""
    tabs = [Tab(tmp_path / f"t{i}", rng, n, dim) for i, (n, dim) in
            enumerate([(6000, 16), (3000, 128), (2000, 5), (2500, 16), (1500, 32)])]
    js = _json(tabs, cache_type, per=0.05, thr=0.5)
    dev = _dev()
    with ParameterServer(js, gpu_cache=True) as g, ParameterServer(js, gpu_cache=False) as c:
        for step in range(24):
            qs = _many_keys(tabs, rng, dist, empty=2 if step % 5 == 4 else None)
            want = [c.lookup("m", t, q, return_defaulted=True) for t, q in enumerate(qs)]
            how = step % 4
            if how == 0:        # host keys, host rows (what Triton's python backend sends)
                got, gdef = g.lookup_many("m", qs, return_defaulted=True)
            elif how == 1:      # device keys, rows on their device
                got, gdef = g.lookup_many("m", [dev.put(q) for q in qs], return_defaulted=True)
                got, gdef = [dev.get(x) for x in got], [dev.get(x) for x in gdef]
            elif how == 2:      # a dict of some tables, host keys, rows on device 0
                ids = [4, 0, 1]
                gd, dd = g.lookup_many("m", {t: qs[t] for t in ids}, return_defaulted=True, device=0)
                assert list(gd) == ids and list(dd) == ids
                want = [want[t] for t in ids]
                got, gdef = [dev.get(gd[t]) for t in ids], [dev.get(dd[t]) for t in ids]
            else:               # without defaulted flags; compare with per-table GPU lookups too
                got = g.lookup_many("m", [dev.put(q) for q in qs], device=0)
                got = [dev.get(x) for x in got]
                gdef = None
            for j, (w, wd) in enumerate(want):
                assert got[j].shape == w.shape and got[j].dtype == np.float32
                np.testing.assert_array_equal(_bits(got[j]), _bits(w), err_msg=f"step {step}, entry {j}")
                if gdef is not None:
                    np.testing.assert_array_equal(gdef[j], wd, err_msg=f"step {step}, entry {j}")
            if how == 3:
                for t, q in enumerate(qs):
                    np.testing.assert_array_equal(_bits(g.lookup("m", t, q)), _bits(want[t][0]))
            if step % 6 == 5 and cache_type == "dynamic":
                t = int(rng.integers(0, len(tabs)))
                k = tabs[t].rng.choice(tabs[t].keys, 300, replace=False)
                v = rng.standard_normal((300, tabs[t].dim)).astype(np.float32)
                assert g.update("m", t, k, v) == c.update("m", t, k, v) == 300
                many = g.lookup_many("m", {t: k})
                np.testing.assert_array_equal(_bits(many[t]), _bits(v))
            if step % 9 == 8:
                t = int(rng.integers(0, len(tabs)))
                tabs[t].vectors = rng.standard_normal(tabs[t].vectors.shape).astype(np.float32)
                write_sparse_model(tabs[t].path, tabs[t].keys, tabs[t].vectors)
                assert g.refresh("m") == c.refresh("m")
                np.testing.assert_array_equal(_bits(g.lookup_many("m", {t: tabs[t].keys})[t]),
                                              _bits(tabs[t].vectors))
        g.wait_background()
        d0 = g.stats()["tiers"]["cache"]["devices"]["cuda:0"]
        assert d0["hits"] > 0 and d0["misses"] > 0
        if cache_type == "dynamic":
            assert d0["sync_inserts"] + d0["async_inserts"] > 0
            ev = sum(g._gpu_caches[("dynamic", 0)].stats(f"hps_et.m.t{i}")["evictions"] for i in range(len(tabs)))
            assert ev > 0, "the caches (5 % of the rows) must have evicted"


@needs_cache
def test_lookup_many_concurrent_with_updates(tmp_path, rng):
    """Threads send many-table requests (host and device keys) while the main thread updates a
    hot key set of two tables in versions: every row is one its key held; after an update
    returns, a new request sees it exactly."""
    tabs = [Tab(tmp_path / "a", rng, 6000, 32), Tab(tmp_path / "b", rng, 4000, 16), Tab(tmp_path / "c", rng, 3000, 8)]
    hot = [t.keys[:300] for t in tabs]
    versions = [[t.vectors[:300]] for t in tabs]
    pos = [{int(k): i for i, k in enumerate(t.keys)} for t in tabs]
    dev = _dev()
    errors = []
    stop = threading.Event()
    lock = threading.Lock()
    with ParameterServer(_json(tabs, per=0.1, thr=0.95), gpu_cache=True) as ps:
        def reader(seed):
            r = np.random.default_rng(seed)
            i = 0
            while not stop.is_set() and not errors:
                qs = [np.concatenate([h[r.integers(0, 300, 200)], t.keys[r.integers(0, t.keys.size, 500)]])
                      for h, t in zip(hot, tabs)]
                try:
                    rows = ps.lookup_many("m", qs) if i % 2 else \
                        [dev.get(x) for x in ps.lookup_many("m", [dev.put(q) for q in qs], device=0)]
                except Exception as e:  # reported by the main thread
                    errors.append(repr(e))
                    return
                with lock:
                    vs = [list(v) for v in versions]
                for t, (q, rw) in enumerate(zip(qs, rows)):
                    for j, k in enumerate(q):
                        p = pos[t][int(k)]
                        if p < 300:
                            if not any(np.array_equal(rw[j], v[p]) for v in vs[t]):
                                errors.append(f"table {t} hot key {k}: a row it never held")
                        elif not np.array_equal(rw[j], tabs[t].vectors[p]):
                            errors.append(f"table {t} key {k}: wrong row")
                i += 1

        threads = [threading.Thread(target=reader, args=(int(s),)) for s in rng.integers(0, 2**31, 3)]
        for th in threads:
            th.start()
        try:
            for _ in range(6):
                for t in (0, 1):
                    new = rng.standard_normal((300, tabs[t].dim)).astype(np.float32)
                    with lock:
                        versions[t].append(new)
                    ps.update("m", t, hot[t], new)
                got = ps.lookup_many("m", hot)
                dgot = ps.lookup_many("m", [dev.put(h) for h in hot], device=0)
                for t in range(3):
                    np.testing.assert_array_equal(got[t], versions[t][-1])
                    np.testing.assert_array_equal(dev.get(dgot[t]), versions[t][-1])
        finally:
            stop.set()
            for th in threads:
                th.join()
        assert not errors, errors[:5]


@needs_cache
def test_cuda_cache_lookup_matches_per_cache_lookups(rng):
    """CudaCacheLookup (several caches, one synchronization) gives each cache's rows and miss
    positions of its own lookup(); an empty table; clear errors for bad arguments."""
    core, dev, _ = gpu_arrays.core_and_device("CudaEmbeddingCache")
    dims = [16, 128, 5, 16]
    caches = [core.CudaEmbeddingCache(512, d, ways=8, static=(i == 3)) for i, d in enumerate(dims)]
    keys, stream = [], dev.stream()
    for c, d in zip(caches, dims):
        k = rng.integers(-2**62, 2**62, 600, dtype=np.int64)
        c.insert(dev.put(k[:400]), dev.put(rng.standard_normal((400, d)).astype(np.float32)), stream=stream)
        q = k[rng.integers(0, 600, int(rng.integers(1, 3000)))]
        keys.append(q)
    keys[2] = np.zeros(0, np.int64)
    look = core.CudaCacheLookup(0)
    sizes = [q.size for q in keys]
    offs = list(np.cumsum([0] + [(n * d + 3) // 4 * 4 + 4 for n, d in zip(sizes, dims)])[:-1])
    out = dev.nan(int(offs[-1]) + sizes[-1] * dims[-1] + 4)
    dkeys = dev.put(np.concatenate(keys))
    missing = dev.full(sum(sizes) + 7, -5, np.int64)
    counts = look.lookup(caches, dkeys, sizes, out, [int(o) for o in offs], missing, stream=stream)
    allmiss, hout = dev.get(missing), dev.get(out)
    o = 0
    for i, (c, q, d) in enumerate(zip(caches, keys, dims)):
        ref = dev.nan((q.size, d))
        mref = dev.get(c.lookup(dev.put(q), ref, stream=stream))
        assert counts[i] == mref.size
        np.testing.assert_array_equal(allmiss[o:o + counts[i]], mref)
        got = hout[int(offs[i]):int(offs[i]) + q.size * d].reshape(q.size, d)
        np.testing.assert_array_equal(_bits(got), _bits(dev.get(ref)))
        o += q.size
    assert counts[2] == 0
    gaps = np.ones(hout.size, bool)     # nothing written outside the tables' rows
    for i, (q, d) in enumerate(zip(keys, dims)):
        gaps[int(offs[i]):int(offs[i]) + q.size * d] = False
    assert np.isnan(hout[gaps]).all()
    offs = [int(x) for x in offs]
    with pytest.raises(ValueError, match="one entry per table"):
        look.lookup(caches, dkeys, sizes[:2], out, offs, missing, stream=stream)
    with pytest.raises(ValueError, match=r"out_offsets\[1\] = 0 must be at least"):
        look.lookup(caches, dkeys, sizes, out, [0, 0] + offs[2:], missing, stream=stream)
    with pytest.raises(ValueError, match="keys must hold sum"):
        look.lookup(caches, dev.put(np.concatenate(keys + [keys[0][:1]])), sizes, out, offs, missing, stream=stream)
    with pytest.raises(ValueError, match="missing must have room"):
        look.lookup(caches, dkeys, sizes, out, offs, dev.full(3, 0, np.int64), stream=stream)
    with pytest.raises(ValueError, match="keys must have dtype int64"):
        look.lookup(caches, dev.put(np.concatenate(keys).astype(np.int32)), sizes, out, offs, missing, stream=stream)


def _split_flat(flat, sizes, dims):
    """Per-table [n, dim] host arrays of a sizes= result (rows end to end, no gaps)."""
    out, o = [], 0
    for n, d in zip(sizes, dims):
        out.append(flat[o:o + n * d].reshape(n, d))
        o += n * d
    assert o == flat.shape[0], "the flat result holds every table's rows and nothing else"
    return out


@needs_cache
@pytest.mark.parametrize("cache_type", ["dynamic", "static"])
def test_lookup_many_sizes_form(tmp_path, rng, cache_type):
    """lookup_many(flat_keys, sizes=) returns every table's rows end to end in one array (and one
    defaulted array): the bits of the list form and of the CPU-tier server, for host keys (host
    rows, or rows on a device) and device keys, with empty tables, absent keys, misses and
    evictions; bad sizes are clear errors."""
    dims = [16, 128, 5, 16, 3]
    tabs = [Tab(tmp_path / f"t{i}", rng, n, d) for i, (n, d) in enumerate(zip([5000, 3000, 2000, 2500, 1500], dims))]
    js = _json(tabs, cache_type, per=0.05, thr=0.5)
    dev = _dev()
    with ParameterServer(js, gpu_cache=True) as g, ParameterServer(js, gpu_cache=False) as c:
        for step in range(18):
            qs = _many_keys(tabs, rng, "zipf" if step % 2 else "uniform", empty=step % 5 if step % 3 == 0 else None)
            sizes = [q.size for q in qs]
            flat_keys = np.concatenate(qs)
            want = [c.lookup("m", t, q, return_defaulted=True) for t, q in enumerate(qs)]
            how = step % 3
            if how == 0:        # host keys, host rows
                rows, dflt = g.lookup_many("m", flat_keys, sizes=sizes, return_defaulted=True)
                assert isinstance(rows, np.ndarray) and isinstance(dflt, np.ndarray)
            elif how == 1:      # device keys, rows on their device (sizes as a NumPy array)
                rows, dflt = g.lookup_many("m", dev.put(flat_keys), sizes=np.array(sizes), return_defaulted=True)
                rows, dflt = dev.get(rows), dev.get(dflt)
            else:               # host keys, rows on device 0, without the defaulted flags
                rows, dflt = dev.get(g.lookup_many("m", flat_keys, sizes=sizes, device=0)), None
            assert rows.dtype == np.float32 and rows.ndim == 1
            got = _split_flat(rows, sizes, dims)
            for t, (w, wd) in enumerate(want):
                np.testing.assert_array_equal(_bits(got[t]), _bits(w), err_msg=f"step {step}, table {t}")
            if dflt is not None:
                assert dflt.shape == (flat_keys.size,)
                np.testing.assert_array_equal(dflt, np.concatenate([wd for _, wd in want]))
            lst = g.lookup_many("m", qs)
            for t in range(len(tabs)):
                np.testing.assert_array_equal(_bits(lst[t]), _bits(want[t][0]))
        g.wait_background()
        d0 = g.stats()["tiers"]["cache"]["devices"]["cuda:0"]
        assert d0["hits"] > 0 and d0["misses"] > 0
        k = np.concatenate([t.keys[:3] for t in tabs])
        with pytest.raises(HPSLookupError, match="one entry per table of model 'm' .5., got 2"):
            g.lookup_many("m", k, sizes=[3, 12])
        with pytest.raises(HPSLookupError, match="sizes sum to 14 but keys hold 15"):
            g.lookup_many("m", k, sizes=[3, 3, 3, 3, 2])
        with pytest.raises(HPSLookupError, match="sizes must be >= 0"):
            g.lookup_many("m", k, sizes=[3, 3, 3, 9, -3])
        with pytest.raises(HPSLookupError, match="sizes must be a 1-D sequence of integers"):
            g.lookup_many("m", k, sizes=[3.0, 3, 3, 3, 3])
        with pytest.raises(HPSLookupError, match="int64"):
            g.lookup_many("m", dev.put(k.astype(np.float32)), sizes=[3] * 5)
        with pytest.raises(HPSLookupError, match=r"device 1 is not one of them"):
            g.lookup_many("m", k, sizes=[3] * 5, device=1)


@needs_cache
def test_lookup_many_keys_the_fast_branch_does_not_take(tmp_path, rng):
    """Requests outside the common case (int32, non-contiguous, host-and-device mixed keys) give
    the rows of the int64 request; bad keys give the per-table errors of the general branch."""
    tabs = [Tab(tmp_path / "a", rng, 3000, 16), Tab(tmp_path / "b", rng, 2000, 8)]
    dev = _dev()
    with ParameterServer(_json(tabs, per=0.2), gpu_cache=True) as ps:
        small = [t.keys[(t.keys > -2**31) & (t.keys < 2**31)] for t in tabs]
        assert all(s.size >= 6 for s in small), "the tables hold keys in the int32 range"
        want = ps.lookup_many("m", small)
        got = ps.lookup_many("m", [dev.put(s.astype(np.int32)) for s in small])
        for w, x in zip(want, got):
            np.testing.assert_array_equal(_bits(dev.get(x)), _bits(w))
        qs = [t.keys[:400] for t in tabs]
        want = ps.lookup_many("m", qs)
        strided = [dev.put(np.repeat(q, 2))[::2] for q in qs]     # non-contiguous device keys
        for w, x in zip(want, ps.lookup_many("m", strided)):
            np.testing.assert_array_equal(_bits(dev.get(x)), _bits(w))
        mixed = ps.lookup_many("m", [qs[0], dev.put(qs[1])])     # host and device keys: rows on the device
        for w, x in zip(want, mixed):
            np.testing.assert_array_equal(_bits(dev.get(x)), _bits(w))
        with pytest.raises(HPSLookupError, match="keys must be int64 .or int32., got dtype"):
            ps.lookup_many("m", [dev.put(qs[0]), dev.put(np.ones(3, bool))])
        with pytest.raises(HPSLookupError, match="keys must be 1-D"):
            ps.lookup_many("m", [qs[0], qs[1].reshape(2, -1)])
        with pytest.raises(HPSLookupError, match="keys must be integers"):
            ps.lookup_many("m", [qs[0], qs[1].astype(np.float64)])
        with pytest.raises(HPSLookupError, match=r"device 1 is not one of them"):
            ps.lookup_many("m", qs, device=1)


def test_lookup_many_sizes_form_cpu_tier(tmp_path, rng):
    """Where the model's cache is on the CPU, lookup_many(..., sizes=) gives the per-table rows
    end to end (one flat array, one defaulted array), and checks sizes as on the GPU tier."""
    tabs = [Tab(tmp_path / "a", rng, 800, 8), Tab(tmp_path / "b", rng, 600, 3), Tab(tmp_path / "c", rng, 300, 4)]
    with ParameterServer(_json(tabs), gpu_cache=False) as ps:
        qs = [tabs[0].stream(500, "zipf"), np.zeros(0, np.int64), tabs[2].stream(70, "uniform")]
        sizes = [q.size for q in qs]
        rows, dflt = ps.lookup_many("m", np.concatenate(qs), sizes=sizes, return_defaulted=True)
        got = _split_flat(rows, sizes, [8, 3, 4])
        for t, q in enumerate(qs):
            w, wd = ps.lookup("m", t, q, return_defaulted=True)
            np.testing.assert_array_equal(_bits(got[t]), _bits(w))
        np.testing.assert_array_equal(dflt, np.concatenate([ps.lookup("m", t, q, return_defaulted=True)[1]
                                                            for t, q in enumerate(qs)]))
        assert dflt.any(), "the streams hold absent keys"
        np.testing.assert_array_equal(ps.lookup_many("m", np.concatenate(qs), sizes=np.array(sizes)), rows)
        with pytest.raises(HPSLookupError, match="one entry per table of model 'm' .3., got 2"):
            ps.lookup_many("m", np.concatenate(qs), sizes=sizes[:2])
        with pytest.raises(HPSLookupError, match="sizes sum to"):
            ps.lookup_many("m", np.concatenate(qs), sizes=[1, 1, 1])
        with pytest.raises(HPSLookupError, match="unknown model 'x'"):
            ps.lookup_many("x", np.concatenate(qs), sizes=sizes)


def test_lookup_many_cpu_tier(tmp_path, rng):
    """Where a model's cache is on the CPU, lookup_many answers table by table, as lookup does."""
    tabs = [Tab(tmp_path / "a", rng, 800, 8), Tab(tmp_path / "b", rng, 600, 3)]
    with ParameterServer(_json(tabs), gpu_cache=False) as ps:
        qs = [t.stream(500, "zipf") for t in tabs]
        rows, dflt = ps.lookup_many("m", qs, return_defaulted=True)
        for t, q in enumerate(qs):
            w, wd = ps.lookup("m", t, q, return_defaulted=True)
            np.testing.assert_array_equal(_bits(rows[t]), _bits(w))
            np.testing.assert_array_equal(dflt[t], wd)
        d = ps.lookup_many("m", {1: qs[1]})
        assert list(d) == [1]
        np.testing.assert_array_equal(d[1], rows[1])
        with pytest.raises(HPSLookupError, match="list .one array per table. or a dict"):
            ps.lookup_many("m", qs[0])
        with pytest.raises(HPSLookupError, match="has no table_id 5"):
            ps.lookup_many("m", {5: qs[0]})
