"""embedlab.models: DeepFM with plugin vs native embeddings, Criteo input helpers."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from embedlab import optimizers as eopt  # noqa: E402
from embedlab import plugin  # noqa: E402
from embedlab.models import DeepFM, NativeSlotEmbedding, criteo_inputs, load_criteo_parquet  # noqa: E402


@pytest.fixture(autouse=True)
def _one_device():
    plugin.init(["/CPU:0"], seed=0)


def _batch(rng, n, slots, nnz, vocab, pad=0.3):
    sparse = rng.integers(0, vocab, (n, slots, nnz)).astype(np.int64)
    sparse[rng.random(sparse.shape) < pad] = -1
    dense = rng.random((n, 13)).astype(np.float32)
    return {"dense": dense, "sparse": sparse}


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_plugin_and_native_agree_at_init(rng, combiner):
    V, S, M = 300, 6, 3
    x = _batch(rng, 32, S, M, V)
    a = DeepFM(V, slot_num=S, deep_layers=(16, 8), embedding="plugin", combiner=combiner, max_nnz=M, seed=4)
    b = DeepFM(V, slot_num=S, deep_layers=(16, 8), embedding="native", combiner=combiner, max_nnz=M, seed=4)
    pa, pb = a(x).numpy(), b(x).numpy()
    assert pa.shape == (32, 1) and ((pa > 0) & (pa < 1)).all()
    np.testing.assert_allclose(pa, pb, rtol=1e-5, atol=1e-6)
    ea = a.embedding(tf.constant(x["sparse"])).numpy()
    eb = b.embedding(tf.constant(x["sparse"])).numpy()
    np.testing.assert_allclose(ea, eb, rtol=1e-6, atol=1e-7)
    assert not ea[(x["sparse"] < 0).all(axis=2)].any()            # all-padding slots are zeros


def _learnable(rng, n, V, S):
    x = _batch(rng, n, S, 1, V, pad=0.05)
    # Click iff the slot-0 key is "good" (a fixed half of the keys) -- learnable from embeddings.
    good = rng.random(V) < 0.5
    k0 = x["sparse"][:, 0, 0]
    y = np.where(k0 >= 0, good[np.maximum(k0, 0)], False).astype(np.float32)
    return x, y


@pytest.mark.parametrize("kind,own", [("plugin", False), ("plugin", True), ("native", False)])
def test_deepfm_learns(rng, kind, own):
    V, S, n = 64, 4, 2048
    x, y = _learnable(rng, n, V, S)
    m = DeepFM(V, slot_num=S, embedding_vec_size=4, deep_layers=(16,), embedding=kind,
               embedding_optimizer=eopt.Adam(0.05) if own else None)
    opt = keras.optimizers.Adam(0.02) if kind == "native" else eopt.Adam(0.02)
    m.compile(opt, "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    h = m.fit(x, y, batch_size=128, epochs=6, verbose=0)
    assert h.history["loss"][-1] < 0.7 * h.history["loss"][0]
    assert h.history["auc"][-1] > 0.9


def test_criteo_helpers_on_generated_data(tmp_path):
    from embedlab.data import criteo
    src = criteo.generate(tmp_path / "day.txt", rows=3000, seed=2, progress=False)
    res = criteo.preprocess(src, tmp_path / "pq", split=(8, 1, 1), progress=False, feature_cross=False)
    x, y, sizes = load_criteo_parquet(tmp_path / "pq", "train")
    assert x["dense"].shape == (res.rows["train"], 13) and x["dense"].dtype == np.float32
    assert x["sparse"].shape == (res.rows["train"], 26, 1) and x["sparse"].dtype == np.int64
    assert set(np.unique(y)) <= {0.0, 1.0} and sizes == res.slot_size_array
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # Each slot's ids lie in its own range (global ids), so one table serves all slots.
    assert ((x["sparse"][:, :, 0] >= offs) & (x["sparse"][:, :, 0] < offs + np.array(sizes))).all()
    m = DeepFM(sum(sizes), slot_num=26, deep_layers=(8,), embedding="plugin", slot_size_array=sizes,
               embedding_type="localized")
    assert m(x).shape == (len(y), 1)
    with pytest.raises(ValueError, match="C1"):
        import pandas as pd
        criteo_inputs(pd.DataFrame({"label": [1.0]}))


def test_native_embedding_masks_padding():
    emb = NativeSlotEmbedding(5, 2, combiner="mean")
    ids = tf.constant([[[1, -1, -1], [-1, -1, -1]]], tf.int64)
    out = emb(ids).numpy()
    table = emb.embedding.embeddings.numpy()
    np.testing.assert_allclose(out[0, 0], table[1], rtol=1e-6)
    assert not out[0, 1].any()


def test_bad_arguments():
    with pytest.raises(ValueError, match="embedding"):
        DeepFM(10, slot_num=2, embedding="tpu")
    with pytest.raises(ValueError, match="embedding_optimizer"):
        DeepFM(10, slot_num=2, embedding="native", embedding_optimizer=eopt.SGD(0.1))
