"""hps.LookupLayer / SparseLookupLayer against tf.nn.embedding_lookup and
tf.nn.safe_embedding_lookup_sparse; tf.function with varying batches; the SavedModel round trip in a
fresh process with implicit initialisation."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import embedlab.hps as hps

from hps_testing import Table


@pytest.fixture()
def served(tmp_path, rng):
    tab = Table(tmp_path / "t", n=800, dim=12, rng=rng, key_space=5000)
    cfg = {"volatile_db": {"type": "disabled"}, "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "db")},
           "models": [{"model": "lm", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [12],
                       "gpucache": False, "default_value_for_each_table": [0.0]}]}
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(cfg))
    # the dense table the TF reference ops see: row i = key (i - 5000); absent keys are zero rows
    dense = np.zeros((10000, 12), np.float32)
    dense[tab.keys + 5000] = tab.vectors
    yield tab, str(path), dense, rng
    hps.shutdown()


@pytest.mark.parametrize("shape", [(7,), (4, 3), (2, 3, 5), (0, 3)])
@pytest.mark.parametrize("dtype", [tf.int64, tf.int32])
def test_lookup_layer_matches_embedding_lookup(served, shape, dtype):
    tab, path, dense, rng = served
    layer = hps.LookupLayer("lm", 0, 12, ps_config_file=path, global_batch_size=64)   # implicit init
    ids = rng.integers(-5000, 5000, shape)
    ids.flat[: min(ids.size, 4)] = tab.keys[:min(ids.size, 4)]          # duplicates of present keys
    got = layer(tf.constant(ids, dtype))
    ref = tf.nn.embedding_lookup(dense, ids + 5000)
    assert got.shape == tuple(shape) + (12,)
    np.testing.assert_array_equal(got.numpy(), ref.numpy())


def test_lookup_layer_in_tf_function_varying_batch_and_max_norm(served):
    tab, path, dense, rng = served
    hps.Init(64, path)                                                   # explicit init
    layer = hps.LookupLayer("lm", 0, 12)                                 # no ps_config_file: last Init

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def f(x):
        return layer(x), layer(x, max_norm=0.5)

    for b in (1, 5, 33, 2):
        ids = tab.keys[rng.integers(0, len(tab.keys), (b, 3))]
        a, c = f(tf.constant(ids))
        np.testing.assert_array_equal(a.numpy(), tf.nn.embedding_lookup(dense, ids + 5000).numpy())
        np.testing.assert_allclose(c.numpy(), tf.nn.embedding_lookup(dense, ids + 5000, max_norm=0.5).numpy(),
                                   rtol=1e-6, atol=1e-7)
    assert f.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("combiner", ["mean", "sum", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_sparse_lookup_layer_matches_safe_embedding_lookup_sparse(served, combiner, weighted):
    tab, path, dense, rng = served
    layer = hps.SparseLookupLayer("lm", 0, 12, ps_config_file=path)
    batch = 9
    rows, vals = [], []
    for r in range(batch):
        nnz = 0 if r in (0, 4) else int(rng.integers(1, 5))                   # empty rows
        for j in range(nnz):
            rows.append([r, j])
            vals.append(int(tab.keys[rng.integers(0, 20)]))                     # duplicates likely
    sp = tf.SparseTensor(np.array(rows, np.int64).reshape(-1, 2), np.array(vals, np.int64), [batch, 6])
    spw = tf.SparseTensor(sp.indices, rng.uniform(0.1, 2.0, len(vals)).astype(np.float32), sp.dense_shape) \
        if weighted else None
    got = layer(sp, spw, combiner=combiner)
    ref = tf.nn.safe_embedding_lookup_sparse(tf.constant(dense), tf.SparseTensor(sp.indices, sp.values + 5000,
                                             sp.dense_shape), spw, combiner=combiner)
    assert got.shape == (batch, 12)
    if combiner == "sqrtn" and weighted:
        # TensorFlow's pow(w, 2) gives other bits in its vectorised body than in its scalar tail, and
        # safe_embedding_lookup_sparse's filled empty rows shift the weights' positions: TF's own
        # safe_ and plain embedding_lookup_sparse differ by an ulp here (the bitwise test is below).
        np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)
    else:
        np.testing.assert_array_equal(got.numpy(), ref.numpy())      # the same bits, empty rows included
    assert not got.numpy()[[0, 4]].any()


def test_layer_errors_name_the_problem(served):
    tab, path, dense, rng = served
    with pytest.raises(ValueError, match="emb_vec_dtype"):
        hps.LookupLayer("lm", 0, 12, emb_vec_dtype=tf.float16)
    with pytest.raises(ValueError, match="table_id"):
        hps.LookupLayer("lm", -1, 12)
    with pytest.raises(tf.errors.InvalidArgumentError, match="unknown model 'nope'"):
        hps.LookupLayer("nope", 0, 12, ps_config_file=path)(tf.constant([1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="emb_vec_size is 8"):
        hps.LookupLayer("lm", 0, 8, ps_config_file=path)(tf.constant([1], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="missing.json"):
        hps.LookupLayer("lm", 0, 12, ps_config_file=str(os.path.dirname(path)) + "/missing.json")(
            tf.constant([1], tf.int64))
    with pytest.raises(TypeError, match="int32 or int64"):
        hps.LookupLayer("lm", 0, 12, ps_config_file=path)(tf.constant([1.0]))


def test_savedmodel_round_trip_in_fresh_process(served, tmp_path):
    tab, path, dense, rng = served
    look = hps.LookupLayer("lm", 0, 12, ps_config_file=path, global_batch_size=128)
    sparse = hps.SparseLookupLayer("lm", 0, 12, ps_config_file=path, global_batch_size=128)

    class M(tf.Module):
        def __init__(self):
            super().__init__()
            self.look, self.sparse = look, sparse

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.int64)])
        def serve(self, ids):
            sp = tf.sparse.from_dense(ids + 1)          # zeros -> empty slots
            sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)
            return {"dense": self.look(ids), "pooled": self.sparse(sp, combiner="sum")}

    m = M()
    ids = tab.keys[rng.integers(0, len(tab.keys), (6, 2))]
    want = m.serve(tf.constant(ids))
    tf.saved_model.save(m, str(tmp_path / "sm"))
    np.save(tmp_path / "ids.npy", ids)
    np.save(tmp_path / "dense.npy", want["dense"].numpy())
    np.save(tmp_path / "pooled.npy", want["pooled"].numpy())
    code = f"""
import numpy as np, tensorflow as tf
import embedlab.hps as hps
assert not hps.servers()
m = tf.saved_model.load({str(tmp_path / 'sm')!r})
ids = np.load({str(tmp_path / 'ids.npy')!r})
for reps in (1, 3):                      # varying batch sizes through the loaded function
    out = m.serve(tf.constant(np.tile(ids, (reps, 1))))
    assert np.array_equal(out["dense"].numpy(), np.tile(np.load({str(tmp_path / 'dense.npy')!r}), (reps, 1, 1)))
    assert np.array_equal(out["pooled"].numpy(), np.tile(np.load({str(tmp_path / 'pooled.npy')!r}), (reps, 1)))
assert list(hps.servers()) == [{str(os.path.realpath(path))!r}], hps.servers()      # implicit init
print("fresh-ok")
"""
    hps.shutdown()            # releases the RocksDB lock for the other process
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert "fresh-ok" in r.stdout, r.stderr[-3000:]


def test_lookup_layer_takes_ids_by_keyword_and_positionally(served):
    """HugeCTR's signature is call(self, ids, max_norm=None): `layer(ids=...)` works, and Keras
    (a functional model) passes the ids positionally."""
    tab, path, dense, rng = served
    layer = hps.LookupLayer("lm", 0, 12, tf.float32, ps_config_file=path)
    ids = tab.keys[rng.integers(0, len(tab.keys), (5, 3))]
    ref = tf.nn.embedding_lookup(dense, ids + 5000).numpy()
    np.testing.assert_array_equal(layer(ids=tf.constant(ids)).numpy(), ref)
    np.testing.assert_array_equal(layer(ids=ids.astype(np.int32), max_norm=None).numpy(), ref)  # NumPy ids
    np.testing.assert_array_equal(layer(tf.constant(ids), max_norm=tf.Variable(0.5)).numpy(),
                                  tf.nn.embedding_lookup(dense, ids + 5000, max_norm=tf.Variable(0.5)).numpy())
    x = tf.keras.Input(shape=(3,), dtype=tf.int64)
    model = tf.keras.Model(x, layer(x))
    np.testing.assert_array_equal(model(tf.constant(ids)).numpy(), ref)


def _canonical_sparse(rng, keys, batch, max_nnz, lo=1):
    """A [batch, max_nnz] SparseTensor in canonical row-major order, lo..max_nnz ids per row."""
    indices, values = [], []
    for r in range(batch):
        nnz = int(rng.integers(lo, max_nnz + 1))
        for c in sorted(rng.choice(max_nnz, nnz, replace=False)):
            indices.append([r, int(c)])
            values.append(int(keys[rng.integers(0, len(keys))]))
    return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2), np.array(values, np.int64),
                           [batch, max_nnz])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("max_norm", [None, 0.0, 0.1, 10.0])
def test_sparse_lookup_layer_is_bitwise_embedding_lookup_sparse(served, combiner, weighted, max_norm):
    """Pooled with TensorFlow's own reduction in TensorFlow's order, so the result is the same bits
    as tf.nn.embedding_lookup_sparse (HugeCTR's test asserts tf.equal on every element)."""
    tab, path, dense, rng = served
    layer = hps.SparseLookupLayer("lm", 0, 12, tf.float32, ps_config_file=path)
    for batch, max_nnz in ((1, 10), (64, 10), (33, 3)):
        sp = _canonical_sparse(rng, tab.keys[:300], batch, max_nnz,
                               lo=max_nnz if batch == 1 else 1)        # one sample of 10 keys
        spw = tf.SparseTensor(sp.indices, rng.uniform(0.1, 2.0, sp.values.shape[0]).astype(np.float32),
                              sp.dense_shape) if weighted else None
        mn = None if max_norm is None else tf.Variable(max_norm)
        got = layer(sp_ids=sp, sp_weights=spw, combiner=combiner, max_norm=mn)
        ref = tf.nn.embedding_lookup_sparse(dense, tf.SparseTensor(sp.indices, sp.values + 5000, sp.dense_shape),
                                            spw, combiner=combiner, max_norm=mn)
        assert got.shape == ref.shape == (batch, 12)
        np.testing.assert_array_equal(got.numpy(), ref.numpy())


def test_sparse_lookup_layer_signature_and_row_order(served):
    """HugeCTR's call(sp_ids, sp_weights, name=None, combiner=None, max_norm=None): the combiner
    defaults to mean; ids given out of row order are pooled as their canonical order would be;
    trailing empty rows are zeros and the output keeps dense_shape[0] rows."""
    tab, path, dense, rng = served
    layer = hps.SparseLookupLayer("lm", 0, 12, tf.float32, ps_config_file=path)
    sp = _canonical_sparse(rng, tab.keys, 20, 6)
    ref = tf.nn.embedding_lookup_sparse(dense, tf.SparseTensor(sp.indices, sp.values + 5000, sp.dense_shape), None)
    np.testing.assert_array_equal(layer(sp, None).numpy(), ref.numpy())
    np.testing.assert_array_equal(layer(sp, None, name="pooled", combiner="mean").numpy(), ref.numpy())
    perm = rng.permutation(sp.values.shape[0])
    shuffled = tf.SparseTensor(tf.gather(sp.indices, perm), tf.gather(sp.values, perm), sp.dense_shape)
    np.testing.assert_array_equal(layer(shuffled, None, combiner="sum").numpy(),
                                  layer(sp, None, combiner="sum").numpy())
    wide = tf.SparseTensor(sp.indices, sp.values, [25, 6])        # rows 20..24 empty
    out = layer(wide, None, combiner="sum").numpy()
    assert out.shape == (25, 12) and not out[20:].any()
    np.testing.assert_array_equal(out[:20], layer(sp, None, combiner="sum").numpy())
    with pytest.raises(ValueError, match="combiner"):
        layer(sp, None, combiner="max")


def test_init_returns_ok_and_the_server_is_reachable(served):
    """hps.Init returns "OK" (HugeCTR documents and tests it); the server is hps.get_server(path)."""
    tab, path, dense, rng = served
    assert hps.Init(global_batch_size=16, ps_config_file=path) == "OK"
    assert hps.Init(16, path) == "OK"
    ps = hps.get_server(path)
    assert hps.get_server() is ps and isinstance(ps, hps.ParameterServer)
    np.testing.assert_array_equal(ps.lookup("lm", 0, tab.keys[:5]), tab.vectors[:5])
