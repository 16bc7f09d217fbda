"""embedlab.sok in one process (one worker): argument checks, the first-generation layers,
DynamicVariable against a dict oracle, dump/load and Saver round trips. The multi-worker
behaviour is in test_sok_multiworker.py."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import embedlab.optimizers as eopt
import embedlab.sok as sok


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


def _ragged(rows):
    return tf.ragged.constant(rows, dtype=tf.int64, ragged_rank=1)


def test_bad_arguments_are_named():
    v = sok.Variable(np.ones((5, 2), np.float32), name="tbl")
    ids = _ragged([[1, 2], []])
    with pytest.raises(ValueError, match="2 params but 1 sp_ids"):
        sok.lookup_sparse([v, v], [ids])
    with pytest.raises(ValueError, match="combiners\\[0\\] must be 'sum' or 'mean', got 'max'"):
        sok.lookup_sparse([v], [ids], combiners=["max"])
    with pytest.raises(ValueError, match="1 params but 2 combiners"):
        sok.lookup_sparse([v], [ids], combiners=["sum", "sum"])
    with pytest.raises(ValueError, match="params\\[0\\] must be an embedlab.sok.Variable"):
        sok.lookup_sparse([tf.Variable(tf.ones([5, 2]))], [ids])
    with pytest.raises(ValueError, match="mode must be 'distributed' or 'localized:<rank>'"):
        sok.Variable(np.ones((5, 2)), mode="sharded")
    with pytest.raises(ValueError, match="names rank 3 but there are 1 workers"):
        sok.Variable(np.ones((5, 2)), mode="localized:3")
    with pytest.raises(tf.errors.InvalidArgumentError, match="key 7 of table tbl .*outside the rows of the table"):
        sok.lookup_sparse([v], [_ragged([[1, 7]])], combiners=["sum"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="key -3 of table tbl "):
        tf.function(lambda: sok.lookup_sparse([v], [_ragged([[-3]])], combiners=["sum"]))()


def test_lookup_matches_tensorflow_with_weights_empty_rows_and_hotness_signature(rng):
    full = rng.normal(size=(30, 4)).astype(np.float32)
    v = sok.Variable(full, mode="localized:0", name="w")
    lens = [2, 0, 3, 1]
    keys = rng.integers(0, 30, size=sum(lens))
    w = rng.uniform(0.5, 2, size=sum(lens)).astype(np.float32)
    ids = tf.RaggedTensor.from_row_lengths(keys, lens)
    wts = tf.RaggedTensor.from_row_lengths(w, lens)
    out = sok.lookup_sparse([v], [ids], [wts], combiners=["mean"])[0]
    ref = tf.nn.safe_embedding_lookup_sparse(tf.constant(full), ids.to_sparse(), wts.to_sparse(), combiner="mean")
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-7)
    # SOK v4.0's lookup_sparse(params, sp_ids, hotness, combiners)
    out2 = sok.lookup_sparse([v], [ids], [3], ["sum"])[0]
    ref2 = tf.nn.safe_embedding_lookup_sparse(tf.constant(full), ids.to_sparse(), None, combiner="sum")
    np.testing.assert_allclose(out2, ref2, rtol=1e-6, atol=1e-7)
    dense = sok.all2all_dense_embedding(v, tf.constant([[1, -1], [29, 0]], tf.int64))
    np.testing.assert_allclose(dense.numpy(), np.stack([[full[1], np.zeros(4)], [full[29], full[0]]]))


def test_dynamic_variable_against_a_dict(rng):
    universe = rng.integers(-2**62, 2**62, size=200)
    dv = sok.DynamicVariable(dimension=3, initializer="0.25", init_capacity=8, name="dyn")
    opt = sok.OptimizerWrapper(eopt.Adagrad(learning_rate=0.1))
    oracle, acc = {}, {}
    step = tf.function(lambda ids: _train(dv, opt, ids))
    for _ in range(6):
        lens = rng.integers(0, 4, size=16)
        keys = rng.choice(universe, size=int(lens.sum()))
        step(tf.RaggedTensor.from_row_lengths(keys, lens))
        # oracle: loss = sum of every pooled (sum) vector; each key's gradient is its count
        for k in keys.tolist():
            oracle.setdefault(k, np.full(3, 0.25, np.float32))
            acc.setdefault(k, np.full(3, 0.1, np.float32))
        uniq, counts = np.unique(keys, return_counts=True)
        for k, c in zip(uniq.tolist(), counts):
            g = np.full(3, float(c), np.float32)
            acc[k] = acc[k] + g * g
            oracle[k] = oracle[k] - 0.1 * g / (np.sqrt(acc[k]) + 1e-7)
    k, vals = sok.export(dv)
    got = dict(zip(k.numpy().tolist(), vals.numpy()))
    assert set(got) == set(oracle) and dv.capacity >= len(oracle) > 8
    for key, row in oracle.items():
        np.testing.assert_allclose(got[key], row, rtol=1e-5)
    # max_capacity: one key too many is refused, naming the key and the table
    small = sok.DynamicVariable(dimension=2, max_capacity=2, name="small")
    sok.lookup_sparse([small], [_ragged([[5, 6]])], combiners=["sum"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="key 7 .*small"):
        sok.lookup_sparse([small], [_ragged([[7]])], combiners=["sum"])


def _train(dv, opt, ids):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([dv], [ids], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [dv]), [dv]))
    return loss


def test_dump_load_round_trip_and_shape_errors(tmp_path, rng):
    a = sok.Variable(rng.normal(size=(13, 4)).astype(np.float32), name="a")
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([a], [_ragged([[1, 2], [12]])], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [a]), [a]))
    sok.dump(tmp_path / "d", [a], opt)
    b = sok.Variable(np.zeros((13, 4), np.float32), name="a")
    opt_b = sok.OptimizerWrapper(tf.keras.optimizers.Adam(learning_rate=0.1))
    sok.load(tmp_path / "d", [b], opt_b)
    np.testing.assert_array_equal(b.numpy(), a.numpy())
    for name, slot in opt.slots(a).items():
        np.testing.assert_array_equal(np.asarray(opt_b.slots(b)[name]), np.asarray(slot))
    wrong = sok.Variable(np.zeros((13, 5), np.float32), name="a")
    with pytest.raises(ValueError, match="a-weight is \\[13, 4\\] but table 'a' has dim 5"):
        sok.load(tmp_path / "d", [wrong])
    assert not wrong.numpy().any()
    (tmp_path / "d" / "a-weight").write_bytes((tmp_path / "d" / "a-weight").read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        sok.load(tmp_path / "d", [b])


def test_first_generation_layers_and_saver(tmp_path):
    layer = sok.DistributedEmbedding("mean", max_vocabulary_size_per_gpu=64, embedding_vec_size=4, slot_num=3, max_nnz=2,
                                     use_hashtable=False)
    sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0], [4, 1]], tf.constant([1, 3, 5, 63], tf.int64), [6, 2])
    out = layer(sp)
    table = layer.embedding_variable.numpy()
    assert out.shape == (2, 3, 4)
    np.testing.assert_allclose(out[0, 0], (table[1] + table[3]) / 2, rtol=1e-6)
    np.testing.assert_allclose(out[1, 1], table[63], rtol=1e-6)
    dense = sok.All2AllDenseEmbedding(max_vocabulary_size_per_gpu=16, embedding_vec_size=2, slot_num=2, nnz_per_slot=2)
    keys = tf.constant([[[10**12, 5], [5, -1]]], tf.int64)
    e = dense(keys)
    assert e.shape == (1, 2, 2, 2)
    np.testing.assert_allclose(e[0, 0, 1], e[0, 1, 0])           # the same key, the same row
    np.testing.assert_allclose(e[0, 1, 1], [0, 0])               # -1: no key
    emb, other = sok.split_embedding_variable_from_others([dense.embedding_variable, tf.Variable(1.0)])
    assert len(emb) == 1 and len(other) == 1
    sok.Saver().dump_to_file(dense.embedding_variable, str(tmp_path))
    keys_file = np.fromfile(tmp_path / f"{dense.name}_keys.file", np.int64)
    assert sorted(keys_file.tolist()) == [5, 10**12]
    before = dense(keys).numpy()
    dense.embedding_variable.assign(np.zeros((16, 2), np.float32))
    sok.Saver().restore_from_file(dense.embedding_variable, str(tmp_path))
    np.testing.assert_allclose(dense(keys).numpy(), before)


def test_shard_layout_is_the_plugins_placement():
    """SOK's distributed shards follow embedlab.plugin.placement (key % n, row key // n): the
    shard sizes and global row ids of every rank are shard_keys', and key_map is its local row."""
    from embedlab.plugin import placement
    from embedlab.sok.variable import shard_rows
    for world in range(1, 6):
        for rows in range(0, 23):
            plan = placement.shard_keys(rows, world, "distributed")
            for rank in range(world):
                assert shard_rows(rows, rank, world) == len(plan[rank]) == len(range(rank, rows, world))
    v = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)     # one worker
    assert v.global_rows_of_shard().tolist() == list(range(17))
    assert v.key_map(tf.constant([0, 5, 16], tf.int64)).numpy().tolist() == [0, 5, 16]
