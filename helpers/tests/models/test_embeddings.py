"""embedlab.models.FusedEmbedding: many tables in one EmbedLab op, against tf.gather oracles."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from embedlab import optimizers as eopt  # noqa: E402
from embedlab.models import FusedEmbedding  # noqa: E402


def _oracle(table, ids, combiner):
    ids = np.asarray(ids)
    if ids.ndim == 1:
        ids = ids[:, None]
    out = np.zeros((ids.shape[0], table.shape[1]), np.float64)
    for r, row in enumerate(ids):
        keys = row[row >= 0]
        if keys.size:
            out[r] = table[keys].astype(np.float64).sum(0) / (keys.size if combiner == "mean" else 1)
    return out


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_forward_and_gradient_match_oracles(rng, combiner):
    sizes, dims = [int(rng.integers(1, 50)), 300, 7], [3, 8, 1]
    emb = FusedEmbedding(sizes, dims, combiner=combiner, seed=int(rng.integers(1000)))
    ids = [rng.integers(0, sizes[0], 40),                                   # one key per row
           np.where(rng.random((40, 4)) < 0.3, -1, rng.integers(0, sizes[1], (40, 4))),   # -1 padded, duplicates
           np.full((40, 2), -1)]                                             # every row empty
    ids[1][3] = ids[1][3, 0]                                                 # a row of one repeated key
    tensors = [tf.constant(i, tf.int64) for i in ids]
    with tf.GradientTape() as tape:
        outs = emb(tensors)
        loss = tf.add_n([tf.reduce_sum(o * (j + 1.0)) for j, o in enumerate(outs)])
    grads = tape.gradient(loss, emb.tables)
    for j, (t, i, o) in enumerate(zip(emb.tables, ids, outs)):
        assert o.shape == (40, dims[j])
        np.testing.assert_allclose(o.numpy(), _oracle(t.numpy(), i, combiner), rtol=1e-5, atol=1e-6)
        # oracle gradient: d loss / d row k = (j + 1) * sum over the rows' keys (1 / n for mean)
        want = np.zeros(t.shape, np.float64)
        rows = np.asarray(i) if np.ndim(i) == 2 else np.asarray(i)[:, None]
        for row in rows:
            keys = row[row >= 0]
            for k in keys:
                want[k] += (j + 1.0) / (keys.size if combiner == "mean" else 1)
        got = tf.convert_to_tensor(grads[j]).numpy() if grads[j] is not None else np.zeros(t.shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_bad_arguments_name_the_layer():
    with pytest.raises(ValueError, match="one dim per table"):
        FusedEmbedding([10, 20], [3], name="e")
    with pytest.raises(ValueError, match="combiner"):
        FusedEmbedding([10], 3, combiner="max")
    emb = FusedEmbedding([10, 20], 4, name="two")
    with pytest.raises(ValueError, match="'two': got 1 ids tensors for 2 tables"):
        emb([tf.constant([1], tf.int64)])


def test_trains_in_model_fit_and_round_trips_its_config(rng, tmp_path):
    sizes = [50, 80]
    a = keras.Input((), dtype="int64", name="a")
    b = keras.Input((), dtype="int64", name="b")
    e = FusedEmbedding(sizes, [4, 2], name="fused")([a, b])
    out = keras.layers.Dense(1, activation="sigmoid", name="p")(keras.layers.Concatenate()(e))
    model = keras.Model({"a": a, "b": b}, out)
    model.compile(eopt.Adam(0.05), "binary_crossentropy")
    x = {"a": rng.integers(0, 50, 256), "b": rng.integers(0, 80, 256)}
    y = (x["a"] % 2).astype(np.float32)[:, None]
    before = [t.numpy().copy() for t in model.get_layer("fused").tables]
    hist = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    after = model.get_layer("fused").tables
    assert any(not np.array_equal(b_, a_.numpy()) for b_, a_ in zip(before, after))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_large_tables_start_aligned_and_stay_so_through_fit_and_load(rng, tmp_path):
    """A table of 32 MiB and more starts 2 MiB-aligned (embedlab.tables) with the values Keras'
    RandomUniform gives, and stays so through model.fit and load_model."""
    from embedlab import tables as _tables
    sizes = [1 << 20, 50]                          # 32 MiB at dim 8, and a small table
    a = keras.Input((), dtype="int64", name="a")
    b = keras.Input((), dtype="int64", name="b")
    e = FusedEmbedding(sizes, [8, 2], seed=4, name="fused")([a, b])
    out = keras.layers.Dense(1, activation="sigmoid", name="p")(keras.layers.Concatenate()(e))
    model = keras.Model({"a": a, "b": b}, out)
    big = model.get_layer("fused").tables[0]
    assert _tables.address(big) % _tables.ALIGNMENT == 0
    want = keras.initializers.RandomUniform(-0.05, 0.05, seed=4)((1 << 20, 8), "float32")
    assert big.numpy().tobytes() == np.asarray(want).tobytes()
    model.compile(eopt.Adam(0.05), "binary_crossentropy")
    x = {"a": rng.integers(0, sizes[0], 256), "b": rng.integers(0, 50, 256)}
    model.fit(x, (x["b"] % 2).astype(np.float32)[:, None], batch_size=64, epochs=1, verbose=0)
    assert _tables.address(big) % _tables.ALIGNMENT == 0
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    lbig = loaded.get_layer("fused").tables[0]
    assert _tables.address(lbig) % _tables.ALIGNMENT == 0
    assert lbig.numpy().tobytes() == big.numpy().tobytes()
