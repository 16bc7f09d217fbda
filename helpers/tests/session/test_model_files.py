"""The dense model file: written atomically and flushed to disk before it replaces the old one."""
from __future__ import annotations

import os

import numpy as np

from embedlab.session.model_files import read_dense, write_dense


def test_dense_model_is_flushed_before_the_rename_and_reads_back(tmp_path, monkeypatch, rng):
    import embedlab._io as io
    synced, renamed = [], []
    real_fsync, real_replace = io.os.fsync, io.os.replace
    monkeypatch.setattr(io.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                    real_fsync(fd)))
    monkeypatch.setattr(io.os, "replace", lambda a, b: (renamed.append((len(synced), str(b))), real_replace(a, b)))
    arrays = [rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)]
    bn = {"bn1": (np.zeros(3, np.float32), np.ones(3, np.float32))}
    path = tmp_path / "m_dense_0.model"
    write_dense(path, arrays, bn)
    side = tmp_path / "m_dense_0.model.bn.json"
    # both files flushed before the renames (the pair is replaced together), the folder after them
    assert renamed == [(2, str(path)), (2, str(side))]
    assert sorted(os.path.basename(p).split(".tmp-")[0] for p in synced[:2]) == [".m_dense_0.model",
                                                                                 ".m_dense_0.model.bn.json"]
    assert synced[2:] == [str(tmp_path)]
    got, stats = read_dense(path, [(5, 3), (3,)])
    for a, b in zip(arrays, got):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(stats["bn1"][1], np.ones(3, np.float32))
