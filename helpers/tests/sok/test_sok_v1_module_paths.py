"""SOK's first-generation module paths (HugeCTR v23.09.00, `sparse_operation_kit/embeddings/`,
`core/`, `optimizers/`, `saver/`) as NVIDIA's code imports them, e.g. HugeCTR's DenseDemo
`models.py`: `from sparse_operation_kit.embeddings.tf_distributed_embedding import
TFDistributedEmbedding`, which is `embedlab.sok.compat.embeddings.tf_distributed_embedding` here
(the compatibility wing; tests/test_package.py checks that the old `embedlab.sok.embeddings...`
paths resolve to it)."""
from __future__ import annotations

import importlib
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import embedlab.sok as sok
from reference import fresh_seed

HERE = os.path.dirname(os.path.abspath(__file__))

# module path under embedlab.sok.compat -> names it holds, which are embedlab.sok's own objects
_PATHS = {
    "embeddings.distributed_embedding": ["DistributedEmbedding"],
    "embeddings.all2all_dense_embedding": ["All2AllDenseEmbedding"],
    "embeddings.get_embedding_op": ["get_embedding"],
    "core.initialize": ["Init"],
    "core.context_scope": ["OptimizerScope"],
    "optimizers.utils": ["split_embedding_variable_from_others"],
    "optimizers": ["split_embedding_variable_from_others"],
    "saver.Saver": ["Saver"],
}


@pytest.mark.parametrize("path", sorted(_PATHS))
def test_sok_module_paths_hold_embedlab_sok_names(path):
    mod = importlib.import_module(f"embedlab.sok.compat.{path}")
    for name in _PATHS[path]:
        assert getattr(mod, name) is getattr(sok, name)


def test_submodules_are_attributes_of_the_package_as_in_sok():
    # SOK's package import brings these in; tf_distributed_embedding is imported by name
    from embedlab.sok.compat import core, embeddings, saver
    assert embeddings.distributed_embedding.DistributedEmbedding is sok.DistributedEmbedding
    assert embeddings.all2all_dense_embedding.All2AllDenseEmbedding is sok.All2AllDenseEmbedding
    assert core.initialize.Init is sok.Init
    assert saver.Saver.Saver is sok.Saver


def test_sok_compiled_adam_is_a_clear_error():
    from embedlab.sok.compat import optimizers
    with pytest.raises(AttributeError, match="SOK's compiled GPU Adam is not provided.*OptimizerScope"):
        optimizers.Adam


def test_tf_distributed_embedding_signature_is_sok_s():
    from embedlab.sok.compat.embeddings.tf_distributed_embedding import TFDistributedEmbedding as T
    params = list(inspect.signature(T.__init__).parameters.values())[1:]
    ours = [(p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    assert ours == [("vocabulary_size", None), ("embedding_vec_size", None), ("initializer", "GlorotNormal"),
                    ("comm_options", None)]
    assert list(inspect.signature(T.call).parameters) == ["self", "inputs"]
    assert list(inspect.signature(T.broadcast_variables).parameters) == ["self"]
    assert isinstance(inspect.getattr_static(T, "embedding_weights"), property)


@pytest.fixture(scope="module")
def strategy():
    return tf.distribute.MirroredStrategy(["/cpu:0"])


def test_tf_distributed_embedding_one_replica_lookup_and_training(strategy):
    from embedlab.sok.compat.embeddings.tf_distributed_embedding import TFDistributedEmbedding
    rng = np.random.default_rng(fresh_seed())
    table = rng.normal(size=(7, 4)).astype(np.float32)
    keys = rng.integers(0, 7, size=(3, 2, 2))
    keys[2, 1, 1] = keys[0, 0, 0]                           # a duplicate
    with strategy.scope():
        layer = TFDistributedEmbedding(7, 4, initializer=table)
        opt = tf.keras.optimizers.SGD(learning_rate=0.25)
    assert layer.embedding_weights.shape == (7, 4)
    assert len(layer.trainable_weights) == 1 and layer.trainable_weights[0] is layer.embedding_weights

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            out = layer(inputs=ids, training=True)
            loss = tf.reduce_sum(out * out)
        opt.apply_gradients(zip(tape.gradient(loss, [layer.embedding_weights]), [layer.embedding_weights]))
        return out

    out = strategy.run(step, args=(tf.constant(keys, tf.int64),))
    np.testing.assert_array_equal(np.asarray(out), table[keys])
    grad = np.zeros_like(table)
    np.add.at(grad, keys.reshape(-1), 2 * table[keys.reshape(-1)])
    np.testing.assert_allclose(layer.embedding_weights.numpy(), table - 0.25 * grad, rtol=1e-6, atol=1e-6)
    # int32 keys, as SOK's docstring allows
    out32 = strategy.run(tf.function(lambda ids: layer(ids)), args=(tf.constant(keys, tf.int32),))
    np.testing.assert_array_equal(np.asarray(out32), layer.embedding_weights.numpy()[keys])


def test_tf_distributed_embedding_errors(strategy):
    from embedlab.sok.compat.embeddings.tf_distributed_embedding import TFDistributedEmbedding
    with pytest.raises(RuntimeError, match="must be created under tf.distribute.Strategy.Scope"):
        TFDistributedEmbedding(4, 2)
    with strategy.scope(), pytest.raises(ValueError, match="shape of initializer must be"):
        TFDistributedEmbedding(4, 2, initializer=np.zeros((4, 3), np.float32))
    with strategy.scope():
        layer = TFDistributedEmbedding(4, 2, initializer="zeros")
        with pytest.raises(RuntimeError, match="cannot be called in cross_replica_context"):
            layer(tf.constant([1]))
    with pytest.raises(ValueError, match="keys must be int32 or int64, got float32"):
        strategy.run(lambda: layer(tf.constant([1.0])))
    with pytest.raises(tf.errors.InvalidArgumentError):
        strategy.run(lambda: layer(tf.constant([4], tf.int64)))


def test_tf_distributed_embedding_two_workers(tmp_path):
    import tfde_job as J
    seed = fresh_seed()
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "240",
           os.path.join(HERE, "tfde_job.py"), str(tmp_path), str(seed)]
    p = subprocess.run(cmd, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True, text=True,
                       timeout=270)
    assert p.returncode == 0, f"{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    r = [dict(np.load(tmp_path / f"tfde_rank{i}.npz")) for i in range(2)]
    table, _ = J.data(seed, 0)
    grad = np.zeros_like(table)
    for i in range(2):
        np.testing.assert_array_equal(r[i]["keys"], J.data(seed, i)[1])
        np.testing.assert_array_equal(r[i]["out"], table[r[i]["keys"]])        # each worker its own keys
        k = r[i]["keys"].reshape(-1)
        np.add.at(grad, k, 2 * table[k])
    want = table - J.LR * grad                              # both workers' gradients, summed
    for i in range(2):
        np.testing.assert_allclose(r[i]["trained"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(r[1]["changed"], np.full((J.VOCAB, J.DIM), 7.0, np.float32))
    np.testing.assert_array_equal(r[0]["changed"], r[0]["trained"])
    for i in range(2):                                      # worker 0's table on both after broadcast_variables
        np.testing.assert_array_equal(r[i]["after"], r[0]["trained"])
