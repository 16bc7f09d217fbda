"""embedlab.data.ParquetLoader: coverage, shuffling, determinism, sharding, ragged, Keras, memory."""
from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

from embedlab.data import ParquetLoader, formats


def _write_dataset(root, rng, n_files=3, rows=(700, 1100), rg=(60, 250), start=0):
    """Parquet files whose every row is identifiable: rid, and columns derived from it."""
    root.mkdir(parents=True, exist_ok=True)
    rid0 = start
    for f in range(n_files):
        n = int(rng.integers(*rows))
        rid = np.arange(rid0, rid0 + n)
        rid0 += n
        lens = rid % 4
        splits = np.concatenate([[0], np.cumsum(lens)])
        vals = np.repeat(rid * 10, lens) + (np.arange(splits[-1]) - np.repeat(splits[:-1], lens))
        formats.write_parquet(root / f"part_{f}.parquet", {
            "label": (rid % 2).astype(np.float32),
            "I1": (rid * 0.5).astype(np.float32), "I2": (-rid).astype(np.float32),
            "rid": rid, "C1": rid * 7, "tags": (splits, vals)},
            row_group_rows=int(rng.integers(*rg)))
    return rid0 - start


@pytest.fixture()
def dataset(tmp_path, rng):
    n = _write_dataset(tmp_path / "ds", rng)
    return tmp_path / "ds", n


def _rids(loader):
    out = []
    for x, y in loader:
        rid = np.asarray(x["rid"])
        out.append(rid)
        # Every column of a row belongs to that row (shuffles keep rows together).
        np.testing.assert_array_equal(np.asarray(y)[:, 0], rid % 2)
        np.testing.assert_array_equal(np.asarray(x["C1"]), rid * 7)
        np.testing.assert_array_equal(np.asarray(x["dense"]),
                                      np.stack([rid * 0.5, -rid], 1).astype(np.float32))
    return out


def test_epoch_covers_every_row_once_and_shuffles(dataset):
    path, n = dataset
    ld = ParquetLoader(path, 128, buffer_rows=400, output="numpy", ragged=[])
    batches = _rids(ld)
    allr = np.concatenate(batches)
    assert sorted(allr.tolist()) == list(range(n))
    assert all(len(b) == 128 for b in batches[:-1]) and len(batches) == len(ld) == -(-n // 128)
    assert not np.array_equal(allr, np.arange(n))
    # Rows from different files/row groups share batches (buffer spans several row groups).
    assert np.ptp(batches[0]) > 300
    # The next epoch is shuffled differently.
    again = np.concatenate(_rids(ld))
    assert sorted(again.tolist()) == list(range(n)) and not np.array_equal(again, allr)


def test_no_shuffle_keeps_file_order_and_drop_remainder(dataset):
    path, n = dataset
    ld = ParquetLoader(path, 100, shuffle=False, output="numpy", drop_remainder=True)
    allr = np.concatenate(_rids(ld))
    np.testing.assert_array_equal(allr, np.arange(n // 100 * 100))
    assert len(ld) == n // 100 and not ld.has_partial_batch


def test_deterministic_for_a_seed(dataset, run_seed):
    path, _ = dataset
    a = [np.concatenate(_rids(ParquetLoader(path, 64, seed=run_seed, output="numpy",
                                            buffer_rows=300))) for _ in range(2)]
    np.testing.assert_array_equal(a[0], a[1])
    ld = ParquetLoader(path, 64, seed=run_seed, output="numpy", buffer_rows=300)
    e0, e1 = np.concatenate(_rids(ld)), np.concatenate(_rids(ld))
    np.testing.assert_array_equal(e0, a[0])
    ld2 = ParquetLoader(path, 64, seed=run_seed, output="numpy", buffer_rows=300)
    np.concatenate(_rids(ld2))
    np.testing.assert_array_equal(np.concatenate(_rids(ld2)), e1)     # epoch 1 reproducible
    other = np.concatenate(_rids(ParquetLoader(path, 64, seed=run_seed + 1, output="numpy",
                                               buffer_rows=300)))
    assert not np.array_equal(other, a[0])
    assert ParquetLoader(path, 64).seed != ParquetLoader(path, 64).seed   # None draws a seed


def test_sharding_is_disjoint_and_complete(dataset):
    import tensorflow as tf
    path, n = dataset
    for k in (2, 3):
        seen = [np.concatenate(_rids(ParquetLoader(path, 50, num_shards=k, shard_index=i,
                                                   seed=i, output="numpy")))
                for i in range(k)]
        allr = np.concatenate(seen)
        assert len(allr) == n and len(np.unique(allr)) == n
    ctx = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    ld = ParquetLoader(path, 50, input_context=ctx, shuffle=False)
    assert (ld.num_shards, ld.shard_index) == (2, 1)
    first = ParquetLoader(path, 50, num_shards=2, shard_index=1, shuffle=False)
    assert ld.num_rows == first.num_rows < n
    with pytest.raises(ValueError, match="shard_index 2"):
        ParquetLoader(path, 50, num_shards=2, shard_index=2)


def test_tensors_and_ragged(dataset):
    import tensorflow as tf
    path, _ = dataset
    ld = ParquetLoader(path, 96, seed=3, buffer_rows=500)
    x, y = next(iter(ld))
    assert y.shape == (96, 1) and y.dtype == tf.float32
    assert x["dense"].shape == (96, 2) and x["rid"].dtype == tf.int64
    tags = x["tags"]
    assert isinstance(tags, tf.RaggedTensor)
    rid = x["rid"].numpy()
    for r, row in zip(rid, tags.to_list()):
        assert row == [r * 10 + k for k in range(r % 4)]
    spec = ld.element_spec
    assert spec[0]["tags"].is_compatible_with(tags)
    stacked = ParquetLoader(path, 96, seed=3, sparse_key="ids", dense_key=None)
    xs, _ = next(iter(stacked))
    assert xs["ids"].shape == (96, 2) and xs["I1"].shape == (96,)
    np.testing.assert_array_equal(xs["ids"].numpy()[:, 1], xs["ids"].numpy()[:, 0] * 7)
    # tf.data can wrap it, and every iteration of the dataset is a full epoch.
    ds = ld.to_tf_dataset().map(lambda f, l: (f["rid"], l))
    assert sum(int(l.shape[0]) for _, l in ds) == ld.num_rows
    assert sum(1 for _ in ds) == len(ld)


def test_keras_fit_and_evaluate_take_the_loader_directly(dataset):
    import keras
    path, _ = dataset
    train = ParquetLoader(path, 128, seed=0, ragged=[], sparse=["C1"])
    inputs = {"dense": keras.Input((2,), name="dense"),
              "C1": keras.Input((), dtype="int64", name="C1")}
    emb = keras.layers.Embedding(20_000, 4)(keras.ops.mod(inputs["C1"], 20_000))
    h = keras.layers.Concatenate()([keras.layers.Normalization()(inputs["dense"]), emb])
    model = keras.Model(inputs, keras.layers.Dense(1, activation="sigmoid", name="ctr")(h))
    model.compile("adam", "binary_crossentropy", metrics=[keras.metrics.AUC(name="auc")])
    hist = model.fit(train, epochs=2, verbose=0)
    assert len(hist.history["loss"]) == 2 and np.isfinite(hist.history["loss"]).all()
    res = model.evaluate(ParquetLoader(path, 256, shuffle=False, ragged=[], sparse=["C1"]),
                         verbose=0, return_dict=True)
    assert 0.0 <= res["auc"] <= 1.0


def test_errors_are_clear(dataset, tmp_path):
    path, _ = dataset
    with pytest.raises(ValueError, match="batch_size"):
        ParquetLoader(path, 0)
    with pytest.raises(ValueError, match=r"columns \['nope'\]"):
        ParquetLoader(path, 8, sparse=["nope"])
    with pytest.raises(FileNotFoundError):
        ParquetLoader(tmp_path / "nothing", 8)
    with pytest.raises(ValueError, match="label column"):
        ParquetLoader(path, 8, label="y")
    # A file that disappears mid-epoch surfaces in the consumer, naming the file.
    ld = ParquetLoader(path, 8, shuffle=False, output="numpy", buffer_rows=8, prefetch=1)
    it = iter(ld)
    next(it)
    (path / "part_2.parquet").write_bytes(b"garbage")
    with pytest.raises(formats.FormatError, match="part_2.parquet row group 0"):
        for _ in it:
            pass


def test_breaking_out_stops_the_prefetch_thread(dataset):
    path, _ = dataset
    before = threading.active_count()
    ld = ParquetLoader(path, 16, prefetch=1, output="numpy")
    for k, _ in enumerate(ld):
        if k == 2:
            break
    assert threading.active_count() == before


def test_memory_is_bounded_by_the_buffer_not_the_dataset(tmp_path, rng):
    """Peak NumPy memory of an epoch stays flat when the dataset grows 6x."""
    def peak(n_files):
        root = tmp_path / f"m{n_files}"
        _write_dataset(root, rng, n_files=n_files, rows=(4000, 4001), rg=(1000, 1001))
        ld = ParquetLoader(root, 500, buffer_rows=2000, output="numpy", prefetch=2, seed=1)
        tracemalloc.start()
        rows = sum(len(y) for _, y in ld)
        _, p = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return rows, p

    rows1, p1 = peak(2)
    rows6, p6 = peak(12)
    assert rows6 == 6 * rows1
    # Bytes per row held by the loader: label + 2 dense (f32), rid + C1 (i64), tags (<= 3 i64
    # values + a split). The documented bound: 2 x (buffer + row group) + 2 row groups +
    # (prefetch + 2) batches.
    per_row = 4 + 8 + 16 + 8 + 8 * 3
    bound = (2 * (2000 + 1000) + 2 * 1000 + 4 * 500) * per_row
    print("peak bytes", p1, p6, "bound", bound)
    assert p6 < 1.5 * p1 + 20_000
    assert p6 < bound
