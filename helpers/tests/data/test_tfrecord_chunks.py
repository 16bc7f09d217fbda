"""write_tfrecord converts rows a chunk at a time (bounded memory at any row count): records
read back equal the columns across chunk boundaries, multi-hot columns included, and columns of
different lengths are refused before anything is written."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab.data import formats
from embedlab.data.formats import tfrecord


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 16])
def test_tfrecord_rows_across_chunks(tmp_path, rng, monkeypatch, chunk):
    monkeypatch.setattr(tfrecord, "_TFRECORD_CHUNK", chunk)
    n = 50
    lengths = rng.integers(0, 4, n)
    splits = np.concatenate([[0], np.cumsum(lengths)])
    cols = {"label": rng.random(n).astype(np.float32), "C1": rng.integers(0, 1 << 40, n),
            "tags": (splits, rng.integers(0, 1000, int(splits[-1])))}
    p = formats.write_tfrecord(tmp_path / "x.tfrecord", cols)
    back = formats.read_tfrecord(p, columns=[("label", "float"), ("C1", "int"), ("tags", "ragged")])
    np.testing.assert_array_equal(back["label"], cols["label"])
    np.testing.assert_array_equal(back["C1"], cols["C1"])
    np.testing.assert_array_equal(back["tags"][0], splits)
    np.testing.assert_array_equal(back["tags"][1], cols["tags"][1])


def test_tfrecord_columns_must_agree(tmp_path):
    with pytest.raises(ValueError, match="column b has 2 rows, expected 3"):
        formats.write_tfrecord(tmp_path / "y.tfrecord", {"a": np.zeros(3), "b": np.zeros(2)})
    with pytest.raises(ValueError, match="column t has 1 rows, expected 3"):
        formats.write_tfrecord(tmp_path / "y.tfrecord", {"a": np.zeros(3), "t": (np.array([0, 2]), np.arange(2))})
    assert not (tmp_path / "y.tfrecord").exists()
