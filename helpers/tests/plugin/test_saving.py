"""Models using the plugin layer: `.keras` save and load in a FRESH process, and `model.export`
(a SavedModel for serving) reloaded in a fresh process, with the layer's own optimizer in use.

Each case trains a few steps here, saves, and writes the inputs and this process's predictions;
one child Python process (nothing of this one's state: registrations, devices, traced
functions) loads every artifact and compares its predictions bit for bit. The child splits its
CPU into 2 logical devices, so the plugin tables load into another device count than they were
saved from (the .keras file holds them in key order).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from embedlab import optimizers as eopt  # noqa: E402
from embedlab import plugin  # noqa: E402
from embedlab.models import DeepFM  # noqa: E402

V, S, M = 400, 5, 2

_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import embedlab.plugin as plugin
    plugin.split_cpu(2)                       # another device count than the saving process
    import keras, tensorflow as tf
    import embedlab.models, embedlab.ops      # registers the Keras classes, loads the op library
    embedlab.tf_ops()
    plugin.init(["/CPU:0", "/CPU:1"], seed=7)
    cases = json.loads(sys.argv[1])
    for case in cases:
        x = dict(np.load(case["inputs"]))
        want = np.load(case["expected"])
        if case["kind"] == "keras":
            m = keras.saving.load_model(case["path"])
            got = m.predict(x, verbose=0)
            # the loaded model trains on (its own optimizer and the compiled one are restored)
            m.fit(x, np.ones((x["dense"].shape[0], 1), np.float32), batch_size=16, epochs=1, verbose=0)
            assert np.isfinite(m.predict(x, verbose=0)).all()
        else:
            serve = tf.saved_model.load(case["path"]).signatures["serve"]
            out = serve(dense=tf.constant(x["dense"]), sparse=tf.constant(x["sparse"]))
            got = list(out.values())[0].numpy()
        assert got.shape == want.shape, (case["name"], got.shape, want.shape)
        diff = float(np.abs(got - want).max())
        assert diff <= case["atol"], (case["name"], diff)
        print(case["name"], "max diff", diff)
    print("ALL OK")
""")


def _data(rng, n=64):
    sparse = rng.integers(0, V, (n, S, M)).astype(np.int64)
    sparse[rng.random(sparse.shape) < 0.3] = -1
    sparse[0] = -1                                 # an all-padding sample
    x = {"dense": rng.random((n, 13)).astype(np.float32), "sparse": sparse}
    y = (rng.random((n, 1)) < 0.3).astype(np.float32)
    return x, y


def _deepfm(kind, own_optimizer):
    plugin.init(["/CPU:0"], seed=3)
    m = DeepFM(V, slot_num=S, deep_layers=(16, 8), embedding=kind, max_nnz=M, seed=5,
               embedding_optimizer=eopt.Adam(0.01) if own_optimizer else None)
    m.compile(eopt.Adam(0.01), "binary_crossentropy")
    return m


def _functional_with_plugin_layer():
    plugin.init(["/CPU:0"], seed=3)
    keys = keras.Input((S, M), dtype="int64", name="sparse")
    dense = keras.Input((13,), name="dense")
    emb = plugin.EmbeddingLayer(V, 4, S, M, combiner="mean", optimizer=eopt.Adagrad(0.05), name="emb")(keys)
    h = keras.layers.Concatenate()([keras.layers.Flatten()(emb), dense])
    out = keras.layers.Dense(1, activation="sigmoid", name="click")(h)
    m = keras.Model({"dense": dense, "sparse": keys}, out)
    m.compile(keras.optimizers.SGD(0.1), "binary_crossentropy")
    return m


def test_plugin_models_save_load_and_export_in_a_fresh_process(rng, tmp_path):
    x, y = _data(rng)
    cases = []
    models = {
        "deepfm_plugin_own_adam": _deepfm("plugin", True),
        "deepfm_plugin_model_optimizer": _deepfm("plugin", False),
        "deepfm_native": _deepfm("native", False),
        "functional_plugin_own_adagrad": _functional_with_plugin_layer(),
    }
    for name, m in models.items():
        before = m.predict(x, verbose=0)
        m.fit(x, y, batch_size=16, epochs=1, verbose=0)
        want = m.predict(x, verbose=0)
        assert np.abs(want - before).max() > 0, f"{name}: training did not change the model"
        np.savez(tmp_path / f"{name}_x.npz", **x)
        np.save(tmp_path / f"{name}_want.npy", want)
        path = tmp_path / f"{name}.keras"
        m.save(path)
        common = {"inputs": str(tmp_path / f"{name}_x.npz"), "expected": str(tmp_path / f"{name}_want.npy")}
        cases.append({"name": f"{name}.keras", "kind": "keras", "path": str(path), "atol": 0.0, **common})
        if "own" not in name:        # export: the cases where the layer applies its own optimizer
            continue
        export_dir = tmp_path / f"{name}_savedmodel"
        m.export(str(export_dir), verbose=False)
        # The same ops in another graph: equal up to float32 rounding of differently fused ops.
        cases.append({"name": f"{name} export", "kind": "export", "path": str(export_dir),
                      "atol": 1e-6, **common})
    r = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "ALL OK" in r.stdout, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr[-4000:]}"
    print(r.stdout)


def test_embedding_layer_config_round_trip():
    plugin.init(["/CPU:0"], seed=1)
    layer = plugin.EmbeddingLayer(50, 3, 2, 2, combiner="mean", embedding_type="localized",
                                  optimizer=eopt.Adam(0.02, beta_1=0.8), initializer=0.25,
                                  slot_size_array=[20, 30], seed=9, name="e")
    cfg = layer.get_config()
    json.dumps(cfg)                                   # plain JSON
    clone = plugin.EmbeddingLayer.from_config(cfg)
    assert isinstance(clone.optimizer, eopt.Adam)
    assert clone.optimizer.beta_1 == pytest.approx(0.8) and float(clone.optimizer.learning_rate) == pytest.approx(0.02)
    for key in ("vocabulary_size", "embedding_vec_size", "slot_num", "max_nnz", "combiner",
                "embedding_type", "slot_size_array", "seed"):
        assert getattr(clone, key) == getattr(layer, key), key
    np.testing.assert_array_equal(clone.get_table(), layer.get_table())
    assert keras.saving.get_registered_object("embedlab>EmbeddingLayer") is plugin.EmbeddingLayer
    assert keras.saving.get_registered_object("embedlab>DeepFM") is DeepFM


def test_load_refuses_weights_without_a_table(tmp_path):
    plugin.init(["/CPU:0"], seed=1)
    layer = plugin.EmbeddingLayer(10, 2, 1, 1)
    before = layer.get_table()
    with pytest.raises(ValueError, match="hold no 'table'"):
        layer.load_own_variables({"0": np.zeros((10, 2), np.float32)})
    np.testing.assert_array_equal(layer.get_table(), before)
