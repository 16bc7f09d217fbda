"""The Session's files: `download_params_to_files` writes its set all or nothing and names the
file and the OS's error; the loader refuses a sparse model holding a key twice; a model JSON that
is not UTF-8 is a ModelError naming the file."""
from __future__ import annotations

import errno
import os
import subprocess

import numpy as np
import pytest

from embedlab import sparse_model
from embedlab.session import Session, solver_parser_helper
from embedlab.session.spec import ModelError

from sessionlib import dump, wdl_json, write_lists


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("wd")
    lists, _, _ = write_lists(d, np.random.default_rng(3), [(1, 2), (4, 1)], n_lists=1, files_per_list=1,
                              per_file=96, vocab=60)
    j = dump(d / "m.json", wdl_json(optimizer={"type": "SGD", "sgd_hparam": {"learning_rate": 0.3}}))
    sess = Session(solver_parser_helper(batchsize=32, seed=2), j)
    r = sess.get_data_reader_train()
    r.set_file_list_source(lists[0])
    while sess.train():
        pass
    return sess, j


def _snapshot(folder):
    out = {}
    for root, _dirs, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = open(p, "rb").read()
    return out


def test_failed_download_changes_none_of_the_set(tmp_path, trained, monkeypatch):
    sess, _ = trained
    sess.download_params_to_files(str(tmp_path / "ck"), 2)
    before = _snapshot(tmp_path)
    real = sparse_model.write_sparse_model

    def second_table_fails(path, *a, **k):           # a full disk while writing the second table
        if "1_sparse_" in os.path.basename(path):
            raise OSError(errno.ENOSPC, f"cannot write {path}/emb_vector: No space left on device")
        return real(path, *a, **k)

    monkeypatch.setattr(sparse_model, "write_sparse_model", second_table_fails)
    with pytest.raises(OSError, match=rf"cannot write {tmp_path}/ck1_sparse_2.model/emb_vector: No space left on "
                                      r"device; none of the files of iteration 2") as ei:
        sess.download_params_to_files(str(tmp_path / "ck"), 2)
    assert ei.value.errno == errno.ENOSPC and isinstance(ei.value.__cause__, OSError)
    assert _snapshot(tmp_path) == before                 # the earlier set, byte for byte, and no temporaries
    with pytest.raises(OSError):
        sess.download_params_to_files(str(tmp_path / "new"), 3)
    assert _snapshot(tmp_path) == before                 # nothing of a new set either


def test_download_onto_a_full_disk_names_the_file_and_the_cause(tmp_path, trained):
    sess, _ = trained
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root and a mountable tmpfs for a real full disk "
                    "(test_failed_download_changes_none_of_the_set simulates one)")
    try:
        # Fill it to the last page (tmpfs counts its limit loosely, so write until it refuses).
        with pytest.raises(OSError), open(mnt / "filler", "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        with pytest.raises(OSError) as ei:
            sess.download_params_to_files(str(mnt / "ck"), 5)
        assert ei.value.errno == errno.ENOSPC, ei.value
        msg = str(ei.value)
        assert "No space left on device" in msg and ".tmp-" not in msg and f"cannot write {mnt}/ck" in msg, msg
        assert sorted(os.listdir(mnt)) == ["filler"]     # none of the set is visible
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_loader_refuses_a_duplicate_key(tmp_path, trained):
    sess, j = trained
    dense, s0, s1 = sess.download_params_to_files(str(tmp_path / "ck"), 1)
    raw = bytearray((s1 / "key").read_bytes())
    raw[8:16] = raw[0:8]                                 # key[1] overwritten by key[0]
    (s1 / "key").write_bytes(bytes(raw))
    k0 = int(np.frombuffer(raw[:8], "<i8")[0])
    with pytest.raises(sparse_model.SparseModelError, match=rf"sparse model {s1}: key holds key {k0} more than once"):
        Session(solver_parser_helper(batchsize=32, model_file=str(dense), embedding_files=[str(s0), str(s1)]), j)


def test_model_json_that_is_not_utf8_names_the_file(tmp_path, trained):
    _, j = trained
    bad = tmp_path / "bad.json"
    raw = open(j, "rb").read()
    i = raw.index(b'"layers"')
    bad.write_bytes(raw[:i + 2] + b"\xff" + raw[i + 3:])
    with pytest.raises(ModelError, match=rf"{bad}: not valid JSON: byte {i + 2} \(b'\\xff'\) is not UTF-8"):
        Session(solver_parser_helper(batchsize=32), bad)
