"""embedlab.hps.export on a dense Keras model of its own (not the tutorials' DNN): a table whose
keys are not 0..n-1, the files and manifest written, the served answer (HPS lookup + ONNX) equal
to the Keras model on the table's rows; bad sizes named in the error."""
import json

import numpy as np
import pytest

from embedlab.hps import ParameterServer, export


def test_export_model_of_any_dense_model(tmp_path, rng):
    import tensorflow as tf
    k, dim, n = 2, 4, 300
    keys = rng.choice(10**9, n, replace=False).astype(np.int64)        # sparse, unsorted keys
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    dense = tf.keras.Sequential([tf.keras.Input((k * dim,)), tf.keras.layers.Dense(5, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    m = export.export_model(tmp_path / "out", dense, keys, vectors, model_name="mine", keys_per_sample=k,
                            max_batch_size=32, native_tiers=False, checks={"note": 1.0}, extra={"owner": "test"})
    assert json.loads((tmp_path / "out" / "serving.json").read_text()) == m
    assert (m["model_name"], m["keys_per_sample"], m["emb_vec_size"], m["owner"]) == ("mine", k, dim, "test")
    assert m["checks"]["onnx_max_abs_diff"] < 1e-5 and m["checks"]["note"] == 1.0
    assert m["tiers"] == {"gpucache": False, "volatile_db": "disabled", "persistent_db": "rocks_db"}
    cfg = json.loads((tmp_path / "out" / "mine.json").read_text())["models"][0]
    assert cfg["embedding_table_names"] == ["sparse_embedding1"] and cfg["max_batch_size"] == 32
    q = rng.choice(keys, (7, k))
    with ParameterServer(m["ps_config_file"]) as ps:
        got = ps.lookup("mine", 0, q.reshape(-1)).reshape(7, k * dim)
    rows = {int(key): i for i, key in enumerate(keys)}
    want = vectors[[[rows[int(x)] for x in r] for r in q]].reshape(7, k * dim)
    assert np.array_equal(got, want)
    import onnxruntime as ort
    s = ort.InferenceSession(m["onnx_file"], providers=["CPUExecutionProvider"])
    assert np.allclose(s.run([m["onnx_output"]], {m["onnx_input"]: got})[0], dense(got).numpy(), atol=1e-5)


def test_bad_sizes_are_named(tmp_path):
    with pytest.raises(ValueError, match="emb_vec_sizes has 2 entries, sparse_files 1"):
        export.write_hps_json(tmp_path / "a.json", model_name="m", sparse_files=["s"], emb_vec_sizes=[4, 4],
                              keys_per_sample=[1], max_batch_size=8)
    with pytest.raises(ValueError, match="max_batch_size must be a positive int, got 0"):
        export.write_hps_json(tmp_path / "a.json", model_name="m", sparse_files=["s"], emb_vec_sizes=[4],
                              keys_per_sample=[1], max_batch_size=0)
    with pytest.raises(ValueError, match="model_name must be a non-empty string"):
        export.write_hps_json(tmp_path / "a.json", model_name="", sparse_files=["s"], emb_vec_sizes=[4],
                              keys_per_sample=[1], max_batch_size=8)
    assert not (tmp_path / "a.json").exists()
    with pytest.raises(ValueError, match="check_keys must be"):
        export.export_model(tmp_path / "o", None, np.arange(4), np.zeros((4, 2), np.float32), model_name="m",
                            keys_per_sample=1, max_batch_size=8, check_keys=np.array([[99]]))
    assert not (tmp_path / "o").exists()                    # checked before anything is written


_EXPORT_B = r"""
import sys, numpy as np, tensorflow as tf
from embedlab.hps import export
out, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
keys = np.arange(400, dtype=np.int64)
vectors = rng.standard_normal((400, 4)).astype(np.float32)
dense = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1, kernel_initializer="ones")])
export.export_model(out, dense, keys, vectors, model_name="mine", keys_per_sample=2, max_batch_size=32,
                    native_tiers=True)
"""


def _export_a(out, rng, native_tiers=False):
    import tensorflow as tf
    vectors = rng.standard_normal((400, 4)).astype(np.float32)
    dense = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
    export.export_model(out, dense, np.arange(400, dtype=np.int64), vectors, model_name="mine", keys_per_sample=2,
                        max_batch_size=32, native_tiers=native_tiers)
    return dense, vectors


def test_a_killed_export_leaves_the_previous_one_whole(tmp_path, rng):
    """Export A; start exporting B into the same folder and SIGKILL it once B's table is on disk
    (in place, or in the folder being built): A is still served, whole; the next export removes
    the killed one's folder. The compiled tiers read the table from the sparse model's files."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from embedlab.serving import InProcessModel
    out = tmp_path / "out"
    dense, vectors = _export_a(out, rng, native_tiers=True)
    a_table = (out / "mine_sparse.model" / "emb_vector").read_bytes()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", _EXPORT_B, str(out), "11"], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, seen = time.monotonic() + 120, None
    while seen is None and time.monotonic() < deadline and p.poll() is None:
        for f in [out / "mine_sparse.model" / "emb_vector",
                  *tmp_path.glob(".out.tmp-*/mine_sparse.model/emb_vector")]:
            try:
                if f.stat().st_size == len(a_table) and f.read_bytes() != a_table:
                    seen = f
            except OSError:
                pass
        time.sleep(0.005)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert seen is not None, f"B's table never appeared: {p.stderr.read().decode()[-2000:]}"
    q = rng.integers(0, 400, (5, 2))
    with InProcessModel(out, threads=1) as m:           # A, whole, verified
        got = m.predict(q)
    np.testing.assert_allclose(got, dense(vectors[q].reshape(5, 8)).numpy(), atol=1e-5)
    assert list(tmp_path.glob(".out.tmp-*")), "the killed export's folder should be there until the next export"
    _export_a(out, rng, native_tiers=True)
    assert not list(tmp_path.glob(".out.*")), sorted(p.name for p in tmp_path.iterdir())


def test_a_changed_or_mixed_export_is_refused_naming_the_file(tmp_path, rng):
    from embedlab.hps.export import ManifestFileError
    from embedlab.serving import InProcessModel, load_manifest, write_model_repository
    out = tmp_path / "out"
    _export_a(out, rng)
    m = load_manifest(out)
    raw = json.loads((out / "serving.json").read_text())
    assert {"mine.json", "dense.onnx", "mine_sparse.model/key", "mine_sparse.model/emb_vector"} <= set(raw["files"])
    assert all(set(r) == {"size", "sha256"} for r in raw["files"].values())
    emb = out / "mine_sparse.model" / "emb_vector"
    good = emb.read_bytes()
    mixed = bytearray(good)
    mixed[5] ^= 0x40                                     # another model's table: same size, other bytes
    emb.write_bytes(bytes(mixed))
    for load in (lambda: load_manifest(out), lambda: InProcessModel(m, threads=1),
                 lambda: write_model_repository(m, tmp_path / "repo")):
        with pytest.raises(ManifestFileError, match=r"emb_vector: its SHA-256 .* differs"):
            load()
    assert not (tmp_path / "repo").exists()
    emb.write_bytes(good)
    with InProcessModel(out, threads=1):                 # opening the RocksDB read-only changes no recorded file
        pass
    load_manifest(out)
    stray = out / "mine_dense.model" / "variables" / "stray.index"
    stray.write_bytes(b"x")
    with pytest.raises(ManifestFileError, match=r"stray\.index is not in the manifest's records"):
        load_manifest(out)
    stray.unlink()
    onnx_file = out / "dense.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:-3])
    with pytest.raises(ManifestFileError, match=r"dense\.onnx: \d+ bytes, the manifest recorded \d+"):
        load_manifest(out)
    onnx_file.unlink()
    with pytest.raises(FileNotFoundError, match=r"dense\.onnx .*does not exist"):
        load_manifest(out)
