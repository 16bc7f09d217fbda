"""`use_mixed_precision` + `scaler`: float16 dense compute with loss scaling trains the same model
as float32 (the loss scale is undone exactly once, for compiled and non-compiled embeddings)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from embedlab.session import Session, solver_parser_helper
from embedlab.session.embedding import init_values
from sessionlib import dump, wdl_json, write_lists


def _sparse(path, vec):
    keys = np.fromfile(Path(path) / "key", dtype="<i8")
    vals = np.fromfile(Path(path) / "emb_vector", dtype="<f4").reshape(-1, vec)
    order = np.argsort(keys)
    return keys[order], vals[order]


def _train(tmp_path, name, lists, j, mixed):
    solver = solver_parser_helper(batchsize=64, seed=5, use_mixed_precision=mixed, scaler=256.0 if mixed else 1.0)
    sess = Session(solver, dump(tmp_path / f"{name}.json", j))
    assert ("mixed precision True" in sess.summary()) == mixed
    sess.download_params_to_files(str(tmp_path / f"{name}_a"), 0)
    r = sess.get_data_reader_train()
    r.set_file_list_source(lists[0])
    losses = []
    for _ in range(3):
        assert sess.train()
        losses.append(sess.get_current_loss())
    sess.download_params_to_files(str(tmp_path / f"{name}_b"), 1)
    dense0 = np.fromfile(tmp_path / f"{name}_a_dense_0.model", dtype="<f4")
    dense1 = np.fromfile(tmp_path / f"{name}_b_dense_1.model", dtype="<f4")
    return losses, dense1 - dense0, _sparse(tmp_path / f"{name}_b1_sparse_1.model", 4)


@pytest.mark.parametrize("update", ["Local", "Global"])
def test_mixed_precision_matches_float32(tmp_path, update):
    rng = np.random.default_rng(11)
    lists, _, _ = write_lists(tmp_path / "d", rng, [(1, 2), (4, 1)], n_lists=1, per_file=96, vocab=60)
    j = wdl_json(hidden=8, optimizer={"type": "SGD", "update_type": update, "sgd_hparam": {"learning_rate": 0.5}})
    l32, d32, (k32, t32) = _train(tmp_path, "f32", lists, j, mixed=False)
    l16, d16, (k16, t16) = _train(tmp_path, "f16", lists, j, mixed=True)
    assert np.all(np.isfinite(l16))
    np.testing.assert_allclose(l16, l32, rtol=5e-3)
    # the dense weights moved by the same amounts (float16 compute: 1 % of the largest move)
    np.testing.assert_allclose(d16, d32, rtol=0, atol=1e-2 * np.abs(d32).max())
    assert np.array_equal(k16, k32)
    # the trained rows moved by the same amounts from their initial values (same seed)
    t0 = init_values(k32, 4, 5, 1)
    np.testing.assert_allclose(t16 - t0, t32 - t0, rtol=0, atol=1e-2 * np.abs(t32 - t0).max())
