"""embedlab.SparseInput: one type from every input form, the same lookups whatever the form."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import embedlab
import embedlab.optimizers as eopt
from embedlab import ops, plugin
from embedlab.sparse_input import SparseInput, as_csr

from reference import np_lookup, random_ids

FORMS = ("dense", "ragged", "sparse", "sparse_shuffled", "csr")


def _make(ids, form, rng, weighted):
    """A SparseInput of `ids` (reference.Ids) built from the given form."""
    if form == "dense":
        d, dw = ids.dense(with_weights=True)
        return SparseInput.from_dense(d, dw if weighted else None)
    if form == "ragged":
        r, w = ids.ragged(tf, with_weights=True)
        return SparseInput.from_ragged(r, w if weighted else None)
    if form.startswith("sparse"):
        s, w = ids.sparse(tf, with_weights=True, shuffle_rng=rng if form == "sparse_shuffled" else None)
        return SparseInput.from_sparse(s, w if weighted else None)
    return SparseInput.from_row_splits(ids.splits, ids.keys, ids.weights if weighted else None)


def _valid_csr(x):
    """(splits, keys, weights) with -1 keys dropped and each row's entries sorted: what every
    form must agree on (unordered COO keeps its own order within a row)."""
    s, k, w = (t.numpy() if t is not None else None for t in (x.row_splits, x.keys, x.weights))
    keep = k >= 0
    rows = np.repeat(np.arange(len(s) - 1), np.diff(s))[keep]
    k = k[keep]
    w = None if w is None else w[keep]
    order = np.lexsort((np.zeros_like(k) if w is None else w, k, rows))
    splits = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(s) - 1))])
    return splits, k[order], None if w is None else w[order]


def test_package_exports_the_type():
    assert embedlab.SparseInput is SparseInput


@pytest.mark.parametrize("weighted", [False, True])
def test_every_form_gives_the_same_csr_and_batch(rng, weighted):
    ids = random_ids(rng, batch=int(rng.integers(5, 40)), rows=50, max_nnz=4)
    ref = None
    for form in FORMS:
        x = _make(ids, form, rng, weighted)
        assert x.is_coo == form.startswith("sparse")
        assert int(x.batch_size) == ids.batch
        assert x.has_weights == weighted
        got = _valid_csr(x)
        assert not x.is_coo                      # reading the CSR converted it
        if ref is None:
            ref = got
            keep = ids.keys >= 0
            np.testing.assert_array_equal(np.sort(got[1]), np.sort(ids.keys[keep]))
            continue
        np.testing.assert_array_equal(got[0], ref[0], err_msg=form)
        np.testing.assert_array_equal(got[1], ref[1], err_msg=form)
        if weighted:
            np.testing.assert_array_equal(got[2], ref[2], err_msg=form)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_lookup_is_identical_for_every_form(rng, combiner, weighted):
    rows, dim = 60, 5
    t1 = tf.Variable(rng.standard_normal((rows, dim)).astype(np.float32))
    t2 = rng.standard_normal((rows, 3)).astype(np.float32)           # a plain tensor: the CSR op
    a = random_ids(rng, 33, rows, max_nnz=5)
    b = random_ids(rng, 33, rows, max_nnz=3)
    want_a = np_lookup(t1.numpy(), a.splits, a.keys, a.weights if weighted else None, combiner)
    want_b = np_lookup(t2, b.splits, b.keys, b.weights if weighted else None, combiner)
    outs, grads = {}, {}
    for form in FORMS:
        xa, xb = _make(a, form, rng, weighted), _make(b, form, rng, weighted)
        with tf.GradientTape() as tape:
            oa, ob = ops.fused_embedding_lookup([t1, t2], [xa, xb], combiner)
            loss = tf.reduce_sum(oa * oa)
        g = tape.gradient(loss, t1)
        outs[form] = (oa.numpy(), ob.numpy())
        grads[form] = tf.convert_to_tensor(g).numpy()
        np.testing.assert_allclose(outs[form][0], want_a, rtol=1e-5, atol=1e-5, err_msg=form)
        np.testing.assert_allclose(outs[form][1], want_b, rtol=1e-5, atol=1e-5, err_msg=form)
    for form in FORMS:       # bit for bit the same whatever the form (unordered COO adds in its own order)
        check = np.testing.assert_array_equal if form != "sparse_shuffled" else \
            lambda a, b, err_msg: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=err_msg)
        check(outs[form][0], outs["ragged"][0], err_msg=form)
        check(outs[form][1], outs["ragged"][1], err_msg=form)
        check(grads[form], grads["ragged"], err_msg=form)


def test_fused_lookup_in_graph_takes_coo_and_csr_inputs(rng):
    rows = 40
    table = tf.Variable(rng.standard_normal((rows, 4)).astype(np.float32))
    ids = random_ids(rng, 17, rows)

    @tf.function
    def f(sp):
        return ops.embedding_lookup(table, SparseInput.from_sparse(sp))

    want = np_lookup(table.numpy(), ids.splits, ids.keys)
    np.testing.assert_allclose(f(ids.sparse(tf, shuffle_rng=rng)).numpy(), want, rtol=1e-5, atol=1e-6)


def test_optimizer_in_backward_takes_a_sparse_input(rng):
    rows = 30
    init = rng.standard_normal((rows, 4)).astype(np.float32)
    ids = random_ids(rng, 12, rows)
    after = {}
    for form in ("ragged", "sparse"):
        table = tf.Variable(init)
        opt = eopt.SGD(0.1)
        with tf.GradientTape() as tape:
            out = ops.fused_embedding_lookup([table], [_make(ids, form, rng, False)], "sum", optimizer=opt)[0]
            loss = tf.reduce_sum(out * out)
        assert tape.gradient(loss, [table]) == [None]
        after[form] = table.numpy()
    np.testing.assert_array_equal(after["sparse"], after["ragged"])
    assert not np.array_equal(after["sparse"], init)


def test_as_csr_converts_many_coo_in_one_go(rng):
    a, b = random_ids(rng, 9, 20), random_ids(rng, 4, 20)
    xs = [SparseInput.from_sparse(a.sparse(tf, shuffle_rng=rng)), SparseInput.from_dense(b.dense()),
          SparseInput.from_sparse(b.sparse(tf))]
    csr = as_csr(xs)
    assert not any(x.is_coo for x in xs)
    np.testing.assert_array_equal(csr[0][0].numpy(), a.splits)
    np.testing.assert_array_equal(csr[2][0].numpy(), b.splits)
    np.testing.assert_array_equal(csr[2][1].numpy(), b.keys)
    assert all(w is None for _, _, w in csr)


def _layer_keys(rng, batch, slots, max_nnz, vocab):
    """Dense [batch, slots, max_nnz] keys with -1 padding, empty slots and duplicates."""
    counts = rng.integers(0, max_nnz + 1, size=(batch, slots))
    counts[0, 0] = 0
    counts[-1, -1] = max_nnz
    dense = np.full((batch, slots, max_nnz), -1, np.int64)
    mask = np.arange(max_nnz)[None, None, :] < counts[:, :, None]
    dense[mask] = rng.integers(0, vocab, size=int(mask.sum()))
    dense[-1, -1, 1] = dense[-1, -1, 0]
    return dense, mask


@pytest.mark.parametrize("own_optimizer", [False, True])
def test_plugin_layer_is_identical_for_every_form(rng, own_optimizer):
    B, S, M, V, D = 6, 4, 3, 50, 4
    dense, mask = _layer_keys(rng, B, S, M, V)
    idx = np.argwhere(mask)
    flat = dense.reshape(B * S, M)
    counts = mask.reshape(B * S, M).sum(1)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    keys = flat[mask.reshape(B * S, M)]
    r = tf.constant(rng.standard_normal((B, S, D)).astype(np.float32))
    forms = {
        "dense": tf.constant(dense),
        "sparse3": tf.SparseTensor(idx, dense[mask], [B, S, M]),
        "csr": (tf.constant(splits), tf.constant(keys)),
        "input_dense": SparseInput.from_dense(flat),
        "input_sparse": SparseInput.from_sparse(tf.SparseTensor(np.argwhere(mask.reshape(B * S, M)), keys, [B * S, M])),
        "input_csr": SparseInput.from_row_splits(splits, keys),
    }
    outs, tables = {}, {}
    for name, x in forms.items():
        layer = plugin.EmbeddingLayer(V, D, S, M, "mean", devices=["/CPU:0"], seed=3,
                                      optimizer=eopt.SGD(0.5) if own_optimizer else None)
        with tf.GradientTape() as tape:
            out = layer(x)
            loss = tf.reduce_sum(out * r)
        grads = tape.gradient(loss, layer.trainable_variables)
        if not own_optimizer:
            eopt.SGD(0.5).apply_gradients(zip(grads, layer.trainable_variables))
        outs[name], tables[name] = out.numpy(), layer.get_table()
    for name in forms:
        np.testing.assert_array_equal(outs[name], outs["dense"], err_msg=name)
        np.testing.assert_array_equal(tables[name], tables["dense"], err_msg=name)
    assert np.abs(outs["dense"][0, 0]).max() == 0.0          # the empty slot


def test_sok_lookup_sparse_takes_a_sparse_input(rng):
    import embedlab.sok as sok
    sok.init()
    v = sok.Variable(rng.standard_normal((40, 3)).astype(np.float32))
    ids = random_ids(rng, 11, 40, max_nnz=4, pad_prob=0.0)
    got_r = sok.lookup_sparse([v], [ids.ragged(tf)], combiners=["sum"])[0].numpy()
    got_x = sok.lookup_sparse([v], [SparseInput.from_sparse(ids.sparse(tf))], combiners=["sum"])[0]
    np.testing.assert_array_equal(got_x.numpy(), got_r)
    x = SparseInput.from_ragged(*ids.ragged(tf, with_weights=True))
    r, w = ids.ragged(tf, with_weights=True)
    np.testing.assert_array_equal(sok.lookup_sparse([v], [x], combiners=["mean"])[0].numpy(),
                                  sok.lookup_sparse([v], [r], [w], combiners=["mean"])[0].numpy())


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match=r"from_dense: ids must be int64 \(or int32\) keys, got float32"):
        SparseInput.from_dense(tf.constant([[1.0]]))
    with pytest.raises(ValueError, match=r"from_dense: dense ids must be \[batch, max_nnz\].*shape \(1, 1, 1\)"):
        SparseInput.from_dense(tf.zeros([1, 1, 1], tf.int64))
    with pytest.raises(ValueError, match="from_dense: ids must be a dense tensor, got RaggedTensor"):
        SparseInput.from_dense(tf.ragged.constant([[1]], tf.int64))
    with pytest.raises(ValueError, match=r"weights shape \(1, 3\) differs from ids shape \(1, 2\)"):
        SparseInput.from_dense([[1, 2]], tf.ones([1, 3]))
    with pytest.raises(ValueError, match="weights must be float32, got float64"):
        SparseInput.from_dense([[1, 2]], tf.ones([1, 2], tf.float64))
    with pytest.raises(ValueError, match="from_ragged: ids must be a tf.RaggedTensor, got"):
        SparseInput.from_ragged([[1]])
    with pytest.raises(ValueError, match="ragged_rank 2"):
        SparseInput.from_ragged(tf.ragged.constant([[[1]]], tf.int64))
    with pytest.raises(ValueError, match="weights.row_splits differ from ids.row_splits"):
        SparseInput.from_ragged(tf.ragged.constant([[1, 2], [3]], tf.int64), tf.ragged.constant([[1.0], [2.0, 3.0]]))
    with pytest.raises(ValueError, match="from_sparse: ids must be a tf.SparseTensor"):
        SparseInput.from_sparse(tf.constant([[1]], tf.int64))
    sp = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64), [2, 1])
    with pytest.raises(ValueError, match="weights.indices differ from ids.indices"):
        SparseInput.from_sparse(sp, tf.SparseTensor([[0, 0], [0, 1]], [1.0, 2.0], [2, 2]))
    with pytest.raises(ValueError, match="row_splits must be int64 \\(or int32\\), got float32"):
        SparseInput.from_row_splits(tf.constant([0.0, 1.0]), [1])
    with pytest.raises(ValueError, match="row_splits and keys must be 1-D"):
        SparseInput.from_row_splits([0, 1], [[1]])
    with pytest.raises(ValueError, match="row_splits must hold rows \\+ 1 >= 1 offsets"):
        SparseInput.from_row_splits(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64))
    with pytest.raises(ValueError, match="weights hold 1 values but keys hold 2"):
        SparseInput.from_row_splits([0, 2], [1, 2], [1.0])
    with pytest.raises(ValueError, match="carries its own weights"):
        SparseInput.from_any(SparseInput.from_dense([[1]]), [[1.0]])
    table = tf.Variable(tf.ones([4, 2]))
    with pytest.raises(ValueError, match="fused_embedding_lookup: weights must be given for every table or for none"):
        ops.fused_embedding_lookup([table, table], [SparseInput.from_dense([[1]], [[2.0]]),
                                                    SparseInput.from_dense([[1]])], "sum")
    with pytest.raises(ValueError, match="backward_trigger is only used with an optimizer"):
        ops.fused_embedding_lookup([table], [[[1]]], "sum", backward_trigger=tf.Variable(0.0))
    layer = plugin.EmbeddingLayer(4, 2, 1, 2, devices=["/CPU:0"])
    with pytest.raises(ValueError, match="argument inputs: the layer pools without weights"):
        layer(SparseInput.from_dense([[1, 2]], [[1.0, 1.0]]))
    with pytest.raises(ValueError, match="argument inputs.dense_shape must be"):
        layer(SparseInput.from_sparse(tf.SparseTensor([[0, 2]], tf.constant([1], tf.int64), [1, 3])))
    with pytest.raises(tf.errors.InvalidArgumentError, match="key 9 .*outside the table of 4 rows"):
        ops.embedding_lookup(table, SparseInput.from_sparse(tf.SparseTensor([[0, 0]], tf.constant([9], tf.int64),
                                                                            [1, 1])))
