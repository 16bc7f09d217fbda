"""The concurrent int64 hash table (csrc/core/hash_table.h) through `_embedlab_core.HashTable`
and through the TensorFlow resource `embedlab.hash_table.HashTable`.

Every check compares with a Python dict oracle on fresh random keys (seed printed): negative
keys, 0, INT64_MIN / INT64_MAX (INT64_MIN is the slot array's empty marker, stored out of line),
duplicates within a batch, growth far past the initial capacity, erase then reinsert, and
max_size overflow (which must leave the table unchanged).
"""
import gc
import threading

import numpy as np
import pytest


I64_MIN = np.iinfo(np.int64).min
I64_MAX = np.iinfo(np.int64).max
SPECIAL = np.array([0, -1, 1, I64_MIN, I64_MAX, I64_MIN + 1, I64_MAX - 1], dtype=np.int64)


def random_keys(rng, n, pool=None):
    """n int64 keys: a mix of full-range keys, small signed keys (many duplicates) and SPECIAL."""
    if pool is None:
        pool = max(4, n // 3)
    wide = rng.integers(I64_MIN, I64_MAX, size=n, dtype=np.int64, endpoint=True)
    small = rng.integers(-pool, pool, size=n, dtype=np.int64)
    special = SPECIAL[rng.integers(0, len(SPECIAL), size=n)]
    pick = rng.integers(0, 10, size=n)
    return np.where(pick < 3, wide, np.where(pick < 9, small, special)).astype(np.int64)


def oracle_find_or_insert(oracle, keys):
    out = np.empty(len(keys), dtype=np.int64)
    for i, k in enumerate(keys.tolist()):
        v = oracle.get(k)
        if v is None:
            v = len(oracle)
            oracle[k] = v
        out[i] = v
    return out


def oracle_find(oracle, keys):
    return np.array([oracle.get(k, -1) for k in keys.tolist()], dtype=np.int64)


def assert_export_matches(table, oracle):
    keys, values = table.export()
    assert keys.dtype == np.int64 and values.dtype == np.int64
    assert len(keys) == len(oracle) == table.size() == len(table)
    assert dict(zip(keys.tolist(), values.tolist())) == oracle
    order = np.lexsort((keys, values))  # ascending value, then key
    np.testing.assert_array_equal(order, np.arange(len(keys)))


# ---- the framework-free table ------------------------------------------------------------------

def test_find_or_insert_matches_dict_oracle_through_growth(core, rng):
    table = core.HashTable(8)
    oracle = {}
    assert table.size() == 0 and len(table) == 0
    np.testing.assert_array_equal(table.find(SPECIAL), -np.ones(len(SPECIAL), np.int64))
    total = 0
    while len(oracle) < 8 * 1000:  # grows 1000x past the initial capacity of 8
        n = int(rng.integers(0, 3000))
        keys = random_keys(rng, n, pool=20000)
        want = oracle_find_or_insert(oracle, keys)
        got = table.find_or_insert(keys)
        np.testing.assert_array_equal(got, want)
        total += n
    assert table.capacity() >= 2 * table.size()
    probe = np.concatenate([random_keys(rng, 5000, pool=40000), SPECIAL])
    np.testing.assert_array_equal(table.find(probe), oracle_find(oracle, probe))
    assert_export_matches(table, oracle)


def test_large_batches_take_the_parallel_path(core, rng):
    # >= 16384 keys: the lookups are split over the thread pool; values must not depend on it.
    oracle = {}
    tables = [core.HashTable(16, num_threads=1), core.HashTable(16, num_threads=4), core.HashTable(16)]
    for _ in range(4):
        keys = random_keys(rng, int(rng.integers(16384, 60000)), pool=30000)
        want = oracle_find_or_insert(oracle, keys)
        for t in tables:
            np.testing.assert_array_equal(t.find_or_insert(keys), want)
            np.testing.assert_array_equal(t.find(keys), want)
    assert tables[1].num_threads == 4 and tables[0].num_threads == 1
    for t in tables:
        assert_export_matches(t, oracle)


def test_determinism_same_input_same_values(core, rng):
    batches = [random_keys(rng, int(rng.integers(1, 40000)), pool=50000) for _ in range(5)]
    results = []
    for threads in (1, 2, 8):
        t = core.HashTable(32, num_threads=threads)
        results.append([t.find_or_insert(b) for b in batches] + list(t.export()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(a, b)


def test_special_keys_and_duplicates_in_one_batch(core):
    t = core.HashTable(4)
    keys = np.array([I64_MIN, 0, I64_MIN, -1, I64_MAX, 0, -1, I64_MIN], dtype=np.int64)
    np.testing.assert_array_equal(t.find_or_insert(keys), [0, 1, 0, 2, 3, 1, 2, 0])
    assert t.size() == 4
    assert t.erase(np.array([I64_MIN, I64_MIN, 12345], dtype=np.int64)) == 1
    np.testing.assert_array_equal(t.find(keys), [-1, 1, -1, 2, 3, 1, 2, -1])
    # The next new key gets size() at insertion (erase does not renumber).
    np.testing.assert_array_equal(t.find_or_insert(np.array([I64_MIN], np.int64)), [3])


def test_erase_then_reinsert_matches_oracle(core, rng):
    t = core.HashTable(16)
    oracle = {}
    for _ in range(30):
        keys = random_keys(rng, int(rng.integers(0, 4000)), pool=3000)
        np.testing.assert_array_equal(t.find_or_insert(keys), oracle_find_or_insert(oracle, keys))
        gone = random_keys(rng, int(rng.integers(0, 3000)), pool=3000)
        removed = sum(oracle.pop(k, None) is not None for k in gone.tolist())
        assert t.erase(gone) == removed
        probe = random_keys(rng, 2000, pool=3000)
        np.testing.assert_array_equal(t.find(probe), oracle_find(oracle, probe))
        assert t.size() == len(oracle)
    assert_export_matches(t, oracle)


def test_insert_or_assign_later_duplicate_wins(core, rng):
    t = core.HashTable(4)
    oracle = {}
    for _ in range(10):
        keys = random_keys(rng, 3000, pool=2000)
        values = rng.integers(0, 1 << 40, size=len(keys), dtype=np.int64)
        t.insert_or_assign(keys, values)
        for k, v in zip(keys.tolist(), values.tolist()):
            oracle[k] = v
        probe = random_keys(rng, 3000, pool=2000)
        np.testing.assert_array_equal(t.find(probe), oracle_find(oracle, probe))
    assert_export_matches(t, oracle)
    # find_or_insert on top: new keys get size() at insertion, known keys keep their value.
    keys = random_keys(rng, 3000, pool=4000)
    np.testing.assert_array_equal(t.find_or_insert(keys), oracle_find_or_insert(oracle, keys))
    with pytest.raises(ValueError, match="keys has 2 entries but values has 1"):
        t.insert_or_assign(np.array([1, 2], np.int64), np.array([1], np.int64))
    assert_export_matches(t, oracle)


def test_overflow_inserts_nothing_and_names_the_key(core, rng):
    t = core.HashTable(4)
    oracle = {}
    first = rng.choice(np.arange(-1000, 1000, dtype=np.int64), size=40, replace=False)
    first[0] = I64_MIN
    oracle_find_or_insert(oracle, first)
    t.find_or_insert(first, max_size=40)
    before = t.export()
    cap = t.capacity()
    # A batch of known keys plus new ones: the 11th distinct new key is the one that does not fit.
    fresh = np.concatenate([[I64_MAX], rng.choice(np.arange(5000, 6000, dtype=np.int64), 99, replace=False)])
    batch = np.concatenate([first[:5], fresh[:3], fresh[:3], fresh[3:20], first[5:9]])
    rng.shuffle(batch)
    new_in_order = [k for k in dict.fromkeys(batch.tolist()) if k not in oracle]
    with pytest.raises(ValueError) as e:
        t.find_or_insert(batch, max_size=50)
    msg = str(e.value)
    assert f"key {new_in_order[10]} does not fit" in msg and "max_size is 50" in msg, msg
    assert "nothing was inserted" in msg
    after = t.export()
    np.testing.assert_array_equal(before[0], after[0])
    np.testing.assert_array_equal(before[1], after[1])
    assert t.capacity() >= cap
    # Exactly at max_size is fine, and known keys never overflow.
    exact = np.array(new_in_order[:10], dtype=np.int64)
    np.testing.assert_array_equal(t.find_or_insert(exact, max_size=50), oracle_find_or_insert(oracle, exact))
    np.testing.assert_array_equal(t.find_or_insert(first, max_size=50), oracle_find(oracle, first))
    with pytest.raises(ValueError, match="max_size must be >= 0"):
        t.find_or_insert(first, max_size=-1)
    assert_export_matches(t, oracle)


def test_clear_and_reserve(core, rng):
    t = core.HashTable(16)
    keys = random_keys(rng, 10000, pool=100000)
    t.find_or_insert(keys)
    assert t.capacity() > 32
    t.clear()
    assert t.size() == 0 and t.capacity() == 32
    np.testing.assert_array_equal(t.find(keys), -1)
    t.reserve(100000)
    cap = t.capacity()
    assert cap >= 200000
    oracle = {}
    np.testing.assert_array_equal(t.find_or_insert(keys), oracle_find_or_insert(oracle, keys))
    assert t.capacity() == cap
    assert_export_matches(t, oracle)


def test_bad_arguments_get_clear_errors(core):
    t = core.HashTable(4)
    t.find_or_insert(np.arange(3, dtype=np.int64))
    with pytest.raises(TypeError, match="keys must have dtype int64, got int32"):
        t.find(np.arange(3, dtype=np.int32))
    with pytest.raises(TypeError, match="keys must have dtype int64, got float64"):
        t.find_or_insert(np.arange(3, dtype=np.float64))
    with pytest.raises(TypeError, match="keys must be a 1-D C-contiguous int64 NumPy array, got list"):
        t.erase([1, 2])
    with pytest.raises(ValueError, match="keys must be 1-D, got 2-D"):
        t.find(np.zeros((2, 2), np.int64))
    with pytest.raises(ValueError, match="keys must be C-contiguous"):
        t.find_or_insert(np.arange(10, dtype=np.int64)[::2])
    with pytest.raises(TypeError, match="values must have dtype int64"):
        t.insert_or_assign(np.arange(2, dtype=np.int64), np.arange(2, dtype=np.float32))
    with pytest.raises(ValueError, match="initial_capacity must be >= 1"):
        core.HashTable(0)
    with pytest.raises(ValueError, match="keys exceed the maximum of 1099511627776"):
        core.HashTable(1 << 41)
    assert t.size() == 3  # nothing changed
    readonly = np.arange(5, dtype=np.int64)
    readonly.flags.writeable = False
    np.testing.assert_array_equal(t.find(readonly), [0, 1, 2, -1, -1])
    assert t.find(np.zeros(0, np.int64)).shape == (0,)


def test_concurrent_finds_and_inserts_from_python_threads(core, rng):
    """Readers and writers at once: every value a reader sees is -1 or the key's final value
    (a key's value never changes once inserted); the final table equals the oracle."""
    t = core.HashTable(64)
    seeds = rng.integers(0, 2**31, size=6)
    batches = {w: [random_keys(np.random.default_rng(int(seeds[w])), 20000, pool=60000) for _ in range(6)]
               for w in range(3)}
    errors = []
    seen = []

    def writer(w):
        try:
            for b in batches[w]:
                v = t.find_or_insert(b)
                assert (v >= 0).all()
                seen.append((b, v))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader(r):
        try:
            probe_rng = np.random.default_rng(int(seeds[3 + r]))
            for _ in range(15):
                b = random_keys(probe_rng, 20000, pool=60000)
                seen.append((b, t.find(b)))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    keys, values = t.export()
    final = dict(zip(keys.tolist(), values.tolist()))
    all_written = set(np.concatenate([b for bs in batches.values() for b in bs]).tolist())
    assert set(final) == all_written
    np.testing.assert_array_equal(np.sort(values), np.arange(len(values)))  # dense, unique
    for b, v in seen:
        want = np.array([final.get(k, -1) for k in b.tolist()], dtype=np.int64)
        ok = (v == want) | (v == -1)
        assert ok.all()



def test_concurrent_erase_insert_and_find_keep_other_keys_intact(core, rng):
    """Erases and inserts (backward-shift deletion moves slots) while readers look up a set of
    keys nobody touches: those must always be found with their values."""
    t = core.HashTable(64)
    keys = np.unique(rng.integers(-(1 << 40), 1 << 40, size=60000, dtype=np.int64))
    rng.shuffle(keys)
    stable, churn = keys[:20000], keys[20000:]
    stable_values = t.find_or_insert(stable)
    errors = []

    def churner(part):
        try:
            for _ in range(10):
                t.find_or_insert(part)
                t.insert_or_assign(part, np.full(len(part), 7, np.int64))
                assert t.erase(part) == len(part)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    def reader():
        try:
            for _ in range(20):
                np.testing.assert_array_equal(t.find(stable), stable_values)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=churner, args=(p,)) for p in np.array_split(churn, 2)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    assert t.size() == len(stable)
    np.testing.assert_array_equal(t.find(churn), -1)
    assert_export_matches(t, dict(zip(stable.tolist(), stable_values.tolist())))

# ---- the TensorFlow resource -------------------------------------------------------------------

tf = pytest.importorskip("tensorflow", reason="the TensorFlow side needs tensorflow")
from embedlab.hash_table import HashTable as TfHashTable  # noqa: E402


def tf_export_dict(table):
    keys, values = table.export()
    keys, values = keys.numpy(), values.numpy()
    order = np.lexsort((keys, values))
    np.testing.assert_array_equal(order, np.arange(len(keys)))  # ascending value, then key
    return dict(zip(keys.tolist(), values.tolist()))


def test_tf_eager_matches_oracle_any_shape(rng):
    t = TfHashTable(initial_capacity=8, name="eager")
    oracle = {}
    for _ in range(12):
        shape = [(int(rng.integers(0, 3000)),), (int(rng.integers(0, 60)), 7), (3, int(rng.integers(0, 9)), 5)][
            int(rng.integers(0, 3))]
        keys = random_keys(rng, int(np.prod(shape)), pool=20000).reshape(shape)
        want = oracle_find_or_insert(oracle, keys.reshape(-1)).reshape(shape)
        got = t.find_or_insert(tf.constant(keys))
        assert got.dtype == tf.int64 and tuple(got.shape) == shape
        np.testing.assert_array_equal(got.numpy(), want)
        probe = random_keys(rng, 500, pool=40000).reshape(20, 25)
        np.testing.assert_array_equal(t.find(probe).numpy(), oracle_find(oracle, probe.reshape(-1)).reshape(20, 25))
    assert int(t.size()) == len(oracle) > 8 * 100
    assert tf_export_dict(t) == oracle
    # int32 keys are widened; other dtypes are refused before any op runs.
    np.testing.assert_array_equal(t.find(tf.constant([0, 1], tf.int32)).numpy(), oracle_find(oracle, np.array([0, 1])))
    with pytest.raises(TypeError, match=r"HashTable\(eager\).find_or_insert: keys must be int64"):
        t.find_or_insert(tf.constant([1.0]))
    with pytest.raises(TypeError, match="must be a dense int64 tensor"):
        t.find(tf.ragged.constant([[1], []], dtype=tf.int64))
    assert tf_export_dict(t) == oracle


def test_tf_function_varying_batch_sizes_one_trace(rng):
    t = TfHashTable(initial_capacity=16, name="fn")
    traces = []

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
    def step(keys):
        traces.append(1)
        values = t.find_or_insert(keys)
        return values, t.find(keys), t.size()

    oracle = {}
    for n in [0, 1, 17, 5000, 20000, 3, 40000]:  # >= 16384 takes the parallel path
        keys = random_keys(rng, n, pool=30000)
        want = oracle_find_or_insert(oracle, keys)
        values, found, size = step(tf.constant(keys))
        np.testing.assert_array_equal(values.numpy(), want)
        np.testing.assert_array_equal(found.numpy(), want)
        assert int(size) == len(oracle)
    assert len(traces) == 1

    @tf.function
    def update(keys, values, gone):
        t.insert(keys, values)
        return t.erase(gone)

    keys = random_keys(rng, 2000, pool=30000)
    values = rng.integers(0, 1 << 40, size=2000, dtype=np.int64)
    gone = random_keys(rng, 3000, pool=30000)
    for k, v in zip(keys.tolist(), values.tolist()):
        oracle[k] = v
    removed = sum(oracle.pop(k, None) is not None for k in gone.tolist())
    assert int(update(tf.constant(keys), tf.constant(values), tf.constant(gone))) == removed
    assert tf_export_dict(t) == oracle


def test_tf_overflow_names_key_table_and_max_size_and_changes_nothing(rng):
    t = TfHashTable(initial_capacity=4, name="capped")
    base = np.array([5, I64_MIN, -7, 0], dtype=np.int64)
    np.testing.assert_array_equal(t.find_or_insert(base, max_size=4).numpy(), [0, 1, 2, 3])
    before = tf_export_dict(t)
    batch = np.array([[0, 5], [I64_MAX, 11], [I64_MAX, -7]], dtype=np.int64)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        t.find_or_insert(batch, max_size=5)
    msg = e.value.message
    assert "EmbedLabHashTableFindOrInsert: key 11 in keys (flat index 3)" in msg, msg
    assert "hash table 'capped'" in msg and "max_size is 5" in msg and "nothing was inserted" in msg

    @tf.function
    def capped(keys, m):
        return t.find_or_insert(keys, max_size=m)

    with pytest.raises(tf.errors.InvalidArgumentError, match="key 9223372036854775807 in keys"):
        capped(tf.constant(batch), tf.constant(4, tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_size must be >= 0"):
        capped(tf.constant(batch), tf.constant(-1, tf.int64))
    assert tf_export_dict(t) == before
    np.testing.assert_array_equal(capped(tf.constant(batch), tf.constant(6, tf.int64)).numpy(),
                                  [[3, 0], [4, 5], [4, 2]])


def test_tf_tables_are_independent_checkpointed_and_cleared(rng, tmp_path):
    a, b = TfHashTable(name="same"), TfHashTable(name="same")
    assert a.shared_name is None and b.shared_name is None
    keys = random_keys(rng, 3000, pool=5000)
    oracle = {}
    oracle_find_or_insert(oracle, keys)
    a.find_or_insert(keys)
    assert int(b.size()) == 0
    path = tf.train.Checkpoint(table=a).write(str(tmp_path / "ckpt"))
    b.find_or_insert(np.array([123456789], np.int64))  # replaced by the restore
    tf.train.Checkpoint(table=b).read(path).assert_consumed()
    assert tf_export_dict(b) == oracle
    a.clear()
    assert int(a.size()) == 0 and tf_export_dict(a) == {}
    np.testing.assert_array_equal(a.find(keys).numpy(), -1)
    with pytest.raises(ValueError, match="keys has shape .* but values has shape"):
        a.insert(tf.constant([1, 2], tf.int64), tf.constant([1], tf.int64))
    with pytest.raises(ValueError, match=r"initial_capacity must be an int in \[1, 2\*\*40\]"):
        TfHashTable(initial_capacity=0)


def test_tf_saved_model_keeps_working(rng, tmp_path):
    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = TfHashTable(name="saved")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def __call__(self, keys):
            return self.table.find_or_insert(keys)

    m = M()
    keys = random_keys(rng, 1000, pool=2000)
    oracle = {}
    np.testing.assert_array_equal(m(tf.constant(keys)).numpy(), oracle_find_or_insert(oracle, keys))
    saved = dict(oracle)
    tf.saved_model.save(m, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    # The loaded model has its own table, restored from the saved contents, and outlives m.
    m(tf.constant(np.array([I64_MAX - 5], np.int64)))
    del m
    gc.collect()
    more = random_keys(rng, 1000, pool=4000)
    np.testing.assert_array_equal(loaded(tf.constant(more)).numpy(), oracle_find_or_insert(saved, more))


def test_tf_shared_name_shares_one_table(rng):
    name = f"test_shared_{rng.integers(1 << 40)}"
    a, b = TfHashTable(shared_name=name), TfHashTable(shared_name=name)
    keys = random_keys(rng, 500, pool=1000)
    np.testing.assert_array_equal(a.find_or_insert(keys).numpy(), oracle_find_or_insert({}, keys))
    np.testing.assert_array_equal(b.find(keys).numpy(), a.find(keys).numpy())
    assert a.name == name
    b.clear()
    assert int(a.size()) == 0
    with pytest.raises(ValueError, match="shared_name must be a non-empty string"):
        TfHashTable(shared_name="")


def test_tf_concurrent_ops_from_python_threads(rng):
    t = TfHashTable(initial_capacity=32, name="threads")
    batches = [random_keys(rng, 20000, pool=50000) for _ in range(8)]
    results, errors = [None] * len(batches), []

    def work(i):
        try:
            results[i] = t.find_or_insert(tf.constant(batches[i])).numpy()
            t.find(tf.constant(batches[(i + 1) % len(batches)]))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(batches))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    final = tf_export_dict(t)
    assert sorted(final.values()) == list(range(len(final)))
    assert set(final) == set(np.concatenate(batches).tolist())
    for b, v in zip(batches, results):
        np.testing.assert_array_equal(v, [final[k] for k in b.tolist()])
