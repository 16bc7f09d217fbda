"""embedlab.tutorials.naive_dnn (notebook 05's model): export_for_serving's files and manifest,
which the serving side reads, checked end to end (ONNX vs TensorFlow, the inference SavedModel
vs the trained model in a fresh process); the click model behind the demo's labels, and a model
trained on it that learns."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from embedlab.tutorials import naive_dnn


def test_export_for_serving(tmp_path, run_seed):
    args = naive_dnn.DemoArgs(global_batch_size=256, iter_num=3,
                           vocabulary_range_per_slot=[[0, 1000], [1000, 2000], [2000, 3000]])
    m = naive_dnn.export_for_serving(tmp_path / "hps_triton", args, verbose=False)
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
    assert 0.0 <= m["checks"]["auc"] <= 1.0 and m["checks"]["auc_ceiling"] > 0.7
    assert naive_dnn.ClickModel.from_spec(m["data"]).spec() == naive_dnn.ClickModel.from_args(args).spec()
    # A fresh process: the inference SavedModel (hps.LookupLayer, implicit init) against the sparse
    # files + the ONNX dense part through onnxruntime.
    code = f"""
import json, numpy as np, tensorflow as tf, onnxruntime as ort
import embedlab.hps as hps
m = json.load(open({str(tmp_path / 'hps_triton' / 'serving.json')!r}))
sm = hps.read_sparse_model(json.load(open(m["ps_config_file"]))["models"][0]["sparse_files"][0])
keys = np.random.default_rng({run_seed}).integers(0, 3000, (37, m["slot_num"]))
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


def test_click_model_is_reproducible_skewed_and_predictive(rng):
    args = naive_dnn.DemoArgs(seed=int(rng.integers(1 << 20)))
    cm = naive_dnn.ClickModel.from_args(args)
    k1, y1, z1 = cm.sample(50_000, np.random.default_rng(3))
    k2, y2, z2 = naive_dnn.ClickModel.from_spec(json.loads(json.dumps(cm.spec()))).sample(50_000, np.random.default_rng(3))
    assert np.array_equal(k1, k2) and np.array_equal(y1, y2) and np.array_equal(z1, z2)
    assert k1.dtype == np.int64 and k1.shape == (50_000, 3) and y1.shape == (50_000, 1)
    for s, (lo, hi) in enumerate(args.vocabulary_range_per_slot):
        assert k1[:, s].min() >= lo and k1[:, s].max() < hi
        counts = np.sort(np.unique(k1[:, s], return_counts=True)[1])[::-1]
        assert counts[:100].sum() > 0.4 * len(k1)          # Zipf: 1 % of the keys fill most draws
    # labels follow the logits: the true model's AUC is well above a coin flip, and labels are noisy
    from embedlab.session import auc
    assert 0.75 < auc(y1, z1) < 0.95
    flat = naive_dnn.ClickModel(args.vocabulary_range_per_slot, effect_std=0.0).sample(20_000, np.random.default_rng(4))
    assert abs(flat[1].mean() - 0.5) < 0.02 and np.all(flat[2] == 0)      # effect_std 0: coin flips
    with pytest.raises(ValueError, match="not a click-model spec"):
        naive_dnn.ClickModel.from_spec({"seed": 1})
    with pytest.raises(ValueError, match="ranges"):
        naive_dnn.ClickModel([[5, 5]])


def test_trained_model_learns_the_click_model():
    args = naive_dnn.DemoArgs(global_batch_size=1024, iter_num=20)      # notebook 05's ci size
    model, losses, _ = naive_dnn.train_naive_dnn(args, log_every=0)
    q = naive_dnn.evaluate(model, args, num_samples=20_000)
    assert np.mean(losses[-3:]) < losses[0] - 0.02, losses
    assert 0.6 < q["auc"] <= q["auc_ceiling"] + 0.01, q
    assert q["loss_floor"] < q["loss"] < np.log(2), q
