"""The key / emb_vector format, checked against an independent reader (struct, byte by byte)."""
import errno
import os
import subprocess
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


@pytest.mark.parametrize("mmap", [False, True])
def test_duplicate_key_is_refused_by_the_reader_naming_file_and_key(tmp_path, rng, mmap):
    n = 100
    keys = rng.choice(10**9, size=n, replace=False)
    d = tmp_path / "t"
    write_sparse_model(d, keys, rng.standard_normal((n, 4)).astype(np.float32))
    raw = bytearray((d / "key").read_bytes())
    raw[8:16] = raw[0:8]                                   # key[1] overwritten by key[0]
    (d / "key").write_bytes(bytes(raw))
    with pytest.raises(SparseModelError, match=rf"sparse model {d}: key holds key {int(keys[0])} more than once "
                                               rf"\(rows \[0, 1\]"):
        read_sparse_model(d, dim=4, mmap=mmap)
    m = read_sparse_model(d, dim=4, mmap=mmap, check_unique=False)    # the raw rows, on request
    assert m.keys[1] == m.keys[0]


def _write_fails_with_enospc(tmp_path, folder):
    keys, vecs = np.arange(10_000), np.ones((10_000, 64), np.float32)      # 2.6 MB
    d = folder / "t"
    write_sparse_model(d, [1], np.ones((1, 4), np.float32))               # a previous version
    with pytest.raises(OSError) as ei:
        write_sparse_model(d, keys, vecs)
    assert ei.value.errno == errno.ENOSPC, ei.value
    assert f"cannot write {d / 'emb_vector'}" in str(ei.value) and "No space left" in str(ei.value)
    assert read_sparse_model(d).keys.tolist() == [1] and sorted(p.name for p in folder.iterdir()) == ["t"]


def test_full_disk_names_the_file_and_the_cause(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a mountable tmpfs for a real full disk "
                    "(test_full_disk_simulated covers the same path)")
    try:
        _write_fails_with_enospc(tmp_path, mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_full_disk_simulated(tmp_path, monkeypatch):
    # The file object's write raises ENOSPC after 1 MiB in all, as a full disk does.
    import builtins
    real_open, written = builtins.open, [0]

    class Full:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            written[0] += len(b)
            if written[0] > 1 << 20:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(b)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return self.f.__exit__(*a)

    import embedlab.sparse_model as sm
    monkeypatch.setattr(sm, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    _write_fails_with_enospc(tmp_path, tmp_path)
