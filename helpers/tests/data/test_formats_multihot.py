"""parquet_to_norm with multi-hot slots made of several columns (criteo2hugectr's W&D layout)."""
from __future__ import annotations

import numpy as np

from embedlab.data import formats


def test_parquet_to_norm_multi_hot_slot(tmp_path, rng):
    """parquet_to_norm(slots=[[a, b], c, ...]): one multi-hot slot from several columns, first."""
    n = 300
    cols = {"label": (rng.random(n) > 0.5).astype(np.float32),
            "I1": rng.random(n).astype(np.float32),
            "C1": rng.integers(0, 50, n), "C2": rng.integers(50, 90, n),
            "C1_C2": rng.integers(100, 400, n), "C3_C4": rng.integers(400, 600, n)}
    formats.write_parquet(tmp_path / "x.parquet", cols)
    lists = formats.parquet_to_norm(tmp_path / "x.parquet", tmp_path / "norm", samples_per_file=128,
                                    files_per_list=2, slots=[["C1_C2", "C3_C4"], "C1", "C2"], progress=False)
    assert len(lists) == 2
    files = formats.read_file_list(lists[0]) + formats.read_file_list(lists[1])
    parts = [formats.read_norm(f) for f in files]
    wide_splits = np.concatenate([[0]] + [p.slots[0][0][1:] + 2 * sum(len(q.label) for q in parts[:i])
                                          for i, p in enumerate(parts)])
    wide = np.concatenate([p.slots[0][1] for p in parts]).astype(np.int64)
    np.testing.assert_array_equal(np.diff(wide_splits), 2)
    np.testing.assert_array_equal(wide.reshape(n, 2), np.stack([cols["C1_C2"], cols["C3_C4"]], 1))
    np.testing.assert_array_equal(np.concatenate([p.slots[1][1] for p in parts]), cols["C1"])
    ks = formats.read_keyset(lists[0].with_suffix(".keyset"))
    first = np.concatenate([np.concatenate([p.slots[s][1] for s in range(3)]) for p in parts[:2]])
    np.testing.assert_array_equal(ks, np.unique(first))
