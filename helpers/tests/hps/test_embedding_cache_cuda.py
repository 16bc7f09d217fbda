"""The HPS embedding cache on the GPU (csrc/core/embedding_cache_cuda.cu) through `CudaEmbeddingCache`.

Compared with the CPU cache (itself checked against a Python model in test_embedding_cache.py)
on fresh random keys with duplicates, negative and huge keys. Where no set overflows, both must
hold exactly the same keys and rows (the GPU's threads may fill a set's ways in another order,
which only matters once a set is full). Under eviction, every row the GPU returns must be the
last row inserted for that key, bit for bit (never stale, never another key's), the size stays
within the capacity, and the miss list agrees with the hit mask. Outputs are poisoned with NaN,
so a miss whose row was written, or a hit whose row was not, fails.

Skipped, with the reason, when the module was built without CUDA, when neither PyTorch nor CuPy
is importable, or when no GPU is visible.
"""
import numpy as np
import pytest

from gpu_arrays import core_and_device

core, DEV, _ = core_and_device("CudaEmbeddingCache")
pytestmark = pytest.mark.needs_gpu("CudaEmbeddingCache")


def make_universe(rng, size):
    """Sorted unique keys (negative and huge ones too); value_of() encodes their index."""
    global UNIVERSE
    u = rng.integers(-(2**62), 2**62, size=size, dtype=np.int64)
    u[: size // 4] = rng.integers(-1, size, size=size // 4)
    u[0], u[1] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    UNIVERSE = np.unique(u)
    return UNIVERSE


UNIVERSE = None


def value_of(keys, version, dim):
    """One row per (key, version) (version < 64): column 0 = 64 * (key's index in the sorted
    universe) + version, exact in float32, so any two keys or versions differ there."""
    idx = np.searchsorted(UNIVERSE, keys) if UNIVERSE is not None else np.abs(keys) % 100003
    base = (idx.astype(np.float64) * 64 + version).astype(np.float32)
    return (base[:, None] + np.arange(dim, dtype=np.float32)[None, :] / 8).astype(np.float32)


def gpu_lookup(cache, keys):
    out = DEV.nan((len(keys), cache.dim))
    mask = DEV.full(len(keys), 7, np.uint8)
    d_keys = DEV.put(keys)
    cache.lookup_mask(d_keys, out, mask, stream=DEV.stream())
    out_mask = DEV.get(out)
    hit = DEV.get(mask)
    assert set(np.unique(hit).tolist()) <= {0, 1}, "hit_mask has values other than 0/1 (unwritten)"
    out2 = DEV.nan((len(keys), cache.dim))
    missing = DEV.get(cache.lookup(d_keys, out2, stream=DEV.stream()))
    np.testing.assert_array_equal(missing, np.flatnonzero(hit == 0), err_msg="lookup() misses != lookup_mask() misses")
    out2 = DEV.get(out2)
    assert np.array_equal(out_mask, out2, equal_nan=True)
    assert np.isnan(out2[hit == 0]).all(), "a miss had its row written"
    assert not np.isnan(out2[hit == 1]).any(), "a hit's row was not written"
    return out2, hit.astype(bool)


@pytest.mark.parametrize("dim,ways", [(16, 8), (128, 8), (5, 4), (33, 16), (1, 32)])
def test_matches_cpu_cache_without_overflow(rng, dim, ways):
    universe = make_universe(rng, 5000)
    cpu = core.EmbeddingCache(3000, dim, ways=ways, num_threads=1)
    # Keep only keys whose set does not overflow: the CPU cache keeps exactly those.
    cpu.insert(universe, value_of(universe, 0, dim))
    probe = np.empty((len(universe), dim), np.float32)
    survivors = np.delete(universe, cpu.lookup(universe, probe))
    cpu.clear()
    gpu = core.CudaEmbeddingCache(3000, dim, ways=ways)
    assert gpu.capacity == cpu.capacity and gpu.num_sets == cpu.num_sets
    for version in range(1, 6):
        keys = survivors[rng.integers(0, len(survivors), size=int(rng.integers(1, 3000)))]  # duplicates
        vals = value_of(keys, version, dim)
        assert gpu.insert(DEV.put(keys), DEV.put(vals), stream=DEV.stream()) == cpu.insert(keys, vals)
        if version % 2 == 0:
            upd = survivors[rng.integers(0, len(survivors), size=500)]
            uv = value_of(upd, 32 + version, dim)
            assert gpu.update(DEV.put(upd), DEV.put(uv), stream=DEV.stream()) == cpu.update(upd, uv)
            # (a repeated key in one update carries one row, so "which wins" cannot differ)
        if version == 3:
            er = survivors[rng.integers(0, len(survivors), size=300)]
            assert gpu.erase(DEV.put(er), stream=DEV.stream()) == cpu.erase(er)
        query = np.concatenate([universe[rng.integers(0, len(universe), size=4000)], survivors[:50]])
        got, hit = gpu_lookup(gpu, query)
        ref = np.full((len(query), dim), np.nan, np.float32)
        ref_missing = cpu.lookup(query, ref)
        np.testing.assert_array_equal(np.flatnonzero(~hit), ref_missing)
        assert np.array_equal(got, ref, equal_nan=True)
        assert gpu.size() == cpu.size()
    st = gpu.stats()
    assert st["evictions"] == 0 and st["hits"] > 0 and st["misses"] > 0
    gpu.clear()
    assert gpu.size() == 0
    assert gpu_lookup(gpu, survivors)[1].sum() == 0


@pytest.mark.parametrize("dim", [16, 128, 7])
def test_eviction_keeps_capacity_and_never_returns_stale_rows(rng, dim):
    universe = make_universe(rng, 20000)
    gpu = core.CudaEmbeddingCache(2000, dim, ways=8)
    latest = {}
    for version in range(1, 9):
        keys = universe[rng.integers(0, len(universe), size=int(rng.integers(1000, 6000)))]
        vals = value_of(keys, version, dim)  # a repeated key carries the same row within a call
        gpu.insert(DEV.put(keys), DEV.put(vals), stream=DEV.stream())
        for k, row in zip(keys.tolist(), vals):
            latest[k] = row
        assert gpu.size() <= gpu.capacity
        query = universe[rng.integers(0, len(universe), size=8000)]
        got, hit = gpu_lookup(gpu, query)
        for i in np.flatnonzero(hit):
            k = int(query[i])
            assert k in latest, f"key {k} was never inserted but was found"
            np.testing.assert_array_equal(got[i], latest[k], err_msg=f"stale or foreign row for key {k}")
    got, hit = gpu_lookup(gpu, universe)
    assert hit.sum() == gpu.size()
    assert gpu.stats()["evictions"] > 0


# Where a dynamic cache keeps its stamps (embedding_cache.h): beside the set's tags at dims <= 16
# that are multiples of 4 (4), in 16-byte slot words beside a copy of the key otherwise (7, not a
# multiple of 4; 128) while the cache has fewer than 65,536 sets, in 8-byte proof words (48 bits
# of the key's hash and the stamp) from 65,536 sets on (test_proof_words_*).
LRU_DIMS = [4, 7, 128]
PROOF_SETS = 1 << 16


def fmix64_np(k):
    """cache_mix64 (embedding_cache.h) on a uint64 array, wrapping like the C++."""
    k = k.astype(np.uint64)
    with np.errstate(over="ignore"):
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xFF51AFD7ED558CCD)
        k ^= k >> np.uint64(33)
        k *= np.uint64(0xC4CEB9FE1A85EC53)
        k ^= k >> np.uint64(33)
    return k


@pytest.mark.parametrize("dim", [7, 128])
def test_proof_words_match_cpu_cache(rng, dim):
    """From 65,536 sets on, a dynamic cache at dims > 16 proves a key by 48 bits of its hash: the
    same keys and rows as the CPU cache (which compares whole keys) under inserts, overwrites,
    updates, erases and evictions, with absent keys, negative and huge ones among the queries."""
    universe = make_universe(rng, 1_500_000)
    cap = PROOF_SETS * 8
    gpu = core.CudaEmbeddingCache(cap, dim, ways=8)
    cpu = core.EmbeddingCache(cap, dim, ways=8, num_threads=1)
    assert gpu.num_sets == cpu.num_sets == PROOF_SETS
    present = universe[rng.permutation(len(universe))[:700_000]]  # the rest is never inserted
    for version in range(1, 4):
        # one insert per row of a set: the GPU's threads fill a set's free ways in another order
        # than the CPU, so the calls are cut so that no call stores two keys of one set
        keys = np.unique(present[rng.integers(0, len(present), size=300_000)])
        sets = (fmix64_np(keys) >> np.uint64(48)).astype(np.int64)  # 65,536 sets: the high 16 bits
        order = np.lexsort((keys, sets))
        rank = np.empty(len(keys), np.int64)
        first = np.r_[0, np.flatnonzero(np.diff(sets[order])) + 1]
        rank[order] = np.arange(len(keys)) - np.repeat(first, np.diff(np.r_[first, len(keys)]))
        for r in range(int(rank.max()) + 1):
            part = keys[rank == r]
            vals = value_of(part, version, dim)
            assert gpu.insert(DEV.put(part), DEV.put(vals), stream=DEV.stream()) == cpu.insert(part, vals)
        upd = present[rng.integers(0, len(present), size=20_000)]
        uv = value_of(upd, 32 + version, dim)
        assert gpu.update(DEV.put(upd), DEV.put(uv), stream=DEV.stream()) == cpu.update(upd, uv)
        er = present[rng.integers(0, len(present), size=5_000)]
        assert gpu.erase(DEV.put(er), stream=DEV.stream()) == cpu.erase(er)
        query = universe[rng.integers(0, len(universe), size=200_000)]
        got, hit = gpu_lookup(gpu, query)
        ref = np.full((len(query), dim), np.nan, np.float32)
        np.testing.assert_array_equal(np.flatnonzero(~hit), cpu.lookup(query, ref))
        assert np.array_equal(got, ref, equal_nan=True)
        assert gpu.size() == cpu.size()
    st = gpu.stats()
    assert st["evictions"] > 0 and st["hits"] > 0 and st["misses"] > 0


def one_set_keys(count):
    """`count` distinct keys (negative ones too) that share one set of a cache of 65,536 sets
    (the set is the hash's high 16 bits there)."""
    cand = np.arange(-(1 << 23), 1 << 23, dtype=np.int64)
    sets = (fmix64_np(cand) >> np.uint64(48)).astype(np.int64)
    hits = cand[sets == sets[0]]
    assert len(hits) >= count
    return hits[:count]


@pytest.mark.parametrize("dim", [7, 128])
def test_proof_words_keep_the_lru_order(dim):
    """The eviction sequence of test_lru_clock_advances_per_insert_only, in one set of a cache of
    65,536 sets of 4 ways (its stamps in proof words)."""
    from test_embedding_cache import LRU_EXPECTED_1, lru_scenario_1

    global UNIVERSE
    UNIVERSE = None
    gpu = core.CudaEmbeddingCache(4 * PROOF_SETS, dim, ways=4)
    assert gpu.num_sets == PROOF_SETS
    big = dict(zip(range(10, 17), one_set_keys(7).tolist()))
    insert, missing = gpu_lru_calls(gpu, dim)
    assert lru_scenario_1(lambda ks: insert([big[k] for k in ks]), lambda ks: missing([big[k] for k in ks])) == \
        LRU_EXPECTED_1


@pytest.mark.parametrize("dim", LRU_DIMS)
def test_lru_across_calls_keeps_the_touched_keys(dim):
    """One set of 4 ways: a key looked up in a later call outlives older untouched keys."""
    global UNIVERSE
    UNIVERSE = np.arange(100, dtype=np.int64)
    gpu = core.CudaEmbeddingCache(4, dim, ways=4)
    assert gpu.num_sets == 1
    for i, k in enumerate([10, 11, 12, 13]):  # one call each: distinct epochs
        gpu.insert(DEV.put(np.array([k], np.int64)), DEV.put(value_of(np.array([k]), i, dim)), stream=DEV.stream())
    gpu_lookup(gpu, np.array([10], np.int64))  # 10 becomes the most recent (lookup_mask + lookup)
    gpu.insert(DEV.put(np.array([14, 15], np.int64)), DEV.put(value_of(np.array([14, 15]), 9, dim)),
               stream=DEV.stream())
    _, hit = gpu_lookup(gpu, np.array([10, 11, 12, 13, 14, 15], np.int64))
    assert hit[0] and hit[4] and hit[5] and not hit[1] and hit.sum() == 4


def gpu_lru_calls(gpu, dim=4):
    def insert(keys):
        k = np.array(keys, np.int64)
        gpu.insert(DEV.put(k), DEV.put(np.tile(k[:, None].astype(np.float32), (1, dim))), stream=DEV.stream())

    def missing(keys):
        return np.flatnonzero(~gpu_lookup(gpu, np.array(keys, np.int64))[1]).tolist()

    return insert, missing


@pytest.mark.parametrize("dim", LRU_DIMS)
def test_lru_clock_advances_per_insert_only(dim):
    """The eviction order of embedding_cache.h, the same sequences as the CPU cache's test (where
    the expected outcomes are explained): touches between two insert() calls tie, repeated lookups
    age nothing, rows stored by insert() are newer than earlier touches and older than later ones."""
    from test_embedding_cache import LRU_EXPECTED_1, LRU_EXPECTED_2, lru_scenario_1, lru_scenario_2

    global UNIVERSE
    UNIVERSE = None
    scenarios = [(lru_scenario_1, LRU_EXPECTED_1)]
    # Scenario 2 starts with four keys in one insert() call, and its tie-breaks (the lowest way)
    # assume they take ways 0..3 in input order. They do where their write groups share a warp
    # (dims 4 and 7: groups of 4 and 8 lanes); at dim 128 each key's group is a warp of its own
    # and the order is the scheduler's (the CPU cache's test covers that scenario).
    if dim <= 16:
        scenarios.append((lru_scenario_2, LRU_EXPECTED_2))
    for scenario, expected in scenarios:
        gpu = core.CudaEmbeddingCache(4, dim, ways=4)
        assert gpu.num_sets == 1
        assert scenario(*gpu_lru_calls(gpu, dim)) == expected


@pytest.mark.parametrize("dim", LRU_DIMS)
def test_advance_epoch_orders_lookups_like_an_insert(dim):
    """advance_epoch() moves the clock as insert() does: a hit after it is newer than one before."""
    global UNIVERSE
    UNIVERSE = None
    results = []
    for advance in [False, True]:
        gpu = core.CudaEmbeddingCache(4, dim, ways=4)
        insert, missing = gpu_lru_calls(gpu, dim)
        for k in [10, 11, 12, 13]:  # one call each, so that they take ways 0..3 at every dim
            insert([k])
        missing([12])
        if advance:
            gpu.advance_epoch(stream=DEV.stream())
        missing([10])
        insert([14])  # evicts 11
        insert([15])  # evicts 13
        insert([16])  # 10 and 12: a tie without the advance (10, the lower way, goes), else 12 is older
        results.append(missing([10, 11, 12, 13, 14, 15, 16]))
    assert results == [[0, 1, 3], [1, 2, 3]]


@pytest.mark.parametrize("dim", [16, 128])
def test_static_cache(rng, dim):
    universe = make_universe(rng, 4000)
    gpu = core.CudaEmbeddingCache(1000, dim, ways=8, static=True)
    cpu = core.EmbeddingCache(1000, dim, ways=8, static=True, num_threads=1)
    keys = universe[:600]  # few enough that ways fill in any order without overflow: compare exactly
    vals = value_of(keys, 1, dim)
    cpu.insert(keys, vals)
    probe = np.empty((len(keys), dim), np.float32)
    keys = np.delete(keys, cpu.lookup(keys, probe))
    vals = value_of(keys, 1, dim)
    gpu.insert(DEV.put(keys), DEV.put(vals), stream=DEV.stream())
    # A second insert of the same keys with other rows changes nothing (static: no overwrite).
    assert gpu.insert(DEV.put(keys), DEV.put(value_of(keys, 2, dim)), stream=DEV.stream()) == 0
    got, hit = gpu_lookup(gpu, keys)
    assert hit.all()
    np.testing.assert_array_equal(got, vals)
    with pytest.raises(ValueError, match="static"):
        gpu.update(DEV.put(keys), DEV.put(vals), stream=DEV.stream())
    with pytest.raises(ValueError, match="static"):
        gpu.erase(DEV.put(keys), stream=DEV.stream())
    # Fill until sets are full: nothing is evicted, extra keys are rejected.
    more = universe[600:]
    gpu.insert(DEV.put(more), DEV.put(value_of(more, 3, dim)), stream=DEV.stream())
    st = gpu.stats()
    assert st["evictions"] == 0 and st["rejected"] > 0 and gpu.size() <= gpu.capacity
    got, hit = gpu_lookup(gpu, keys)
    assert hit.all()
    np.testing.assert_array_equal(got, vals)


def test_bad_arguments_raise():
    gpu = core.CudaEmbeddingCache(64, 4)
    keys = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="keys must be a CUDA device array"):
        gpu.insert(keys, DEV.put(np.zeros((4, 4), np.float32)))
    with pytest.raises(ValueError, match="keys must have dtype int64, got int32"):
        gpu.lookup_mask(DEV.put(keys.astype(np.int32)), DEV.nan((4, 4)))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 4\)"):
        gpu.lookup_mask(DEV.put(keys), DEV.nan((4, 3)))
    with pytest.raises(ValueError, match="ways must be in"):
        core.CudaEmbeddingCache(64, 4, ways=64)
    assert gpu.size() == 0


def test_empty_batches():
    gpu = core.CudaEmbeddingCache(64, 8)
    e = np.zeros(0, np.int64)
    assert gpu.insert(DEV.put(e), DEV.put(np.zeros((0, 8), np.float32)), stream=DEV.stream()) == 0
    missing = DEV.get(gpu.lookup(DEV.put(e), DEV.nan((0, 8)), stream=DEV.stream()))
    assert len(missing) == 0
