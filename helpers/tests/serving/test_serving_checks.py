"""The request checks the python models run (no server): each bad input is named."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from embedlab.serving import load_manifest, write_ps_config_variant
from embedlab.serving._checks import check_keys, check_vectors

K, MB = 3, 8


def _ok_keys(batch=4):
    return np.arange(batch * K, dtype=np.int64).reshape(batch, K), np.full((batch, 1), K, np.int32)


def test_good_request_passes():
    assert check_keys(*_ok_keys(), K, MB) is None
    assert check_keys(*_ok_keys(MB), K, MB) is None
    assert check_vectors(np.zeros((2, K, 4), np.float32), (K, 4), MB) is None


@pytest.mark.parametrize("mutate,match", [
    (lambda k, n: (k.astype(np.int32), n), r"KEYS has dtype int32, expected int64"),
    (lambda k, n: (k, n.astype(np.int64)), r"NUMKEYS has dtype int64, expected int32"),
    (lambda k, n: (k[:, :2], n), r"KEYS has shape \[4, 2\], expected \[batch, 3\]"),
    (lambda k, n: (k, n[:2]), r"NUMKEYS has shape \[2, 1\], expected \[4, 1\]"),
    (lambda k, n: (k, np.where(np.arange(4)[:, None] == 1, 2, n).astype(np.int32)),
     r"NUMKEYS\[1\] = 2 disagrees with KEYS, which holds 3 keys per sample"),
    (lambda k, n: (np.where(k == 7, -1, k), n), r"KEYS\[2, 1\] = -1 is a negative key \(1 negative"),
    (lambda k, n: (None, n), "KEYS is missing"),
])
def test_bad_requests_are_named(mutate, match):
    k, n = _ok_keys()
    msg = check_keys(*mutate(k, n), K, MB)
    assert msg is not None
    assert re.search(match, msg), msg


def test_batch_above_max():
    k, n = _ok_keys(MB + 1)
    assert "batch 9, above max_batch_size 8" in check_keys(k, n, K, MB)
    assert "above max_batch_size" in check_vectors(np.zeros((MB + 1, K, 4), np.float32), (K, 4), MB)


def test_vector_checks():
    assert "dtype float64" in check_vectors(np.zeros((2, K, 4)), (K, 4), MB)
    assert "expected [batch, 3, 4]" in check_vectors(np.zeros((2, K, 5), np.float32), (K, 4), MB)
    v = np.zeros((2, K, 4), np.float32)
    v[1, 2, 3] = np.nan
    assert "non-finite" in check_vectors(v, (K, 4), MB)


def test_ps_config_variant(export_dir, tmp_path):
    m = load_manifest(export_dir)
    out = write_ps_config_variant(m, tmp_path / "v.json", volatile_db={"type": "hash_map"},
                                  persistent_db={"type": "rocks_db", "path": str(tmp_path / "db")},
                                  gpucacheper=0.25)
    cfg = json.loads(out.read_text())
    orig = json.loads(open(m.ps_config_file).read())
    assert cfg["volatile_db"] == {"type": "hash_map"} and cfg["persistent_db"]["type"] == "rocks_db"
    assert cfg["models"][0]["gpucacheper"] == 0.25
    assert cfg["models"][0]["sparse_files"] == orig["models"][0]["sparse_files"]
