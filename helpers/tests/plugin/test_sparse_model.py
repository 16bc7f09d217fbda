"""The key / emb_vector format, checked against an independent reader (struct, byte by byte)."""
import os
import struct

import numpy as np
import pytest

from embedlab.sparse_model import SparseModelError, read_sparse_model, sparse_model_info, write_sparse_model


def _independent_read(path, dim):
    raw_k = open(os.path.join(path, "key"), "rb").read()
    raw_v = open(os.path.join(path, "emb_vector"), "rb").read()
    n = len(raw_k) // 8
    keys = [struct.unpack_from("<q", raw_k, 8 * i)[0] for i in range(n)]
    vecs = [struct.unpack_from(f"<{dim}f", raw_v, 4 * dim * i) for i in range(n)]
    return keys, np.array(vecs, np.float32).reshape(n, dim)


@pytest.mark.parametrize("dim", [1, 16, 33])
def test_round_trip_and_independent_reader(tmp_path, dim, rng):
    n = int(rng.integers(1, 500))
    keys = rng.choice(np.arange(-(2**40), 2**40, 7919), size=n, replace=False)   # negative keys too
    vecs = rng.standard_normal((n, dim)).astype(np.float32)
    slots = rng.integers(0, 26, n)
    d = tmp_path / "t"
    write_sparse_model(d, keys, vecs, slot_ids=slots)
    assert os.path.getsize(d / "key") == 8 * n and os.path.getsize(d / "emb_vector") == 4 * n * dim
    k2, v2 = _independent_read(d, dim)
    assert k2 == keys.tolist() and np.array_equal(v2, vecs)
    m = read_sparse_model(d)
    assert m.dim == dim and np.array_equal(m.keys, keys) and np.array_equal(m.vectors, vecs)
    assert np.array_equal(m.slot_ids, slots)
    mm = read_sparse_model(d, dim=dim, mmap=True)
    assert np.array_equal(np.asarray(mm.vectors), vecs)


def test_rewrite_is_atomic_and_replaces(tmp_path):
    d = tmp_path / "t"
    write_sparse_model(d, [1, 2], np.ones((2, 4), np.float32))
    with pytest.raises(SparseModelError, match="key 3 appears more than once"):
        write_sparse_model(d, [3, 3], np.zeros((2, 4), np.float32))
    assert read_sparse_model(d).keys.tolist() == [1, 2]            # the failed write changed nothing
    write_sparse_model(d, [9], np.zeros((1, 2), np.float32))
    m = read_sparse_model(d)
    assert m.keys.tolist() == [9] and m.dim == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]      # no temporary folders left


def test_write_is_flushed_to_disk_before_the_rename(tmp_path, monkeypatch):
    import embedlab._io as io
    synced, renamed = [], []
    real_fsync, real_replace = io.os.fsync, io.os.replace
    monkeypatch.setattr(io.os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                    real_fsync(fd)))
    monkeypatch.setattr(io.os, "replace", lambda a, b: (renamed.append((len(synced), str(b))), real_replace(a, b)))
    d = tmp_path / "t"
    write_sparse_model(d, [1, 2], np.ones((2, 4), np.float32), slot_ids=[0, 1])
    # key, emb_vector, slot_id and their folder, all before the rename; the parent folder after it
    assert renamed == [(4, str(d))] and len(synced) == 5 and synced[-1] == str(tmp_path)
    assert sorted(os.path.basename(p) for p in synced[:3]) == ["emb_vector", "key", "slot_id"]


def test_bad_files_are_named(tmp_path):
    d = tmp_path / "t"
    write_sparse_model(d, np.arange(10), np.ones((10, 8), np.float32))
    with pytest.raises(SparseModelError, match="wrong dim"):
        read_sparse_model(d, dim=4)
    with open(d / "emb_vector", "r+b") as f:
        f.truncate(4 * 8 * 10 - 4)
    with pytest.raises(SparseModelError, match="emb_vector"):
        read_sparse_model(d)
    with open(d / "key", "r+b") as f:
        f.truncate(8 * 10 - 3)
    with pytest.raises(SparseModelError, match="truncated"):
        sparse_model_info(d)
    os.remove(d / "key")
    with pytest.raises(SparseModelError, match="key is missing"):
        read_sparse_model(d)
    with pytest.raises(SparseModelError, match="vectors has 2 rows"):
        write_sparse_model(tmp_path / "u", [1, 2, 3], np.ones((2, 4), np.float32))


def test_empty_table_needs_dim(tmp_path):
    d = tmp_path / "e"
    write_sparse_model(d, np.zeros(0, np.int64), np.zeros((0, 8), np.float32))
    with pytest.raises(SparseModelError, match="pass dim="):
        read_sparse_model(d)
    assert len(read_sparse_model(d, dim=8)) == 0
