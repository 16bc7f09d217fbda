"""The HPS embedding cache on the CPU (csrc/core/embedding_cache_cpu.cc) through `EmbeddingCache`.

The oracle is a pure-Python model of the same set-associative cache: the same key -> set hash,
the same way choice (lowest free way, else the way with the oldest access epoch, lowest way on a
tie) and the same epochs (lookups and update() stamp with the epoch C, insert() with C + 1 and then
advances C by 2: LRU at the granularity of insert() calls). After every call the
cache must agree with the model exactly: which positions miss, and the bits of every row it
returns, on fresh random keys (negative and huge ones too) with duplicates in each batch. Rows
not found must be left untouched (outputs are poisoned with NaN first).

Concurrency: several Python threads look up, insert, update and erase at once (the binding
releases the GIL); every row a reader gets must be exactly a row some writer stored for that key
(rows encode key and version; a torn or foreign row fails), or a miss.
"""
import threading
import time

import numpy as np
import pytest

from gpu_arrays import load_core


core = load_core()


# ---- the oracle: a Python model of the cache ---------------------------------------------------

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1


def fmix64(k):
    k &= M64
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & M64
    k ^= k >> 33
    return k


def set_of(key, num_sets):
    return (fmix64(int(key)) * num_sets) >> 64


class CacheModel:
    """What the cache must hold: per set, `ways` slots of [key, stamp, row] or None."""

    def __init__(self, num_sets, ways, static):
        self.num_sets, self.ways, self.static = num_sets, ways, static
        self.sets = [[None] * ways for _ in range(num_sets)]
        self.epoch = 1

    def _insert_epoch(self):
        e = (self.epoch + 1) & M32
        self.epoch = (self.epoch + 2) & M32
        return e

    def _find(self, key):
        s = self.sets[set_of(key, self.num_sets)]
        for w, slot in enumerate(s):
            if slot is not None and slot[0] == key:
                return s, w
        return s, -1

    def lookup(self, keys, dim):
        out = np.full((len(keys), dim), np.nan, np.float32)
        if len(keys) == 0:
            return out, np.zeros(0, np.int64)
        e = None if self.static else self.epoch
        missing = []
        for i, k in enumerate(keys.tolist()):
            s, w = self._find(k)
            if w < 0:
                missing.append(i)
            else:
                out[i] = s[w][2]
                if e is not None:
                    s[w][1] = e
        return out, np.array(missing, np.int64)

    def insert(self, keys, values):
        if len(keys) == 0:
            return 0, 0, 0
        e = self._insert_epoch()
        stored = rejected = evicted = 0
        for i, k in enumerate(keys.tolist()):
            s, w = self._find(k)
            if w >= 0:
                if not self.static:
                    s[w][1], s[w][2] = e, values[i].copy()
                    stored += 1
                continue
            free = [j for j, slot in enumerate(s) if slot is None]
            if free:
                w = free[0]
            elif not self.static:
                ages = [(e - slot[1]) & M32 for slot in s]
                w = ages.index(max(ages))
                evicted += 1
            else:
                rejected += 1
                continue
            s[w] = [k, e, values[i].copy()]
            stored += 1
        return stored, evicted, rejected

    def update(self, keys, values):
        e = self.epoch
        present = 0
        for i, k in enumerate(keys.tolist()):
            s, w = self._find(k)
            if w >= 0:
                s[w][1], s[w][2] = e, values[i].copy()
                present += 1
        return present

    def erase(self, keys):
        removed = 0
        for k in keys.tolist():
            s, w = self._find(k)
            if w >= 0:
                s[w] = None
                removed += 1
        return removed

    def size(self):
        return sum(slot is not None for s in self.sets for slot in s)


def random_keys(rng, n, universe):
    """n keys drawn from `universe` (with duplicates), some negative or huge."""
    return universe[rng.integers(0, len(universe), size=n)]


def make_universe(rng, size):
    u = rng.integers(-(2**62), 2**62, size=size, dtype=np.int64)
    u[: size // 4] = rng.integers(-1, size, size=size // 4)  # small keys, 0 and -1 among them
    u[0], u[1] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return np.unique(u)


def check_lookup(cache, model, keys):
    dim = cache.dim
    out = np.full((len(keys), dim), np.nan, np.float32)
    missing = cache.lookup(keys, out)
    ref_out, ref_missing = model.lookup(keys, dim)
    np.testing.assert_array_equal(missing, ref_missing, err_msg="missing positions differ from the model")
    assert np.array_equal(out, ref_out, equal_nan=True), "returned rows differ from the model (or a miss was written)"


# ---- against the model -----------------------------------------------------------------------------

@pytest.mark.parametrize("ways,dim,num_threads", [(8, 16, 0), (16, 5, 1), (1, 128, 2), (4, 33, 0), (32, 8, 2)])
def test_dynamic_cache_matches_model(rng, ways, dim, num_threads):
    universe = make_universe(rng, 3000)
    cache = core.EmbeddingCache(int(rng.integers(200, 800)), dim, ways=ways, num_threads=num_threads)
    model = CacheModel(cache.num_sets, ways, static=False)
    assert cache.capacity == cache.num_sets * ways >= 200
    for step in range(40):
        op = rng.choice(["insert", "insert", "lookup", "update", "erase"])
        n = int(rng.choice([0, 1, 7, 300, 2500]))
        keys = random_keys(rng, n, universe)
        if op == "insert":
            values = rng.standard_normal((n, dim)).astype(np.float32)
            before = cache.stats()
            stored = cache.insert(keys, values)
            ref_stored, ref_evicted, _ = model.insert(keys, values)
            assert stored == ref_stored
            assert cache.stats()["evictions"] - before["evictions"] == ref_evicted
        elif op == "update":
            values = rng.standard_normal((n, dim)).astype(np.float32)
            assert cache.update(keys, values) == model.update(keys, values)
        elif op == "erase":
            assert cache.erase(keys) == model.erase(keys)
        else:
            check_lookup(cache, model, keys)
        assert cache.size() == model.size() <= cache.capacity
        check_lookup(cache, model, random_keys(rng, 500, universe))
    # The random ops may never have overfilled a set: one insert of more keys than the capacity does.
    keys = random_keys(rng, 4 * cache.capacity, universe)
    values = rng.standard_normal((len(keys), dim)).astype(np.float32)
    assert cache.insert(keys, values) == model.insert(keys, values)[0]
    check_lookup(cache, model, random_keys(rng, 500, universe))
    st = cache.stats()
    assert st["hits"] + st["misses"] > 0 and st["evictions"] > 0
    cache.clear()
    assert cache.size() == 0
    out = np.zeros((len(universe), dim), np.float32)
    assert len(cache.lookup(universe, out)) == len(universe)


def test_lookup_returns_last_value_of_duplicates_and_touches_lru(rng):
    """Within one insert the last value of a repeated key wins; a looked-up key survives eviction."""
    dim, ways = 4, 4
    cache = core.EmbeddingCache(ways, dim, ways=ways)  # one set of 4 ways
    assert cache.num_sets == 1
    keys = np.array([10, 11, 10, 12, 13, 10], np.int64)
    vals = rng.standard_normal((6, dim)).astype(np.float32)
    cache.insert(keys, vals)
    out = np.full((1, dim), np.nan, np.float32)
    assert len(cache.lookup(np.array([10], np.int64), out)) == 0
    np.testing.assert_array_equal(out[0], vals[5])
    # Touch 11, then insert one new key: the least recently used (12, then 13) go first.
    cache.lookup(np.array([11], np.int64), np.empty((1, dim), np.float32))
    cache.insert(np.array([14], np.int64), vals[:1])
    got = np.empty((5, dim), np.float32)
    missing = cache.lookup(np.array([10, 11, 12, 13, 14], np.int64), got)
    np.testing.assert_array_equal(missing, [2])


def lru_scenario_1(insert, missing):
    """An eviction sequence on a cache of one set of 4 ways (embedding_cache.h, Eviction):
    insert(keys) and missing(keys) -> miss positions run the cache's calls; returns the final
    miss positions (LRU_EXPECTED_1). Also run on the GPU (test_embedding_cache_cuda.py)."""
    # Touches between two insert() calls count as simultaneous and repeated lookups age
    #    nothing: 12 is looked up before 10 and again five times, yet when the two tie as the
    #    oldest, the lowest way (10's, way 0) goes, where an LRU by lookup call would drop 12.
    for k in [10, 11, 12, 13]:  # one insert each: ways 0..3, 10 oldest
        insert([k])
    missing([12])
    missing([10])
    for _ in range(5):
        missing([12])
    insert([14])  # evicts 11 (untouched since its insert)
    insert([15])  # evicts 13
    insert([16])  # 10 and 12 tie as the oldest: evicts 10 (the lowest way)
    return missing([10, 11, 12, 13, 14, 15, 16])


LRU_EXPECTED_1 = [0, 1, 3]


def lru_scenario_2(insert, missing):
    """A row stored by insert() is newer than every row touched before that call and older than
    every row touched after it."""
    insert([10, 11, 12, 13])  # one call: all four tie
    missing([11])
    insert([14])  # evicts 10 (lowest of the untouched ties)
    missing([13])
    insert([15])  # evicts 12 (untouched); then come 11 (touched before 14 was stored), 14, 13
    insert([16])  # evicts 11: 14, stored after 11's touch, is newer
    return missing([10, 11, 12, 13, 14, 15, 16])


LRU_EXPECTED_2 = [0, 1, 2]


def test_lru_clock_advances_per_insert_only():
    dim = 4
    for scenario, expected in [(lru_scenario_1, LRU_EXPECTED_1), (lru_scenario_2, LRU_EXPECTED_2)]:
        cache = core.EmbeddingCache(4, dim, ways=4)
        assert cache.num_sets == 1

        def insert(keys):
            k = np.array(keys, np.int64)
            cache.insert(k, np.tile(k[:, None].astype(np.float32), (1, dim)))

        def missing(keys):
            out = np.full((len(keys), dim), np.nan, np.float32)
            return cache.lookup(np.array(keys, np.int64), out).tolist()

        assert scenario(insert, missing) == expected


def test_static_cache_fills_free_ways_only_and_is_read_only(rng):
    dim, ways = 8, 4
    universe = make_universe(rng, 2000)
    cache = core.EmbeddingCache(300, dim, ways=ways, static=True, num_threads=2)
    assert cache.static
    model = CacheModel(cache.num_sets, ways, static=True)
    for _ in range(4):
        keys = random_keys(rng, 800, universe)
        values = rng.standard_normal((800, dim)).astype(np.float32)
        stored = cache.insert(keys, values)
        assert (stored, 0) == model.insert(keys, values)[:2]
        check_lookup(cache, model, random_keys(rng, 1500, universe))
    st = cache.stats()
    assert st["evictions"] == 0 and st["rejected"] > 0 and cache.size() == model.size()
    keys = random_keys(rng, 10, universe)
    with pytest.raises(ValueError, match="static"):
        cache.update(keys, np.zeros((10, dim), np.float32))
    with pytest.raises(ValueError, match="static"):
        cache.erase(keys)
    check_lookup(cache, model, universe)  # nothing changed


@pytest.mark.parametrize("num_threads", [1, 2])
def test_results_do_not_depend_on_thread_count(rng, num_threads):
    dim = 16
    universe = make_universe(rng, 20000)
    keys = random_keys(rng, 30000, universe)
    values = rng.standard_normal((len(keys), dim)).astype(np.float32)
    a = core.EmbeddingCache(8000, dim, num_threads=num_threads)
    b = core.EmbeddingCache(8000, dim, num_threads=1)
    a.insert(keys, values)
    b.insert(keys, values)
    outa = np.full((len(universe), dim), np.nan, np.float32)
    outb = outa.copy()
    np.testing.assert_array_equal(a.lookup(universe, outa), b.lookup(universe, outb))
    assert np.array_equal(outa, outb, equal_nan=True)


def test_bad_arguments_raise_and_change_nothing():
    cache = core.EmbeddingCache(64, 4)
    keys = np.arange(5, dtype=np.int64)
    cache.insert(keys, np.ones((5, 4), np.float32))
    out = np.empty((5, 4), np.float32)
    with pytest.raises(ValueError, match="keys must have dtype int64, got int32"):
        cache.lookup(keys.astype(np.int32), out)
    with pytest.raises(ValueError, match=r"out must have shape \(5, 4\)"):
        cache.lookup(keys, np.empty((5, 3), np.float32))
    with pytest.raises(ValueError, match="values must have dtype float32, got float64"):
        cache.insert(keys, np.ones((5, 4)))
    with pytest.raises(ValueError, match="keys must be 1-D"):
        cache.erase(keys.reshape(1, 5))
    with pytest.raises(ValueError, match="C-contiguous"):
        cache.lookup(np.arange(10, dtype=np.int64)[::2], out)
    with pytest.raises(ValueError, match="ways must be in"):
        core.EmbeddingCache(64, 4, ways=33)
    with pytest.raises(ValueError, match="capacity must be >= 1, got 0"):
        core.EmbeddingCache(0, 4)
    with pytest.raises(ValueError, match="dim must be >= 1"):
        core.EmbeddingCache(8, 0)
    assert cache.size() == 5
    assert len(cache.lookup(keys, out)) == 0 and (out == 1).all()


# ---- concurrency ---------------------------------------------------------------------------------

def _row(keys, versions, dim):
    """Rows that encode (key index, version) in every element: a torn or foreign row is visible."""
    v = (keys.astype(np.int64) * 1024 + versions).astype(np.float32)
    return np.repeat(v[:, None], dim, axis=1)


@pytest.mark.parametrize("num_threads,static", [(1, False), (2, False), (1, True)])
def test_concurrent_lookups_and_writes_never_return_torn_or_foreign_rows(num_threads, static):
    dim, n_keys = 64, 4000  # key k stores rows (k * 1024 + version) for versions < 1024: exact in float32
    cache = core.EmbeddingCache(512, dim, ways=8, static=static, num_threads=num_threads)
    stop = threading.Event()
    errors = []
    seen = {"hits": 0, "lookups": 0}
    max_version = [0]

    def writer(seed):
        r = np.random.default_rng(seed)
        version = 0
        try:
            while not stop.is_set():
                version = (version + 1) % 1024
                max_version[0] = max(max_version[0], version)
                keys = r.integers(0, n_keys, size=int(r.choice([3, 50, 700])))
                op = r.integers(0, 4)
                if op <= 1 or static:
                    cache.insert(keys, _row(keys, np.full(len(keys), version), dim))
                elif op == 2:
                    cache.update(keys, _row(keys, np.full(len(keys), version), dim))
                else:
                    cache.erase(keys)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(repr(e))

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                keys = r.integers(0, n_keys, size=int(r.choice([1, 40, 900])))
                out = np.full((len(keys), dim), np.nan, np.float32)
                missing = cache.lookup(keys, out)
                hit = np.ones(len(keys), bool)
                hit[missing] = False
                assert np.isnan(out[~hit]).all(), "a miss had its row written"
                rows = out[hit]
                assert (rows == rows[:, :1]).all(), "torn row: elements from different writes"
                code = rows[:, 0].astype(np.int64)
                np.testing.assert_array_equal(code // 1024, keys[hit], err_msg="foreign row: another key's values")
                seen["hits"] += int(hit.sum())
                seen["lookups"] += len(keys)
        except Exception as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(100 + i,)) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(2.0)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert seen["hits"] > 1000 and seen["lookups"] > seen["hits"], seen
    assert cache.size() <= cache.capacity
