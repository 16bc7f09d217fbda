"""The HPS hash_map / parallel_hash_map tier (csrc/core/hash_map_store_cpu.cc) through `HashMapStore`.

Against a dict oracle on fresh random keys (negative and huge ones too, duplicates in every
batch): every row found equals the last value inserted for its key, bit for bit; erased and
never-inserted keys miss; rows not found are left untouched (outputs poisoned with NaN). With an
overflow margin, every policy keeps each partition at or under the margin after every call and
never returns a stale or foreign row; evict_least_used and evict_oldest pick exactly the victims
their definition names; evict_random picks a different sample per partition.
"""
import threading
import time

import numpy as np
import pytest

from gpu_arrays import load_core


core = load_core()
POLICIES = ["evict_random", "evict_least_used", "evict_oldest"]


def make_universe(rng, size):
    u = rng.integers(-(2**62), 2**62, size=size, dtype=np.int64)
    u[: size // 4] = rng.integers(-1, size, size=size // 4)
    u[0], u[1] = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    return np.unique(u)


def find(store, keys):
    out = np.full((len(keys), store.dim), np.nan, np.float32)
    missing = store.find(keys, out)
    hit = np.ones(len(keys), bool)
    hit[missing] = False
    assert np.all(np.diff(missing) > 0), "missing positions must be ascending and unique"
    assert np.isnan(out[~hit]).all(), "a missing key had its row written"
    return out, hit


def check_against_oracle(store, oracle, universe, exact_presence):
    out, hit = find(store, universe)
    for i, k in enumerate(universe.tolist()):
        if hit[i]:
            assert k in oracle, f"key {k} was never inserted (or was erased) but was found"
            np.testing.assert_array_equal(out[i], oracle[k], err_msg=f"stale or foreign row for key {k}")
        elif exact_presence:
            assert k not in oracle, f"key {k} was inserted and not evicted but is missing"
    return int(hit.sum())


@pytest.mark.parametrize("parallel,num_partitions,num_threads", [(True, 16, 0), (False, 1, 1), (True, 5, 2)])
def test_unlimited_store_matches_dict_oracle(rng, parallel, num_partitions, num_threads):
    dim = int(rng.choice([1, 16, 37]))
    store = core.HashMapStore(dim, num_partitions=num_partitions, parallel=parallel, num_threads=num_threads)
    universe = make_universe(rng, 4000)
    oracle = {}
    for _ in range(25):
        op = rng.choice(["insert", "insert", "erase", "find"])
        n = int(rng.choice([0, 1, 9, 500, 3000]))
        keys = universe[rng.integers(0, len(universe), size=n)]
        if op == "insert":
            values = rng.standard_normal((n, dim)).astype(np.float32)
            new = len(set(keys.tolist()) - set(oracle))
            assert store.insert(keys, values) == new
            for i, k in enumerate(keys.tolist()):  # the last value of a repeated key wins
                oracle[k] = values[i]
        elif op == "erase":
            present = len(set(keys.tolist()) & set(oracle))
            assert store.erase(keys) == present
            for k in keys.tolist():
                oracle.pop(k, None)
        else:
            find(store, keys)
        assert store.size() == len(oracle)
        check_against_oracle(store, oracle, universe, exact_presence=True)
    k, v = store.export()
    assert len(k) == len(oracle) == len(set(k.tolist()))
    for key, row in zip(k.tolist(), v):
        np.testing.assert_array_equal(row, oracle[key])
    st = store.stats()
    assert st["size"] == len(oracle) and st["evictions"] == 0
    store.clear()
    assert store.size() == 0 and find(store, universe)[1].sum() == 0


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("parallel", [True, False])
def test_every_policy_keeps_the_margin_and_never_returns_stale_rows(rng, policy, parallel):
    dim, parts, margin, target = 8, 4, 120, float(rng.choice([0.5, 0.8, 1.0]))
    store = core.HashMapStore(dim, num_partitions=parts, overflow_margin=margin, overflow_policy=policy,
                              overflow_resolution_target=target, parallel=parallel, num_threads=2)
    assert store.overflow_policy == policy
    universe = make_universe(rng, 3000)
    oracle = {}
    evicted_before = 0
    for _ in range(30):
        n = int(rng.choice([1, 40, 400]))
        keys = universe[rng.integers(0, len(universe), size=n)]
        if rng.random() < 0.8:
            values = rng.standard_normal((n, dim)).astype(np.float32)
            store.insert(keys, values)
            for i, k in enumerate(keys.tolist()):
                oracle[k] = values[i]
        else:
            store.erase(keys)
            for k in keys.tolist():
                oracle.pop(k, None)
        sizes = store.partition_sizes()
        assert max(sizes) <= margin, f"a partition holds {max(sizes)} rows, margin {margin}"
        found = check_against_oracle(store, oracle, universe, exact_presence=False)
        assert found == store.size() == sum(sizes)
        # Present keys are found; what is gone was evicted (counted).
        st = store.stats()
        assert len(oracle) - found <= st["evictions"] or found == len(oracle)
        evicted_before = st["evictions"]
    assert evicted_before > 0
    k, v = store.export()
    for key, row in zip(k.tolist(), v):
        np.testing.assert_array_equal(row, oracle[key])


def test_overflow_shrinks_to_the_resolution_target():
    store = core.HashMapStore(2, num_partitions=1, overflow_margin=100, overflow_resolution_target=0.5)
    keys = np.arange(100, dtype=np.int64)
    store.insert(keys, np.zeros((100, 2), np.float32))
    assert store.size() == 100  # at the margin, not past it
    store.insert(np.array([1000], np.int64), np.zeros((1, 2), np.float32))
    assert store.size() == 50 and store.stats()["evictions"] == 51


def test_evict_oldest_evicts_the_least_recently_accessed():
    dim = 3
    store = core.HashMapStore(dim, num_partitions=1, overflow_margin=100, overflow_policy="evict_oldest",
                              overflow_resolution_target=0.5)
    vals = lambda k: np.repeat(k.astype(np.float32)[:, None], dim, axis=1)
    for c in range(10):  # ten calls, ten access epochs: keys 0-9 oldest, 90-99 newest
        k = np.arange(10 * c, 10 * c + 10, dtype=np.int64)
        store.insert(k, vals(k))
    find(store, np.arange(10, dtype=np.int64))  # 0-9 become the most recently accessed
    new = np.array([500], np.int64)
    store.insert(new, vals(new))  # 101 rows > 100: keep 50, evict the 51 oldest = keys 10..60
    _, hit = find(store, np.arange(101, dtype=np.int64))
    expect = np.zeros(101, bool)
    expect[:10] = True
    expect[61:100] = True
    np.testing.assert_array_equal(hit, expect)
    assert find(store, new)[1].all()


def test_evict_least_used_evicts_the_fewest_accessed():
    dim = 2
    store = core.HashMapStore(dim, num_partitions=1, overflow_margin=100, overflow_policy="evict_least_used",
                              overflow_resolution_target=0.5)
    k = np.arange(100, dtype=np.int64)
    store.insert(k, np.zeros((100, dim), np.float32))
    for _ in range(2):
        find(store, k[20:70])  # keys 20-69: 3 accesses; the others 1
    store.insert(np.array([100], np.int64), np.zeros((1, dim), np.float32))  # count 1, newest slot
    # Keep 50: the 51 victims are the count-1 rows (keys 0-19, 70-100), the oldest slots first:
    # keys 0-19, 70-99 and the new key 100.
    _, hit = find(store, np.arange(101, dtype=np.int64))
    expect = np.zeros(101, bool)
    expect[20:70] = True
    np.testing.assert_array_equal(hit, expect)


def test_evict_random_keeps_a_random_subset(rng):
    store = core.HashMapStore(1, num_partitions=1, overflow_margin=1000, overflow_resolution_target=0.5)
    k = np.arange(1001, dtype=np.int64)
    store.insert(k, k.astype(np.float32)[:, None])
    out, hit = find(store, k)
    assert hit.sum() == 500
    np.testing.assert_array_equal(out[hit, 0], k[hit].astype(np.float32))
    # Not the oldest, not the newest: survivors spread over the whole range.
    assert hit[:500].sum() > 150 and hit[500:].sum() > 150


def test_partitions_split_keys_and_parallel_equals_serial(rng):
    universe = make_universe(rng, 20000)
    keys = universe[rng.integers(0, len(universe), size=30000)]
    values = rng.standard_normal((len(keys), 16)).astype(np.float32)
    a = core.HashMapStore(16, num_partitions=8, parallel=True, num_threads=2)
    b = core.HashMapStore(16, num_partitions=8, parallel=False, num_threads=1)
    a.insert(keys, values)
    b.insert(keys, values)
    parts = a.partition_of(universe)
    assert parts.min() >= 0 and parts.max() < 8 and len(np.unique(parts)) == 8
    assert a.partition_sizes() == b.partition_sizes()
    oa, ha = find(a, universe)
    ob, hb = find(b, universe)
    np.testing.assert_array_equal(ha, hb)
    assert np.array_equal(oa, ob, equal_nan=True)


def test_bad_arguments_raise_and_change_nothing():
    s = core.HashMapStore(4, num_partitions=2)
    keys = np.arange(6, dtype=np.int64)
    s.insert(keys, np.ones((6, 4), np.float32))
    with pytest.raises(ValueError, match="overflow_policy must be .* got 'lru'"):
        core.HashMapStore(4, overflow_policy="lru")
    with pytest.raises(ValueError, match=r"overflow_resolution_target must be in \(0, 1\], got 1.5"):
        core.HashMapStore(4, overflow_resolution_target=1.5)
    with pytest.raises(ValueError, match="overflow_margin must be >= 0"):
        core.HashMapStore(4, overflow_margin=-1)
    with pytest.raises(ValueError, match="num_partitions must be in"):
        core.HashMapStore(4, num_partitions=0)
    with pytest.raises(ValueError, match="dim must be >= 1, got 0"):
        core.HashMapStore(0)
    with pytest.raises(ValueError, match="keys must have dtype int64, got float64"):
        s.insert(keys.astype(np.float64), np.zeros((6, 4), np.float32))
    with pytest.raises(ValueError, match=r"values must have shape \(6, 4\)"):
        s.insert(keys, np.zeros((6, 5), np.float32))
    with pytest.raises(ValueError, match="out must have dtype float32, got float64"):
        s.find(keys, np.zeros((6, 4)))
    with pytest.raises(ValueError, match="keys must be 1-D"):
        s.erase(keys.reshape(2, 3))
    assert s.size() == 6
    out, hit = find(s, keys)
    assert hit.all() and (out == 1).all()


def test_concurrent_finds_and_inserts(rng):
    dim, n_keys = 32, 3000
    store = core.HashMapStore(dim, num_partitions=8, overflow_margin=150, overflow_policy="evict_oldest",
                              num_threads=2)
    stop = threading.Event()
    errors = []
    hits = [0]

    def rows(keys, version):
        return np.repeat((keys * 1024 + version).astype(np.float32)[:, None], dim, axis=1)

    def writer(seed):
        r = np.random.default_rng(seed)
        v = 0
        try:
            while not stop.is_set():
                v = (v + 1) % 1024
                keys = r.integers(0, n_keys, size=int(r.choice([5, 300])))
                if r.random() < 0.8:
                    store.insert(keys, rows(keys, v))
                else:
                    store.erase(keys)
                assert max(store.partition_sizes()) <= 150
        except Exception as e:  # pragma: no cover
            errors.append(repr(e))

    def reader(seed):
        r = np.random.default_rng(seed)
        try:
            while not stop.is_set():
                keys = r.integers(0, n_keys, size=int(r.choice([1, 600])))
                out, hit = find(store, keys)
                got = out[hit]
                assert (got == got[:, :1]).all(), "torn row"
                np.testing.assert_array_equal(got[:, 0].astype(np.int64) // 1024, keys[hit], err_msg="foreign row")
                hits[0] += int(hit.sum())
        except Exception as e:
            errors.append(repr(e))

    ts = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    ts += [threading.Thread(target=reader, args=(10 + i,)) for i in range(3)]
    for t in ts:
        t.start()
    time.sleep(1.5)
    stop.set()
    for t in ts:
        t.join()
    assert not errors, errors[:3]
    assert hits[0] > 100
