"""SOK's first-generation API as HugeCTR's own code calls it (SparseOperationKit v1, as of
HugeCTR v23.09.00: sparse_operation_kit/embeddings/*.py, core/*.py). One worker."""
from __future__ import annotations

import inspect

import numpy as np
import pytest
import tensorflow as tf

import embedlab.sok as sok


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


# The parameters (name, default) of SOK v1's constructors, from its source at v23.09.00.
_SOK_V1 = {
    "DistributedEmbedding": [("combiner", None), ("max_vocabulary_size_per_gpu", None), ("embedding_vec_size", None),
                             ("slot_num", None), ("max_nnz", None), ("max_feature_num", 1), ("use_hashtable", True),
                             ("key_dtype", None), ("embedding_initializer", None)],
    "All2AllDenseEmbedding": [("max_vocabulary_size_per_gpu", None), ("embedding_vec_size", None), ("slot_num", None),
                              ("nnz_per_slot", None), ("dynamic_input", False), ("use_hashtable", True),
                              ("key_dtype", None), ("embedding_initializer", None)],
}


@pytest.mark.parametrize("cls", sorted(_SOK_V1))
def test_v1_layer_signatures_match_sok(cls):
    params = list(inspect.signature(getattr(sok, cls).__init__).parameters.values())[1:]
    ours = [(p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert ours == _SOK_V1[cls]


@pytest.mark.parametrize("use_hashtable", [False, True])
def test_key_dtype_none_means_int64(use_hashtable):
    # SOK's signature default; SOK's EmbeddingVariable reads it as `key_dtype or dtypes.int64`.
    init = tf.keras.initializers.Constant(0.5)
    dist = sok.DistributedEmbedding("sum", 16, 3, slot_num=2, max_nnz=2, use_hashtable=use_hashtable, key_dtype=None,
                                    embedding_initializer=init)
    dense = sok.All2AllDenseEmbedding(16, 3, slot_num=2, nnz_per_slot=1, use_hashtable=use_hashtable, key_dtype=None,
                                      embedding_initializer=init)
    assert dist.key_dtype == tf.int64 and dense.key_dtype == tf.int64
    # 1 sample x 2 slots: slot 0 holds keys 1, 2; slot 1 holds key 3
    sp = tf.SparseTensor([[0, 0], [0, 1], [1, 0]], tf.constant([1, 2, 3], tf.int64), [2, 2])
    np.testing.assert_array_equal(dist(sp).numpy(), [[[1.0] * 3, [0.5] * 3]])
    out = dense(tf.constant([[[4], [5]]], tf.int64))
    assert out.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(out.numpy(), np.full((1, 2, 1, 3), 0.5, np.float32))


def test_bad_key_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="key_dtype must be int64, int32, uint32 or None"):
        sok.All2AllDenseEmbedding(16, 3, slot_num=1, nnz_per_slot=1, key_dtype=tf.float32)
    with pytest.raises(ValueError, match="key_dtype must be int64, int32, uint32 or None .*'keys'"):
        sok.DistributedEmbedding("sum", 16, 3, slot_num=1, max_nnz=1, key_dtype="keys")


def test_get_embedding_creates_once_then_returns_the_same_layer():
    emb = sok.get_embedding("compat_emb", sok.All2AllDenseEmbedding, max_vocabulary_size_per_gpu=8,
                            embedding_vec_size=2, slot_num=1, nnz_per_slot=1)
    assert isinstance(emb, sok.All2AllDenseEmbedding)
    assert sok.get_embedding("compat_emb") is emb
    assert sok.get_embedding("compat_emb", sok.All2AllDenseEmbedding, max_vocabulary_size_per_gpu=99,
                             embedding_vec_size=2, slot_num=1, nnz_per_slot=1) is emb
    with pytest.raises(ValueError, match="no embedding layer 'missing' yet, and no constructor"):
        sok.get_embedding("missing")


@pytest.mark.parametrize("layer", ["dense", "sparse"])
def test_v1_layers_under_mixed_float16_keep_float32_tables_and_return_the_compute_dtype(layer):
    """SOK keeps its tables in the policy's variable dtype (float32) and returns vectors in its
    compute dtype; here the layers used to fail under `mixed_float16` (AttributeError inside the
    dtype check, whose message could not be built)."""
    import keras
    keys = np.array([[[1], [2]], [[3], [0]]], np.int64)
    old = keras.mixed_precision.global_policy()
    try:
        keras.mixed_precision.set_global_policy("mixed_float16")
        if layer == "dense":
            lay = sok.All2AllDenseEmbedding(16, 4, slot_num=2, nnz_per_slot=1, use_hashtable=False,
                                            embedding_initializer=keras.initializers.RandomUniform(-1, 1, seed=3))
            ids = tf.constant(keys)
        else:
            lay = sok.DistributedEmbedding("sum", 16, 4, slot_num=2, max_nnz=1, use_hashtable=False,
                                           embedding_initializer=keras.initializers.RandomUniform(-1, 1, seed=3))
            ids = tf.SparseTensor([[r, 0] for r in range(4)], tf.constant(keys.reshape(-1)), [4, 1])
        with tf.GradientTape() as tape:
            out = lay(ids)
            loss = tf.reduce_sum(tf.cast(out, tf.float32))
        grad = tape.gradient(loss, lay.embedding_variable)
    finally:
        keras.mixed_precision.set_global_policy(old)
    table = lay.embedding_variable.numpy()
    assert table.dtype == np.float32
    assert out.dtype == tf.float16
    want = table[keys.reshape(-1)].reshape(2, 2, 1, 4) if layer == "dense" else table[keys.reshape(-1)].reshape(2, 2, 4)
    np.testing.assert_array_equal(out.numpy(), want.astype(np.float16))
    assert grad is not None


@pytest.mark.parametrize("layer", ["dense", "sparse"])
def test_embedding_variable_values_name_the_saver_files_as_sok_demo_tests_read_them(layer, tmp_path, rng):
    """HugeCTR's test_{sparse,dense}_emb_demo_model_*_worker.py train with OptimizerScope, dump the
    table with Saver, then open `<embedding_variable.values[0].m_var_name>_keys.file` and
    `_values.file` and compare them with TensorFlow's table."""
    import keras
    vocab, dim = 32, 3
    keys = rng.integers(0, 10**12, size=8)
    keys[1] = keys[0]                                       # a duplicate key
    if layer == "dense":
        lay, other = (sok.All2AllDenseEmbedding(vocab, dim, slot_num=2, nnz_per_slot=1) for _ in range(2))
        ids = tf.constant(keys.reshape(4, 2, 1))
    else:
        lay, other = (sok.DistributedEmbedding("sum", vocab, dim, slot_num=2, max_nnz=1) for _ in range(2))
        ids = tf.SparseTensor([[r, 0] for r in range(8)], tf.constant(keys), [8, 1])
    var = lay.embedding_variable
    assert isinstance(var.values, tuple) and len(var.values) == 1 and var.values[0] is var
    assert var.values[0].m_var_name != other.embedding_variable.values[0].m_var_name   # one file pair per table
    opt = keras.optimizers.SGD(learning_rate=0.5)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(lay(ids) ** 2)
    emb_vars, _ = sok.split_embedding_variable_from_others([var])
    grads = tape.gradient(loss, emb_vars)
    with sok.OptimizerScope(emb_vars):
        opt.apply_gradients(zip(grads, emb_vars), experimental_aggregate_gradients=False)
    trained = lay(ids).numpy().reshape(-1, dim)
    sok.Saver().dump_to_file(var, str(tmp_path))
    name = var.values[0].m_var_name
    saved_keys = np.fromfile(tmp_path / f"{name}_keys.file", np.int64)
    saved_values = np.fromfile(tmp_path / f"{name}_values.file", np.float32).reshape(-1, dim)
    assert sorted(saved_keys.tolist()) == sorted(set(keys.tolist()))
    row_of = {int(k): saved_values[i] for i, k in enumerate(saved_keys)}
    np.testing.assert_array_equal(np.stack([row_of[int(k)] for k in keys]), trained)
