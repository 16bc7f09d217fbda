"""embedlab.keras_rs under XLA (jit_compile=True against the custom kernels) and exported for
serving (model.export, loaded by tf.saved_model.load in a fresh process)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

keras_rs = pytest.importorskip("keras_rs", reason="keras-rs is not installed (pinned in requirements.txt)")

from embedlab.keras_rs import DistributedEmbedding, EmbedReduce  # noqa: E402
from embedlab.keras_rs import xla as _xla  # noqa: E402

TC, FC = keras_rs.layers.TableConfig, keras_rs.layers.FeatureConfig
B, V = 16, 40


def _layer(opts, combiner, seed):
    init = keras.initializers.RandomUniform(seed=seed)
    t1 = TC("t1", V, 4, combiner=combiner, optimizer=opts[0], initializer=init)
    t2 = TC("t2", V + 3, 3, combiner=combiner, optimizer=opts[1], initializer=init)
    # Two features share t1; "a" has padding (-1) and a key repeated within a row and across rows.
    return DistributedEmbedding({"a": FC("a", t1, (B, 3), (B, 4)), "b": FC("b", t1, (B, 2), (B, 4)),
                                 "c": FC("c", t2, (B, 4), (B, 3))})


def _batches(rng, n=3):
    out = []
    for _ in range(n):
        a = rng.integers(-1, V, (B, 3))
        a[0, :2] = 5
        a[1, 0] = 5
        x = {"a": tf.constant(a), "b": tf.constant(rng.integers(0, V, (B, 2))),
             "c": tf.constant(rng.integers(0, V + 3, (B, 4)))}
        w = {k: tf.constant(rng.uniform(0.1, 2.0, v.shape).astype(np.float32)) for k, v in x.items()}
        out.append((x, w))
    return out


def _train(layer, batches, jit):
    dense_opt = keras.optimizers.SGD(0.1)   # trains bp_trigger and the tables without a fused optimizer

    @tf.function(jit_compile=jit)
    def step(x, w):
        with tf.GradientTape() as tape:
            out = layer(x, w)
            loss = tf.add_n([tf.reduce_sum(tf.square(v - 0.3)) for v in out.values()])
        grads = tape.gradient(loss, layer.trainable_variables)
        dense_opt.apply_gradients(zip(grads, layer.trainable_variables))
        return loss

    losses = [float(step(x, w)) for x, w in batches]
    return losses, step


FTRL_ALL = keras.optimizers.Ftrl(0.1, learning_rate_power=-0.3, initial_accumulator_value=0.2,
                                 l1_regularization_strength=0.01, l2_regularization_strength=0.1,
                                 l2_shrinkage_regularization_strength=0.05, beta=0.5)


@pytest.mark.parametrize("opts, combiner", [
    (("sgd", "adagrad"), "sum"),
    (("adam", "ftrl"), "mean"),
    ((FTRL_ALL, None), "sqrtn"),             # t2 trained by the model's optimizer
    ((keras.optimizers.Adam(learning_rate=keras.optimizers.schedules.ExponentialDecay(0.05, 1, 0.5)),
      keras.optimizers.Adagrad(0.2, initial_accumulator_value=0.0, epsilon=1e-3)), "sum"),
])
def test_jit_compile_matches_the_kernels(rng, opts, combiner):
    batches = _batches(rng)
    runs = []
    for jit in (False, True):
        layer = _layer(opts, combiner, seed=7)
        layer(batches[0][0], batches[0][1])
        before = {k: v.numpy().copy() for k, v in layer.get_embedding_tables().items()}
        losses, step = _train(layer, batches, jit)
        state = {name: [np.asarray(v) for v in opt.variables] for name, opt in layer.table_optimizers.items()
                 if opt is not None}
        runs.append((losses, {k: v.numpy() for k, v in layer.get_embedding_tables().items()}, state, before))
    (l0, t0, s0, b0), (l1, t1, s1, _) = runs

    def close(a, b, name):
        # float32 summation order (duplicate keys' gradients are summed in another order), in ulps
        # of the array's largest value: FTRL's linear term z sums terms far larger than its result.
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=4e-6 * max(1.0, float(np.abs(b).max())), err_msg=name)

    np.testing.assert_allclose(l1, l0, rtol=2e-6)
    for name in t0:
        assert not np.allclose(t0[name], b0[name]), f"table {name} was not trained"
        close(t1[name], t0[name], name)
    for name in s0:
        for a, b in zip(s1[name], s0[name]):   # slots and the step counter
            close(a, b, f"{name} optimizer state")


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_truncated_sparse_and_ragged_ids_under_jit_match_the_kernels(rng, kind, combiner):
    def batch():
        dense = rng.integers(-1, V, (B, 6))   # -1: no entry; ids past the 4th are truncated (input_shape (B, 4))
        dense[0] = -1                          # an empty row
        idx = np.argwhere(dense >= 0)
        w = rng.uniform(0.1, 2.0, len(idx)).astype(np.float32)
        if kind == "sparse":
            return {"s": tf.SparseTensor(idx, dense[dense >= 0], [B, 6])}, {"s": tf.SparseTensor(idx, w, [B, 6])}
        lengths = (dense >= 0).sum(1)
        return ({"s": tf.RaggedTensor.from_row_lengths(dense[dense >= 0], lengths)},
                {"s": tf.RaggedTensor.from_row_lengths(w, lengths)})

    batches = [batch() for _ in range(3)]
    runs = []
    for jit in (False, True):
        t = TC("t", V, 4, combiner=combiner, optimizer="adam", initializer=keras.initializers.RandomUniform(seed=2))
        layer = DistributedEmbedding({"s": FC("s", t, (B, 4), (B, 4))})
        runs.append((_train(layer, batches, jit)[0], layer.get_embedding_tables()["t"].numpy()))
    np.testing.assert_allclose(runs[1][0], runs[0][0], rtol=2e-6)
    np.testing.assert_allclose(runs[1][1], runs[0][1], rtol=1e-5, atol=1e-6)


def test_the_xla_graph_holds_no_embedlab_op(rng):
    layer = _layer(("adam", None), "mean", seed=3)
    (x, w), = _batches(rng, 1)
    _, step = _train(layer, [(x, w)], True)
    ops = {op.type for f in [step.get_concrete_function(x, w)] for op in f.graph.get_operations()}
    for fn in step.get_concrete_function(x, w).graph._functions.values():
        ops |= {node.op for node in fn.definition.node_def}
    assert not [o for o in ops if o.startswith("EmbedLab")], sorted(ops)
    assert "ResourceScatterUpdate" in ops


def test_auto_jit_keeps_the_kernels_and_xla_is_logged_once(rng, caplog):
    from keras.src.trainers.trainer import model_supports_jit

    layer = _layer(("sgd", "sgd"), "sum", seed=1)
    inp = {k: keras.Input((n,), dtype="int64", name=k) for k, n in (("a", 3), ("b", 2), ("c", 4))}
    model = keras.Model(inp, layer(inp))
    assert layer.supports_jit is False and not model_supports_jit(model)
    _xla._logged.clear()
    with caplog.at_level(logging.INFO, logger="embedlab.keras_rs"):
        _train(layer, _batches(rng, 2), True)
    assert [r.getMessage() for r in caplog.records].count(caplog.records[0].getMessage()) == 1
    assert "runs as XLA-compilable TensorFlow ops" in caplog.records[0].getMessage()


def test_embed_reduce_under_jit_matches_eager(rng):
    layer = EmbedReduce(V, 5, combiner="mean", embeddings_initializer="uniform")
    ids = tf.constant(rng.integers(0, V, (B, 3)))
    weights = tf.constant(rng.uniform(0.1, 2.0, (B, 3)).astype(np.float32))
    want = layer(ids, weights).numpy()

    @tf.function(jit_compile=True)
    def f(i, w):
        with tf.GradientTape() as tape:
            out = layer(i, w)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, layer.embeddings)

    got, grad = f(ids, weights)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(ids, weights)))
    want_grad = tf.convert_to_tensor(tape.gradient(loss, layer.embeddings))
    np.testing.assert_allclose(tf.convert_to_tensor(grad).numpy(), want_grad.numpy(), rtol=1e-5, atol=1e-7)


def test_model_export_serves_the_same_outputs_in_a_fresh_process(rng, tmp_path):
    t = TC("t", V, 4, combiner="mean", optimizer="adagrad")
    u = TC("u", V, 3, combiner="sum", optimizer=None)
    emb = DistributedEmbedding({"a": FC("a", t, (None, 3), (None, 4)), "b": FC("b", u, (None, 2), (None, 3))})
    inp = {"a": keras.Input((3,), dtype="int32", name="a"), "b": keras.Input((2,), dtype="int32", name="b")}
    out = emb(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Concatenate()([out["a"], out["b"]])))
    x = {"a": rng.integers(0, V, (8, 3)).astype(np.int32), "b": rng.integers(0, V, (8, 2)).astype(np.int32)}
    with tf.GradientTape() as tape:   # one fused Adagrad step first: the served tables are the trained ones
        loss = tf.reduce_sum(model(x))
    tape.gradient(loss, model.trainable_variables)
    want = model(x).numpy()
    model.export(str(tmp_path / "sm"))
    for k, v in x.items():
        np.save(tmp_path / f"{k}.npy", v)
    np.save(tmp_path / "want.npy", want)
    child = textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        path = {str(tmp_path)!r}
        try:
            tf.saved_model.load(path + "/sm")
            raise SystemExit("loaded without EmbedLab's op library")
        except (RuntimeError, tf.errors.NotFoundError) as e:
            assert "EmbedLab" in str(e), e
        import embedlab
        embedlab.tf_ops()   # registers EmbedLab's ops: needed before loading, as for any custom op
        m = tf.saved_model.load(path + "/sm")
        got = m.serve({{k: tf.constant(np.load(path + "/" + k + ".npy")) for k in ("a", "b")}})
        np.testing.assert_allclose(np.asarray(got), np.load(path + "/want.npy"), rtol=1e-6)
        print("served")
    """)
    # The child imports embedlab as this process does (the installed package, or PYTHONPATH's).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "served" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
