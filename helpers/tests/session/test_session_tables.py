"""The Session's large embedding tables and their optimizer state start 2 MiB-aligned on huge
pages (`embedlab.tables`) and stay there through training steps, oversubscription's pass
switches (per-pass writes), stored-model download and loading."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab import tables as _tables
from embedlab.session import Session, solver_parser_helper

from sessionlib import dump, wdl_json, write_lists

ROWS, DIM = 1 << 20, 8      # the deep table: 32 MiB, the smallest placed (the wide one, 1M x 1, is not)


def _placed(v) -> bool:
    return _tables.address(v) % _tables.ALIGNMENT == 0


@pytest.fixture(scope="module")
def wd_small(tmp_path_factory):
    d = tmp_path_factory.mktemp("wd_placed")
    return write_lists(d, np.random.default_rng(3), [(1, 2), (4, 1)], n_lists=2, files_per_list=1,
                       per_file=128, vocab=60)


def _session_tables(sess):
    e = sess.embeddings[1]                 # the deep embedding
    return [e.table] + list(e.slots)


@pytest.mark.parametrize("optimizer", [
    None,                                  # Adam, Local: the compiled lookup + update, Keras's state
    {"type": "MomentumSGD", "update_type": "Local",          # TFOptimizer's state, rows scattered
     "momentum_sgd_hparam": {"learning_rate": 0.01, "momentum_factor": 0.9}},
    {"type": "Adam", "update_type": "Global",                # deferred Global Adam: compiled catch-up
     "adam_hparam": {"learning_rate": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}},
])
@pytest.mark.parametrize("over", [False, True])
def test_session_tables_are_placed_through_training_passes_and_loading(tmp_path, wd_small, optimizer, over):
    lists, keysets, _ = wd_small
    j = dump(tmp_path / "m.json", wdl_json(capacity=ROWS, vec=DIM, optimizer=optimizer))
    sess = Session(solver_parser_helper(batchsize=64, seed=5), j, over, str(tmp_path / "store") if over else "")
    tables = _session_tables(sess)
    assert len(tables) == (2 if optimizer and optimizer["type"] == "MomentumSGD" else 3)
    assert all(_placed(t) for t in tables)
    r = sess.get_data_reader_train()
    n = 0
    for i, fl in enumerate(lists):         # with oversubscription: a pass switch writes the tables
        r.set_file_list_source(fl)
        if over:
            sess.get_model_oversubscriber().update(keysets[i])
        while sess.train():
            n += 1
        assert all(_placed(t) for t in tables), [_placed(t) for t in tables]
    assert n >= 4
    sess.download_params_to_files(str(tmp_path / "out"), n)
    assert all(_placed(t) for t in tables)
    if over:
        return
    loaded = Session(solver_parser_helper(batchsize=64, seed=5, model_file=f"{tmp_path}/out_dense_{n}.model",
                                          embedding_files=[f"{tmp_path}/out0_sparse_{n}.model",
                                                           f"{tmp_path}/out1_sparse_{n}.model"]), j)
    t0, t1 = tables[0], _session_tables(loaded)[0]
    assert all(_placed(t) for t in _session_tables(loaded))
    rows = sess.embeddings[1].watermark
    assert rows > 0 and t1[:rows].numpy().tobytes() == t0[:rows].numpy().tobytes()
