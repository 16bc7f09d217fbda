"""embedlab.ops against TensorFlow's own ops and NumPy float64 oracles (tests/reference.py).

Fresh random inputs every run; the seed is printed (shown on failure) and can be replayed
with EMBEDLAB_TEST_SEED=<seed>.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import reference as ref  # noqa: E402
from embedlab import ops  # noqa: E402
from embedlab import optimizers as eopt  # noqa: E402

# The folder this process imported embedlab from (the source tree in development, site-packages
# after `pip install ./helpers`): child processes must load the same, built, package.
import embedlab as _embedlab  # noqa: E402
EMBEDLAB_HOME = Path(_embedlab.__file__).resolve().parents[1]


def _ids_arg(ids: ref.Ids, form, weighted, rng):
    if form == "ragged":
        return ids.ragged(tf, True) if weighted else (ids.ragged(tf), None)
    if form == "sparse":
        return ids.sparse(tf, True, shuffle_rng=rng) if weighted else (ids.sparse(tf, shuffle_rng=rng), None)
    d, dw = ids.dense(True)
    return (tf.constant(d), tf.constant(dw)) if weighted else (tf.constant(d), None)


def _table(rng, rows, dim):
    return rng.standard_normal((rows, dim)).astype(np.float32)


# ---- forward ------------------------------------------------------------------------------

@pytest.mark.parametrize("form", ["ragged", "sparse", "dense"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_oracles(rng, form, combiner, weighted):
    rows, dim = int(rng.integers(5, 40)), int(rng.integers(1, 9))
    table = _table(rng, rows, dim)
    ids = ref.random_ids(rng, int(rng.integers(2, 30)), rows, max_nnz=int(rng.integers(1, 5)))
    x, w = _ids_arg(ids, form, weighted, rng)
    out = ops.embedding_lookup(tf.Variable(table), x, combiner, weights=w).numpy()
    want = ref.np_lookup(table, ids.splits, ids.keys, ids.weights if weighted else None, combiner)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    tfo = ref.tf_safe_lookup(tf, tf.constant(table), ids, combiner, weighted).numpy()
    np.testing.assert_allclose(out, tfo, rtol=1e-5, atol=1e-5)
    # Empty rows (and rows of only -1) give exact zeros.
    empty = [b for b in range(ids.batch) if (ids.keys[ids.splits[b]:ids.splits[b + 1]] < 0).all()]
    assert empty and not out[empty].any()


def test_tensor_and_variable_tables_agree(rng):
    table = _table(rng, 30, 5)
    ids = ref.random_ids(rng, 20, 30)
    a = ops.embedding_lookup(tf.constant(table), ids.ragged(tf)).numpy()
    b = ops.embedding_lookup(tf.Variable(table), ids.ragged(tf)).numpy()
    c = ops.embedding_lookup(keras.Variable(table), ids.ragged(tf)).numpy()
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_fused_equals_single_lookups(rng):
    tables = [_table(rng, int(rng.integers(3, 50)), int(rng.integers(1, 17))) for _ in range(4)]
    idss = [ref.random_ids(rng, 12, t.shape[0]) for t in tables]
    combiners = ["sum", "mean", "mean", "sum"]
    fused = ops.fused_embedding_lookup([tf.Variable(t) for t in tables], [i.ragged(tf) for i in idss], combiners)
    for t, i, c, o in zip(tables, idss, combiners, fused):
        one = ops.embedding_lookup(tf.Variable(t), i.ragged(tf), c)
        assert np.array_equal(o.numpy(), one.numpy())
        np.testing.assert_allclose(o.numpy(), ref.np_lookup(t, i.splits, i.keys, None, c), rtol=1e-5, atol=1e-5)


def test_forms_give_identical_bits(rng):
    table = tf.Variable(_table(rng, 25, 6))
    ids = ref.random_ids(rng, 17, 25)
    a = ops.embedding_lookup(table, ids.ragged(tf), "mean").numpy()
    # Canonical (row-major) COO order: the same keys in the same order, so the same bits.
    b = ops.embedding_lookup(table, ids.sparse(tf), "mean").numpy()
    c = ops.embedding_lookup(table, tf.constant(ids.dense()), "mean").numpy()
    assert np.array_equal(a, b) and np.array_equal(a, c)


def test_to_csr_sorts_unordered_coo(rng):
    ids = ref.random_ids(rng, 9, 100)
    splits, keys, w = ops.to_csr(*ids.sparse(tf, True))
    assert splits.numpy().tolist() == ids.splits.tolist()
    assert keys.numpy().tolist() == ids.keys.tolist()
    assert np.array_equal(w.numpy(), ids.weights)
    # Shuffled COO: same rows, and each row keeps its (key, weight) pairs.
    splits, keys, w = ops.to_csr(*ids.sparse(tf, True, shuffle_rng=rng))
    assert splits.numpy().tolist() == ids.splits.tolist()
    k, ww = keys.numpy(), w.numpy()
    for b in range(ids.batch):
        sl = slice(ids.splits[b], ids.splits[b + 1])
        assert sorted(zip(k[sl], ww[sl])) == sorted(zip(ids.keys[sl], ids.weights[sl]))


def test_fused_lookup_converts_several_sparse_ids_in_one_op(rng):
    # Three tables with SparseTensor ids (one in shuffled order) and one with ragged ids: the
    # SparseTensors go through a single EmbedLabSparseToCsr; every output must match its oracle.
    shapes = [(int(rng.integers(5, 60)), int(rng.integers(1, 9))) for _ in range(4)]
    tables = [_table(rng, r, d) for r, d in shapes]
    ids = [ref.random_ids(rng, int(rng.integers(1, 20)), r) for r, _ in shapes]
    args = [ids[0].sparse(tf, True), ids[1].sparse(tf, True, shuffle_rng=rng), ids[2].ragged(tf, True),
            ids[3].sparse(tf, True)]
    outs = ops.fused_embedding_lookup([tf.Variable(t) for t in tables], [a[0] for a in args], "mean",
                                      weights=[a[1] for a in args])
    for t in range(4):
        want = ref.np_lookup(tables[t], ids[t].splits, ids[t].keys, ids[t].weights, "mean")
        np.testing.assert_allclose(outs[t].numpy(), want, rtol=1e-5, atol=1e-5)

    @tf.function
    def graph(x):
        return ops.fused_embedding_lookup([tf.constant(t) for t in tables], x, "sum")
    ops_used = [op.type for op in graph.get_concrete_function([a[0] for a in args]).graph.get_operations()]
    assert ops_used.count("EmbedLabSparseToCsr") == 1


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_sparse_ids_on_variables_convert_and_look_up_in_one_op(rng, combiner):
    # All ids SparseTensors, all tables variables: one EmbedLabFusedResourceSparseLookup converts
    # and looks up. Outputs and gradients must equal the oracle and the ragged (CSR) path, for
    # canonical and shuffled COO, with weights, empty rows, -1 keys and duplicate keys.
    shapes = [(int(rng.integers(5, 60)), int(rng.integers(1, 9))) for _ in range(3)]
    tables = [_table(rng, r, d) for r, d in shapes]
    ids = [ref.random_ids(rng, int(rng.integers(1, 20)), r) for r, _ in shapes]
    sparse = [ids[0].sparse(tf, True), ids[1].sparse(tf, True, shuffle_rng=rng), ids[2].sparse(tf, True)]
    ragged = [x.ragged(tf, True) for x in ids]
    dys = [rng.standard_normal((x.batch, d)).astype(np.float32) for x, (_, d) in zip(ids, shapes)]

    def run(args):
        vs = [tf.Variable(t) for t in tables]
        with tf.GradientTape() as tape:
            outs = ops.fused_embedding_lookup(vs, [a[0] for a in args], combiner, weights=[a[1] for a in args])
            loss = tf.add_n([tf.reduce_sum(o * dy) for o, dy in zip(outs, dys)])
        grads = tape.gradient(loss, vs)
        return [o.numpy() for o in outs], [tf.convert_to_tensor(g).numpy() for g in grads]

    outs, grads = run(sparse)
    outs_csr, grads_csr = run(ragged)
    for t in range(3):
        want = ref.np_lookup(tables[t], ids[t].splits, ids[t].keys, ids[t].weights, combiner)
        np.testing.assert_allclose(outs[t], want, rtol=1e-5, atol=1e-5)
        if t == 1:  # shuffled COO: a row's keys may be summed in another order
            np.testing.assert_allclose(outs[t], outs_csr[t], rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(grads[t], grads_csr[t], rtol=1e-5, atol=1e-5)
        else:  # canonical COO: the very CSR ids of the ragged path, so the same bits
            np.testing.assert_array_equal(outs[t], outs_csr[t])
            np.testing.assert_array_equal(grads[t], grads_csr[t])

    vs = [tf.Variable(t) for t in tables]

    @tf.function
    def graph(x):
        return ops.fused_embedding_lookup(vs, x, combiner)
    ops_used = [op.type for op in graph.get_concrete_function([a[0] for a in sparse]).graph.get_operations()]
    assert ops_used.count("EmbedLabFusedResourceSparseLookup") == 1
    assert "EmbedLabSparseToCsr" not in ops_used and "EmbedLabFusedResourceLookup" not in ops_used
    got = graph([a[0] for a in sparse])
    for t in range(3):
        np.testing.assert_allclose(got[t].numpy(), ref.np_lookup(tables[t], ids[t].splits, ids[t].keys, None, combiner),
                                   rtol=1e-5, atol=1e-5)


def test_sparse_ids_with_optimizer_train_like_ragged_ids(rng):
    # optimizer= with SparseTensor ids reads the CSR ids the fused op made: same tables as the
    # ragged path, bit for bit, over two steps.
    from embedlab import optimizers as eopt
    shapes = [(30, 4), (12, 8)]
    tables = [_table(rng, r, d) for r, d in shapes]
    ids = [ref.random_ids(rng, 10, r) for r, _ in shapes]
    results = []
    for kind in ("sparse", "ragged"):
        vs = [tf.Variable(t) for t in tables]
        opt = eopt.Adagrad(learning_rate=0.1)
        args = [x.sparse(tf) if kind == "sparse" else x.ragged(tf) for x in ids]
        for _ in range(2):
            with tf.GradientTape() as tape:
                outs = ops.fused_embedding_lookup(vs, args, "sum", optimizer=opt)
                loss = tf.add_n([tf.reduce_sum(o * o) for o in outs])
            tape.gradient(loss, vs)
        results.append([v.numpy() for v in vs])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_sparse_lookup_single_pass_large_batches_match_ragged(rng):
    # Batches large enough that the kernel splits each table into several blocks (each block
    # finds its first entry by binary search over the row indices), with empty rows at both
    # ends and in between, -1 keys, duplicates and weights; one table arrives unordered. Same
    # bits as the ragged path where the COO is canonical.
    shapes = [(1000, 16), (300, 3), (50, 8)]
    tables = [_table(rng, r, d) for r, d in shapes]
    ids = []
    for rows, _ in shapes:
        batch = int(rng.integers(2000, 4000))
        counts = rng.integers(0, 5, batch)
        counts[:7] = 0
        counts[-5:] = 0
        keys = rng.integers(-1, rows, int(counts.sum()))
        ids.append((batch, counts, keys, rng.random(int(counts.sum())).astype(np.float32)))
    vs = [tf.Variable(t) for t in tables]
    for combiner in ("sum", "mean"):
        sparse, ragged = [], []
        for t, (batch, counts, keys, w) in enumerate(ids):
            rows_of = np.repeat(np.arange(batch), counts)
            cols = np.concatenate([np.arange(c) for c in counts]).astype(np.int64)
            idx = np.stack([rows_of, cols], 1).astype(np.int64)
            kk, ww = keys, w
            if t == 2:
                p = rng.permutation(len(keys))
                idx, kk, ww = idx[p], keys[p], w[p]
            shape = [batch, 4]
            sparse.append((tf.SparseTensor(idx, kk, shape), tf.SparseTensor(idx, ww, shape)))
            ragged.append((tf.RaggedTensor.from_row_lengths(keys, counts), tf.RaggedTensor.from_row_lengths(w, counts)))
        got = ops.fused_embedding_lookup(vs, [a[0] for a in sparse], combiner, weights=[a[1] for a in sparse])
        want = ops.fused_embedding_lookup(vs, [a[0] for a in ragged], combiner, weights=[a[1] for a in ragged])
        for t in range(3):
            if t == 2:
                np.testing.assert_allclose(got[t].numpy(), want[t].numpy(), rtol=1e-5, atol=1e-5)
            else:
                np.testing.assert_array_equal(got[t].numpy(), want[t].numpy())
            batch, counts, keys, w = ids[t]
            oracle = ref.np_lookup(tables[t], np.concatenate([[0], np.cumsum(counts)]), keys, w, combiner)
            np.testing.assert_allclose(got[t].numpy(), oracle, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("indices,shape,match", [
    ([[0, 0], [1, 0], [2, 0]], [2, 2], r"row index 2 at indices\[2, 0\] is outside \[0, 2\)"),  # in order, last row too big
    ([[-1, 0], [0, 0], [1, 0]], [2, 2], r"row index -1 at indices\[0, 0\]"),                     # in order, negative first
    ([[1, 0], [0, 0], [-3, 0]], [2, 2], r"row index -3"),                                          # out of order and negative
    ([[0, 0], [0, 1], [0, 2]], [0, 3], r"row index 0 at indices\[0, 0\] is outside \[0, 0\)"),   # entries but batch 0
])
def test_sparse_lookup_bad_rows_name_op_table_and_entry(indices, shape, match):
    good = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 2])
    bad = tf.SparseTensor(indices, tf.constant([1, 2, 3], tf.int64), shape)
    vs = [tf.Variable(tf.ones([4, 2])), tf.Variable(tf.ones([4, 2]))]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"EmbedLabFusedResourceSparseLookup: ids\[1\]: .*" + match):
        ops.fused_embedding_lookup(vs, [good, bad], "sum")


def test_sparse_lookup_zero_batch_and_no_entries():
    vs = [tf.Variable(tf.ones([4, 3])), tf.Variable(tf.ones([5, 2]))]
    empty = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [0, 2])
    none_valid = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.zeros([0], tf.int64), [3, 2])
    out = ops.fused_embedding_lookup(vs, [empty, none_valid], "mean")
    assert out[0].shape == (0, 3) and out[1].shape == (3, 2) and not out[1].numpy().any()


def test_bad_sparse_row_index_on_variables_names_the_op_and_table():
    good = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 2])
    bad = tf.SparseTensor([[0, 0], [5, 0]], tf.constant([1, 2], tf.int64), [2, 2])
    vs = [tf.Variable(tf.ones([4, 2])), tf.Variable(tf.ones([4, 2]))]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"EmbedLabFusedResourceSparseLookup: ids\[1\].*row index 5"):
        ops.fused_embedding_lookup(vs, [good, bad], "sum")
    key_bad = tf.SparseTensor([[0, 0], [1, 1]], tf.constant([1, 4], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"EmbedLabFusedResourceSparseLookup: ids\[0\].*key 4 .*outside the table of 4 rows"):
        ops.fused_embedding_lookup(vs, [key_bad, good], "sum")
    np.testing.assert_array_equal(vs[0].numpy(), np.ones([4, 2]))


def test_bad_row_splits_through_the_raw_op_name_the_table():
    # ops.* builds valid splits; the op itself must still refuse bad ones (checked in the kernel).
    import embedlab
    lib = embedlab.tf_ops()
    t = tf.Variable(tf.ones([6, 2]))
    keys = tf.constant([1, 2, 3], tf.int64)
    for bad in ([0, 1 << 40, 2, 3], [0, 2, 1, 3]):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"EmbedLabFusedResourceLookup: ids\[1\]: row_offsets decrease at row"):
            lib.embed_lab_fused_resource_lookup([t.handle, t.handle], [tf.constant([0, 3], tf.int64),
                                                                       tf.constant(bad, tf.int64)],
                                                [keys, keys], [], combiners=["sum", "sum"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"ids\[0\]: row_offsets end at 2 but there are 3 keys"):
        lib.embed_lab_fused_lookup([tf.ones([6, 2])], [tf.constant([0, 1, 2], tf.int64)], [keys], [], combiners=["sum"])


def test_bad_sparse_row_index_names_the_table():
    good = tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64), [2, 2])
    bad = tf.SparseTensor([[0, 0], [5, 0]], tf.constant([1, 2], tf.int64), [2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"EmbedLabSparseToCsr: ids\[1\].*row index 5"):
        ops.fused_embedding_lookup([tf.ones([4, 2]), tf.ones([4, 2])], [good, bad], "sum")


def test_all_rows_empty_and_zero_batch():
    table = tf.Variable(tf.ones([4, 3]))
    out = ops.embedding_lookup(table, tf.constant([[-1, -1], [-1, -1]], tf.int64))
    assert out.shape == (2, 3) and not out.numpy().any()
    out0 = ops.embedding_lookup(table, tf.zeros([0, 2], tf.int64))
    assert out0.shape == (0, 3)


# ---- gradients -----------------------------------------------------------------------------

@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_indexed_slices_match_oracle(rng, combiner, weighted):
    rows, dim = 20, 4
    table = tf.Variable(_table(rng, rows, dim))
    ids = ref.random_ids(rng, 15, rows)
    x, w = ids.ragged(tf, True) if weighted else (ids.ragged(tf), None)
    dy = rng.standard_normal((ids.batch, dim)).astype(np.float32)
    with tf.GradientTape() as tape:
        y = ops.embedding_lookup(table, x, combiner, weights=w)
        loss = tf.reduce_sum(y * dy)
    g = tape.gradient(loss, table)
    assert isinstance(g, tf.IndexedSlices)
    idx = g.indices.numpy()
    touched = np.unique(ids.keys[ids.keys >= 0])
    assert idx.tolist() == touched.tolist()                 # unique, ascending, duplicates summed
    want = ref.np_lookup_grad(dy, ids.splits, ids.keys, rows, ids.weights if weighted else None, combiner)
    np.testing.assert_allclose(g.values.numpy(), want[idx], rtol=1e-5, atol=1e-5)
    # Native TensorFlow agrees (its gradient, made dense).
    with tf.GradientTape() as tape:
        t2 = tf.Variable(table.numpy())
        loss2 = tf.reduce_sum(ref.tf_safe_lookup(tf, t2, ids, combiner, weighted) * dy)
    np.testing.assert_allclose(tf.convert_to_tensor(g).numpy(),
                               tf.convert_to_tensor(tape.gradient(loss2, t2)).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["ragged", "sparse", "dense"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_compute_gradient(rng, form, combiner):
    # Small plain-tensor table: theoretical (IndexedSlices, made dense) vs numerical Jacobian.
    table = tf.constant(rng.standard_normal((6, 3)), tf.float64)
    ids = ref.random_ids(rng, 5, 6, max_nnz=3)
    x, w = _ids_arg(ids, form, True, rng)

    def f(t):
        return ops.embedding_lookup(tf.cast(t, tf.float32), x, combiner, weights=w)

    theo, num = tf.test.compute_gradient(f, [table], delta=1e-2)
    np.testing.assert_allclose(theo[0], num[0], rtol=1e-2, atol=1e-2)


def test_gradient_is_deterministic(rng):
    table = tf.Variable(_table(rng, 1000, 16))
    ids = ref.random_ids(rng, 2000, 1000, max_nnz=6)
    dy = tf.constant(rng.standard_normal((ids.batch, 16)).astype(np.float32))
    res = []
    for _ in range(3):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.embedding_lookup(table, ids.ragged(tf), "mean") * dy)
        res.append(tape.gradient(loss, table).values.numpy())
    assert all(np.array_equal(res[0], r) for r in res[1:])


# ---- eager calls: the wrapper's own bookkeeping -------------------------------------------------

def test_eager_call_notifies_tapes_and_watchers_of_trainable_tables_only(rng):
    # An eager lookup tells every tape and variable watcher about its trainable tables, as a
    # read of them would, and about no other (embedlab._lookup.watch).
    from tensorflow.python.eager import record
    ids = ref.random_ids(rng, 12, 8).ragged(tf)
    a = tf.Variable(_table(rng, 8, 3))
    b = tf.Variable(_table(rng, 8, 3), trainable=False)
    with record.VariableWatcher() as watcher, tf.GradientTape() as tape:
        ya, yb = ops.fused_embedding_lookup([a, b], [ids, ids], "sum")
        loss = tf.reduce_sum(ya) + tf.reduce_sum(yb)
    assert [v is a for v in tape.watched_variables()] == [True]
    assert [v is a for v in watcher.watched_variables()] == [True]
    ga, gb = tape.gradient(loss, [a, b])
    assert isinstance(ga, tf.IndexedSlices) and gb is None


@pytest.mark.parametrize("strategy", ["one_device", "mirrored"])
def test_eager_call_under_a_strategy_gives_the_tables_gradient(rng, strategy):
    # Inside strategy.run the tape must watch what the strategy resolves the table to (a
    # MirroredVariable's value container), or the gradient comes back None.
    strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if strategy == "one_device"
                else tf.distribute.MirroredStrategy(["/cpu:0"]))
    rows, dim = 20, 4
    with strategy.scope():
        table = tf.Variable(_table(rng, rows, dim))
    ids = ref.random_ids(rng, 15, rows)
    dy = rng.standard_normal((ids.batch, dim)).astype(np.float32)

    def step():
        assert tf.executing_eagerly()
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.embedding_lookup(table, ids.ragged(tf)) * dy)
        return tape.gradient(loss, table)

    g = strategy.run(step)
    assert isinstance(g, tf.IndexedSlices)
    idx = g.indices.numpy()
    assert idx.tolist() == np.unique(ids.keys[ids.keys >= 0]).tolist()
    want = ref.np_lookup_grad(dy, ids.splits, ids.keys, rows)
    np.testing.assert_allclose(g.values.numpy(), want[idx], rtol=1e-5, atol=1e-5)


def test_int32_ragged_ids_and_splits_give_the_int64_bits(rng):
    table = tf.Variable(_table(rng, 30, 5))
    ids = ref.random_ids(rng, 20, 30)
    x64 = ids.ragged(tf)
    x32 = tf.RaggedTensor.from_row_splits(tf.cast(x64.values, tf.int32), tf.cast(x64.row_splits, tf.int32))
    assert x32.values.dtype == tf.int32 and x32.row_splits.dtype == tf.int32
    for t in (table, tf.convert_to_tensor(table)):
        np.testing.assert_array_equal(ops.embedding_lookup(t, x32).numpy(), ops.embedding_lookup(t, x64).numpy())


# ---- graph mode, Keras, SavedModel -----------------------------------------------------------

def test_tf_function_varying_batch(rng):
    table = tf.Variable(_table(rng, 40, 5))

    @tf.function(reduce_retracing=True)
    def f(ids):
        with tf.GradientTape() as tape:
            y = ops.embedding_lookup(table, ids, "mean")
            loss = tf.reduce_sum(y)
        return y, tape.gradient(loss, table)

    for batch in (3, 11, 1, 29):
        ids = ref.random_ids(rng, batch, 40)
        y, g = f(tf.constant(ids.dense()))
        np.testing.assert_allclose(y.numpy(), ref.np_lookup(table.numpy(), ids.splits, ids.keys, None, "mean"),
                                   rtol=1e-5, atol=1e-5)
        assert isinstance(g, tf.IndexedSlices)
    for batch in (4, 9):                                     # ragged input in a tf.function
        ids = ref.random_ids(rng, batch, 40)
        y, _ = f(ids.ragged(tf))
        assert y.shape == (batch, 5)


class _Pooled(keras.layers.Layer):
    def __init__(self, rows, dim, **kw):
        super().__init__(**kw)
        self.table = self.add_weight(shape=(rows, dim), initializer="random_normal", name="table")

    def call(self, ids):
        return ops.embedding_lookup(self.table, ids, "mean")


def test_model_fit_trains_only_touched_rows(rng):
    rows, dim, n = 50, 4, 256
    keys = rng.integers(0, 30, (n, 3)).astype(np.int64)      # rows 30..49 are never used
    keys[rng.random(keys.shape) < 0.2] = -1
    y = (keys.max(axis=1) % 2).astype(np.float32)
    inp = keras.Input(shape=(3,), dtype="int64")
    h = _Pooled(rows, dim)(inp)
    out = keras.layers.Dense(1, activation="sigmoid")(h)
    model = keras.Model(inp, out)
    model.compile(optimizer=eopt.Adagrad(0.5), loss="binary_crossentropy")
    before = model.layers[1].table.numpy().copy()
    hist = model.fit(keys, y, batch_size=32, epochs=4, verbose=0)
    after = model.layers[1].table.numpy()
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    assert np.array_equal(before[30:], after[30:])
    assert not np.array_equal(before[:30], after[:30])


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_saved_model_round_trip_in_subprocess(rng, tmp_path, kind):
    # Dense ids go through EmbedLabFusedResourceLookup, SparseTensor ids through
    # EmbedLabFusedResourceSparseLookup: both ops must load with the SavedModel.
    table = _table(rng, 20, 3)
    ids = ref.random_ids(rng, 6, 20)
    spec = (tf.TensorSpec([None, None], tf.int64) if kind == "dense" else
            tf.SparseTensorSpec([None, None], tf.int64))

    class M(tf.Module):
        def __init__(self):
            self.table = tf.Variable(table)

        @tf.function(input_signature=[spec])
        def __call__(self, ids):
            return ops.embedding_lookup(self.table, ids, "sum")

    m = M()
    x = tf.constant(ids.dense()) if kind == "dense" else ids.sparse(tf)
    want = m(x).numpy()
    np.testing.assert_allclose(want, ref.np_lookup(table, ids.splits, ids.keys, None, "sum"), rtol=1e-5, atol=1e-5)
    tf.saved_model.save(m, str(tmp_path / "sm"))
    np.save(tmp_path / "ids.npy", ids.dense())
    np.save(tmp_path / "want.npy", want)
    code = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        import embedlab.ops  # registers the op library, so the SavedModel loads
        m = tf.saved_model.load({str(tmp_path / 'sm')!r})
        dense = tf.constant(np.load({str(tmp_path / 'ids.npy')!r}))
        x = dense if {kind!r} == "dense" else tf.sparse.from_dense(dense + 1)  # keys + 1, so -1 pads drop out
        x = x if {kind!r} == "dense" else tf.SparseTensor(x.indices, x.values - 1, x.dense_shape)
        got = m(x).numpy()
        assert np.array_equal(got, np.load({str(tmp_path / 'want.npy')!r})), (got,)
        print("OK")
    """)
    env = dict(os.environ, PYTHONPATH=str(EMBEDLAB_HOME) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-2000:]
    if kind == "sparse":
        graph_ops = {op.type for op in m.__call__.get_concrete_function().graph.get_operations()}
        assert "EmbedLabFusedResourceSparseLookup" in graph_ops


# ---- bad input ---------------------------------------------------------------------------------

def _unchanged(var, before):
    assert np.array_equal(var.numpy(), before)


@pytest.mark.parametrize("form", ["ragged", "sparse", "dense"])
@pytest.mark.parametrize("bad", [10, 12345, -2, -7])
def test_bad_keys_raise_and_change_nothing(rng, form, bad):
    table = tf.Variable(_table(rng, 10, 3))
    before = table.numpy().copy()
    ids = ref.random_ids(rng, 5, 10, pad_prob=0.0)
    ids.keys[len(ids.keys) // 2] = bad
    x, _ = _ids_arg(ids, form, False, rng)
    opt = eopt.SGD(0.1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)) as e:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.embedding_lookup(table, x))
        opt.apply_gradients([(tape.gradient(loss, table), table)])
    msg = str(e.value)
    assert "EmbedLab" in msg and str(bad) in msg, msg
    _unchanged(table, before)


def test_bad_key_in_graph_mode(rng):
    table = tf.Variable(_table(rng, 10, 3))
    f = tf.function(lambda ids: ops.embedding_lookup(table, ids))
    with pytest.raises(tf.errors.InvalidArgumentError, match="10"):
        f(tf.constant([[1, 10]], tf.int64))


def test_ragged_weights_with_other_splits():
    table = tf.Variable(tf.ones([5, 2]))
    ids = tf.ragged.constant([[1, 2], [3]], dtype=tf.int64)
    w = tf.ragged.constant([[1.0], [2.0, 3.0]], dtype=tf.float32)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="row_splits"):
        ops.embedding_lookup(table, ids, weights=w)


def test_weights_shaped_unlike_ids():
    table = tf.Variable(tf.ones([5, 2]))
    with pytest.raises(ValueError, match="weights"):
        ops.embedding_lookup(table, tf.constant([[1, 2]], tf.int64), weights=tf.ones([1, 3]))
    with pytest.raises(ValueError, match="weights"):
        ops.embedding_lookup(table, tf.ragged.constant([[1, 2]], dtype=tf.int64), weights=tf.ones([1, 2]))
    sp = tf.SparseTensor([[0, 0], [0, 1]], tf.constant([1, 2], tf.int64), [1, 2])
    spw = tf.SparseTensor([[0, 0], [0, 2]], [1.0, 1.0], [1, 3])
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="weights"):
        ops.embedding_lookup(table, sp, weights=spw)


def test_float_ids_and_float64_table():
    with pytest.raises(ValueError, match="int64.*float32|float32"):
        ops.embedding_lookup(tf.Variable(tf.ones([5, 2])), tf.constant([[1.0, 2.0]]))
    with pytest.raises(ValueError, match="float32.*float64|float64"):
        ops.embedding_lookup(tf.Variable(tf.ones([5, 2], tf.float64)), tf.constant([[1, 2]], tf.int64))
    with pytest.raises(ValueError, match="float64"):
        ops.embedding_lookup(tf.ones([5, 2], tf.float64), tf.constant([[1, 2]], tf.int64))
    with pytest.raises(ValueError, match="combiner"):
        ops.embedding_lookup(tf.ones([5, 2]), tf.constant([[1, 2]], tf.int64), combiner="max")
