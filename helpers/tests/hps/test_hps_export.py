"""export_for_serving: the files and manifest the serving side reads, checked end to end
(ONNX vs TensorFlow, the inference SavedModel vs the trained model in a fresh process)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from embedlab.hps import export


def test_export_for_serving(tmp_path):
    args = export.DemoArgs(global_batch_size=256, iter_num=3,
                           vocabulary_range_per_slot=[[0, 1000], [1000, 2000], [2000, 3000]])
    m = export.export_for_serving(tmp_path / "hps_triton", args, verbose=False)
    keys = {"model_name", "ps_config_file", "table_id", "emb_vec_size", "slot_num", "keys_per_sample", "onnx_file",
            "onnx_input", "onnx_output", "dense_savedmodel", "inference_savedmodel"}
    assert keys <= set(m)
    assert json.loads((tmp_path / "hps_triton" / "serving.json").read_text()) == m
    for k in ("ps_config_file", "onnx_file", "dense_savedmodel", "inference_savedmodel", "reshape_dense_savedmodel"):
        assert Path(m[k]).is_absolute() and Path(m[k]).exists(), k
    cfg = json.loads(Path(m["ps_config_file"]).read_text())
    assert Path(cfg["models"][0]["sparse_files"][0]).is_absolute()
    assert (m["model_name"], m["emb_vec_size"], m["slot_num"], m["onnx_input"], m["onnx_output"]) == \
        ("naive_dnn", 16, 3, "dense_input", "logits")
    assert m["checks"]["onnx_max_abs_diff"] < 1e-5
    assert m["checks"]["logits_mse"] <= 1e-6 and m["checks"]["embeddings_mse"] <= 1e-6
    # A fresh process: the inference SavedModel (hps.LookupLayer, implicit init) against the sparse
    # files + the ONNX dense part through onnxruntime.
    code = f"""
import json, numpy as np, tensorflow as tf, onnxruntime as ort
import embedlab.hps as hps
m = json.load(open({str(tmp_path / 'hps_triton' / 'serving.json')!r}))
sm = hps.read_sparse_model(json.load(open(m["ps_config_file"]))["models"][0]["sparse_files"][0])
keys = np.random.default_rng().integers(0, 3000, (37, m["slot_num"]))
out = tf.saved_model.load(m["inference_savedmodel"]).signatures["serving_default"](keys=tf.constant(keys))
emb = sm.vectors[keys].reshape(len(keys), -1)
assert np.array_equal(out["embeddings"].numpy(), emb)
s = ort.InferenceSession(m["onnx_file"], providers=["CPUExecutionProvider"])
logits = s.run([m["onnx_output"]], {{m["onnx_input"]: emb}})[0]
assert np.mean((logits - out["logits"].numpy()) ** 2) <= 1e-6
dense = tf.saved_model.load(m["dense_savedmodel"]).signatures["serving_default"]
assert np.allclose(dense(dense_input=tf.constant(emb))["logits"].numpy(), logits, atol=1e-5)
print("served-ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert "served-ok" in r.stdout, r.stderr[-3000:]
