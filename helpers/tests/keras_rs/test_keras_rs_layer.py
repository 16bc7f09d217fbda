"""embedlab.keras_rs.DistributedEmbedding against NumPy and against Keras-RS's own layer."""
from __future__ import annotations

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

keras_rs = pytest.importorskip("keras_rs", reason="keras-rs is not installed (pinned in requirements.txt)")
from keras_rs.src.layers.embedding.tensorflow.distributed_embedding import \
    DistributedEmbedding as KerasRsDistributedEmbedding  # noqa: E402

from embedlab.keras_rs import DistributedEmbedding  # noqa: E402
from embedlab.keras_rs.optimizers import to_embedlab  # noqa: E402

TC, FC = keras_rs.layers.TableConfig, keras_rs.layers.FeatureConfig
B, V = 12, 30


def _ragged(rng, rows=B, max_len=5, vocab=V, empty=True):
    lens = rng.integers(0 if empty else 1, max_len + 1, rows)
    lens[0] = 0 if empty else 1
    vals = rng.integers(0, vocab, int(lens.sum()))
    vals[: min(2, len(vals))] = 3                        # a duplicate key
    return tf.RaggedTensor.from_row_lengths(vals.astype(np.int64), lens)


def _np_pool(table, rows, weights, combiner):
    out = np.zeros((len(rows), table.shape[1]), np.float64)
    for i, (r, w) in enumerate(zip(rows, weights)):
        if len(r) == 0:
            continue
        w = np.asarray(w, np.float64)
        s = (table[np.asarray(r)] * w[:, None]).sum(0)
        if combiner == "mean":
            s = s / w.sum() if w.sum() != 0 else s * 0
        elif combiner == "sqrtn":
            n = math.sqrt((w * w).sum())
            s = s / n if n else s * 0
        out[i] = s
    return out


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("kind", ["dense", "ragged", "sparse"])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_numpy(rng, combiner, kind, weighted):
    t1 = TC("t1", V, 4, combiner=combiner, optimizer="sgd")
    t2 = TC("t2", V + 5, 3, combiner=combiner, optimizer="adagrad")
    fcs = {"g": {"a": FC("a", t1, (B, 6), (B, 4)), "b": FC("b", t1, (B, 6), (B, 4))},
           "c": FC("c", t2, (B, 6), (B, 3))}
    layer = DistributedEmbedding(fcs)
    rows, wts, inputs, weights = {}, {}, {}, {}
    for path, vocab in (("a", V), ("b", V), ("c", V + 5)):
        r = _ragged(rng, vocab=vocab, empty=kind != "dense")
        if kind == "dense":
            r = tf.RaggedTensor.from_row_lengths(rng.integers(0, vocab, B * 4), [4] * B)
        w = r.with_values(rng.uniform(0.1, 2.0, r.values.shape[0]).astype(np.float32))
        rows[path] = [list(x) for x in r.numpy()]
        wts[path] = [list(x) for x in w.numpy()] if weighted else [[1.0] * len(x) for x in rows[path]]
        if kind == "dense":
            x, wx = r.to_tensor(), w.to_tensor()
        elif kind == "sparse":
            x, wx = r.to_sparse(), w.to_sparse()
        else:
            x, wx = r, w
        inputs[path], weights[path] = x, wx
    nest = lambda d: {"g": {"a": d["a"], "b": d["b"]}, "c": d["c"]}  # noqa: E731
    out = layer(nest(inputs), nest(weights) if weighted else None)
    tables = {k: v.numpy() for k, v in layer.get_embedding_tables().items()}
    for path, got, tname in (("a", out["g"]["a"], "t1"), ("b", out["g"]["b"], "t1"), ("c", out["c"], "t2")):
        want = _np_pool(tables[tname], rows[path], wts[path], combiner)
        np.testing.assert_allclose(got.numpy(), want, rtol=2e-5, atol=2e-6, err_msg=f"{path} {combiner} {kind}")
    # preprocess() gives the same result
    pre = layer.preprocess(nest(inputs), nest(weights) if weighted else None)
    again = layer(pre)
    np.testing.assert_array_equal(again["c"].numpy(), out["c"].numpy())


def test_truncation_of_ragged_and_sparse_rows(rng):
    t = TC("t", V, 4, combiner="sum", optimizer="sgd")
    layer = DistributedEmbedding({"r": FC("r", t, (B, 2), (B, 4)), "s": FC("s", t, (B, 2), (B, 4))})
    r = _ragged(rng, max_len=6)
    out = layer({"r": r, "s": r.to_sparse()})
    table = layer.get_embedding_tables()["t"].numpy()
    want = _np_pool(table, [list(x)[:2] for x in r.numpy()], [[1.0] * min(2, len(x)) for x in r.numpy()], "sum")
    np.testing.assert_allclose(out["r"].numpy(), want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["s"].numpy(), want, rtol=1e-5, atol=1e-6)


def _pair(optimizer, combiner="mean"):
    """(ours, Keras-RS's) with the same tables, features sharing one table."""
    def configs(opt):
        t1 = TC("t1", V, 4, combiner=combiner, optimizer=opt, initializer="uniform")
        t2 = TC("t2", V, 8, combiner=combiner, optimizer=opt, initializer="uniform")
        return {"a": FC("a", t1, (B, 5), (B, 4)), "b": FC("b", t1, (B, 5), (B, 4)), "c": FC("c", t2, (B, 5), (B, 8))}
    ours = DistributedEmbedding(configs(optimizer))
    ref = KerasRsDistributedEmbedding(configs(optimizer))
    return ours, ref


# SGD only: Keras' Adagrad / Adam square an IndexedSlices gradient entry by entry, without first
# summing a key's duplicates (a key looked up twice in a batch), so they differ from the exact
# sparse update there; the fused ones are checked against NumPy below.
@pytest.mark.parametrize("opt", ["sgd"])
def test_fused_optimizer_matches_keras_rs_with_model_optimizer(rng, opt):
    ours, ref = _pair(opt)
    batches = [{k: _ragged(rng) for k in "abc"} for _ in range(4)]
    ours(batches[0]), ref(batches[0])
    for name, table in ours.get_embedding_tables().items():
        ref._default_device_embedding_layers["a" if name == "t1" else "c"].embeddings.assign(table)
    ref_opt = {"sgd": keras.optimizers.SGD(), "adagrad": keras.optimizers.Adagrad()}[opt]

    @tf.function
    def step_ours(x):
        with tf.GradientTape() as tape:
            out = ours(x)
            loss = sum(tf.reduce_sum(tf.square(v - 0.3)) for v in out.values())
        tape.gradient(loss, ours.trainable_variables)
        return loss

    @tf.function
    def step_ref(x):
        with tf.GradientTape() as tape:
            out = ref(x)
            loss = sum(tf.reduce_sum(tf.square(v - 0.3)) for v in out.values())
        ref_opt.apply_gradients(zip(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables))
        return loss

    for x in batches:
        np.testing.assert_allclose(step_ours(x).numpy(), step_ref(x).numpy(), rtol=1e-5)
    got, want = ours.get_embedding_tables(), ref.get_embedding_tables()
    for name in got:
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)


def _np_lazy_adam(w, m, v, g, step, lr=0.001, b1=0.9, b2=0.999, eps=1e-7):
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    alpha = lr * math.sqrt(1 - b2 ** step) / (1 - b1 ** step)
    return w - alpha * m / (np.sqrt(v) + eps), m, v


def _np_ftrl(w, n, z, g, lr, power=-0.5, l1=0.0, l2=0.0, beta=0.0):
    n2 = n + g * g
    z = z + g - (n2 ** -power - n ** -power) / lr * w
    w = np.where(np.abs(z) <= l1, 0.0, (np.sign(z) * l1 - z) / (n2 ** -power / lr + 2 * (l2 + beta / (2 * lr))))
    return w, n2, z


@pytest.mark.parametrize("opt", ["adagrad", "adam", "ftrl"])
def test_adagrad_adam_and_ftrl_match_numpy(rng, opt):
    keras_opt = {"adam": keras.optimizers.Adam(learning_rate=0.01),
                 "adagrad": keras.optimizers.Adagrad(learning_rate=0.1),
                 "ftrl": keras.optimizers.Ftrl(learning_rate=0.1, l1_regularization_strength=0.001)}[opt]
    t = TC("t", V, 4, combiner="sum", optimizer=keras_opt, initializer="uniform")
    layer = DistributedEmbedding({"a": FC("a", t, (B, 5), (B, 4))})
    x = {"a": _ragged(rng)}
    layer(x)
    w = layer.get_embedding_tables()["t"].numpy().astype(np.float64)
    s1 = np.zeros_like(w) + (0.1 if opt in ("ftrl", "adagrad") else 0.0)
    s2 = np.zeros_like(w)
    for step in (1, 2):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(layer(x)["a"] - 0.3))
        tape.gradient(loss, layer.trainable_variables)
        # the gradient of each row: sum over the rows that looked it up of 2 (out - 0.3)
        out = _np_pool(w, [list(r) for r in x["a"].numpy()], [[1.0] * len(r) for r in x["a"].numpy()], "sum")
        g = np.zeros_like(w)
        for i, r in enumerate(x["a"].numpy()):
            for k in r:
                g[k] += 2 * (out[i] - 0.3)
        touched = np.unique(x["a"].values.numpy())
        if opt == "adagrad":
            s1[touched] += g[touched] ** 2
            nw = w[touched] - 0.1 * g[touched] / np.sqrt(s1[touched] + 1e-7)
        elif opt == "adam":
            nw, s1[touched], s2[touched] = _np_lazy_adam(w[touched], s1[touched], s2[touched], g[touched], step,
                                                        lr=0.01)
        else:
            nw, s1[touched], s2[touched] = _np_ftrl(w[touched], s1[touched], s2[touched], g[touched], 0.1, l1=0.001)
        w[touched] = nw
        np.testing.assert_allclose(layer.get_embedding_tables()["t"].numpy(), w, rtol=2e-4, atol=2e-6)


def test_model_fit_trains_tables_and_dense_layers(rng):
    t = TC("t", V, 4, combiner="mean", optimizer=keras.optimizers.Adagrad(learning_rate=0.5))
    emb = DistributedEmbedding({"a": FC("a", t, (None, 3), (None, 4))})
    inp = {"a": keras.Input((3,), dtype="int32")}
    dense = keras.layers.Dense(1)
    model = keras.Model(inp, dense(emb(inp)["a"]))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = {"a": rng.integers(0, V, (64, 3)).astype(np.int32)}
    before_t, before_d = emb.get_embedding_tables()["t"].numpy().copy(), dense.kernel.numpy().copy()
    model.fit(x, rng.normal(size=(64, 1)).astype(np.float32), epochs=1, batch_size=16, verbose=0)
    assert not np.allclose(emb.get_embedding_tables()["t"].numpy(), before_t)
    assert not np.allclose(dense.kernel.numpy(), before_d)
    assert [v.name for v in emb.trainable_variables] == ["bp_trigger"]
    assert emb.table_optimizers["t"].iterations.numpy() == 4


def test_save_load_round_trip_and_hps_export(rng, tmp_path):
    from embedlab.sparse_model import read_sparse_model

    t = TC("t", V, 4, combiner="sum", optimizer="adam")
    emb = DistributedEmbedding({"a": FC("a", t, (None, 2), (None, 4))})
    inp = {"a": keras.Input((2,), dtype="int32")}
    model = keras.Model(inp, emb(inp))
    x = {"a": rng.integers(0, V, (8, 2)).astype(np.int32)}
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x)["a"])
    tape.gradient(loss, model.trainable_variables)      # one fused Adam step: non-zero slots
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded(x)["a"].numpy(), model(x)["a"].numpy())
    lemb = [layer for layer in loaded.layers if isinstance(layer, DistributedEmbedding)][0]
    for a, b in zip(emb.table_optimizers["t"].variables, lemb.table_optimizers["t"].variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    folders = emb.export_hps(tmp_path / "hps")
    m = read_sparse_model(folders["t"], 4)
    keys, vectors = m.keys, m.vectors
    np.testing.assert_array_equal(vectors[np.argsort(keys)], emb.get_embedding_tables()["t"].numpy())


def test_optimizer_in_backward_false_leaves_tables_to_the_model(rng):
    t = TC("t", V, 4, combiner="sum", optimizer="adam")
    emb = DistributedEmbedding({"a": FC("a", t, (None, 2), (None, 4))}, optimizer_in_backward=False)
    x = {"a": tf.constant(rng.integers(0, V, (8, 2)))}
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(x)["a"])
    (g,) = tape.gradient(loss, emb.trainable_variables)
    assert isinstance(g, tf.IndexedSlices) and emb.trainable_variables[0].shape == (V, 4)


@pytest.mark.parametrize("bad, match", [
    (keras.optimizers.SGD(momentum=0.9), "momentum"),
    (keras.optimizers.Adam(clipnorm=1.0), "clipnorm"),
    (keras.optimizers.Adam(amsgrad=True), "amsgrad"),
    (keras.optimizers.RMSprop(), "RMSprop"),
    ("rmsprop", "unknown optimizer name"),
    (tf.tpu.experimental.embedding.FTRL(multiply_linear_by_learning_rate=True), "multiply_linear_by_learning_rate"),
    (tf.tpu.experimental.embedding.FTRL(allow_zero_accumulator=True), "allow_zero_accumulator"),
    (tf.tpu.experimental.embedding.Adam(), "sum_inside_sqrt"),
])
def test_unsupported_optimizer_options_are_rejected(bad, match):
    t = TC("tab", V, 4, optimizer=bad)
    with pytest.raises(ValueError, match=match) as e:
        DistributedEmbedding({"a": FC("a", t, (None, 1), (None, 4))})
    assert "tab" in str(e.value)


def test_tpu_configs_and_schedules_are_accepted(rng):
    sched = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    assert to_embedlab(keras.optimizers.SGD(learning_rate=sched)).learning_rate is not None
    tt = tf.tpu.experimental.embedding.TableConfig(V, 4, optimizer=tf.tpu.experimental.embedding.SGD(0.1),
                                                   combiner="sum", name="tt")
    fc = {"x": tf.tpu.experimental.embedding.FeatureConfig(tt, name="x"),
          "y": tf.tpu.experimental.embedding.FeatureConfig(tt, name="y")}
    emb = DistributedEmbedding(fc, table_stacking=[["tt"]])
    out = emb({"x": tf.constant([[1, 2]]), "y": tf.constant([[3, 3]])})
    table = emb.get_embedding_tables()["tt"].numpy()
    np.testing.assert_allclose(out["y"].numpy()[0], 2 * table[3], rtol=1e-6)
    with pytest.raises(ValueError, match="table_stacking"):
        DistributedEmbedding(fc, table_stacking=[["nope"]])


def test_row_sharding_on_one_worker_is_the_unsharded_layer(rng, tmp_path):
    # In one process (no TF_CONFIG) embedlab.sok has one worker: the shards are the whole tables,
    # and a training step gives the unsharded layer's outputs and tables. The 2-worker run is
    # test_keras_rs_multiworker.py.
    init = rng.normal(size=(V, 4)).astype(np.float32)

    def make(sharding):
        t = TC("t", V, 4, initializer=keras.initializers.Constant(init), optimizer="adagrad", combiner="mean")
        return DistributedEmbedding({"a": FC("a", t, (B, None), (B, 4)), "b": FC("b", t, (B, None), (B, 4))},
                                    sharding=sharding)

    inputs = {"a": _ragged(rng), "b": _ragged(rng)}
    dy = rng.normal(size=(B, 4)).astype(np.float32)
    res = {}
    for sharding in (None, "row"):
        layer = make(sharding)
        layer.build({"a": (B, None), "b": (B, None)})
        with tf.GradientTape() as tape:
            out = layer(inputs)
            loss = tf.reduce_sum((out["a"] + 2 * out["b"]) * dy)
        tape.gradient(loss, layer.trainable_variables)
        res[sharding] = (out, {k: np.asarray(v) for k, v in layer.get_embedding_tables().items()}, layer)
    for k in ("a", "b"):
        np.testing.assert_array_equal(res["row"][0][k].numpy(), res[None][0][k].numpy())
    np.testing.assert_array_equal(res["row"][1]["t"], res[None][1]["t"])
    assert np.abs(res["row"][1]["t"] - init).max() > 1e-4
    sharded = res["row"][2]
    assert list(sharded.shards) == ["t"] and sharded.shards["t"].shape.as_list() == [V, 4]
    assert sharded.get_config()["sharding"] == "row"
    with pytest.raises(ValueError, match="row-sharded layer is not saved in .keras"):
        sharded.save_own_variables({})
    with pytest.raises(ValueError, match="shards exist with sharding='row' only"):
        res[None][2].shards


def test_row_sharding_arguments_are_checked():
    t = TC("t", V, 4, optimizer=None)
    with pytest.raises(ValueError, match="sharding must be None or 'row', got 'column'"):
        DistributedEmbedding({"a": FC("a", t, (B, 1), (B, 4))}, sharding="column")
    with pytest.raises(ValueError, match=r"needs a fused optimizer on every table .*tables \['t'\] have none"):
        DistributedEmbedding({"a": FC("a", t, (B, 1), (B, 4))}, sharding="row")
