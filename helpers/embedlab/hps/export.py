"""Export a trained embedding + dense model for the HPS and Triton (the steps of HugeCTR's
"HPS + Triton ensemble, 01 model training" workflow after training,
``hugectr_backend:hps_backend/samples/hps-triton-ensemble/01_model_training.ipynb``).

The model: one embedding table looked up with ``slot_num`` keys per sample, concatenated into
``[batch, slot_num * dim]`` and fed to Keras dense layers ``fc_1``, ``fc_2``, ``fc_3`` (the
naive DNN of :mod:`embedlab.tutorials.naive_dnn`, which also trains it and runs the whole export).
``args`` is an object with the sizes (``embed_vec_size``, ``slot_num``,
``vocabulary_range_per_slot``, ``global_batch_size``: a ``naive_dnn.DemoArgs``).

* :func:`dense_part`, :func:`save_dense_savedmodels`: the dense part as its own SavedModel, plus a
  reshaping wrapper (HPS returns flat vectors);
* :func:`write_embedding`: the table as ``key`` / ``emb_vector`` (:func:`embedlab.sparse_model.write_sparse_model`);
* :func:`export_onnx`, :func:`check_onnx`: the dense part in ONNX (tf2onnx), checked with
  ``onnx.checker`` and onnxruntime;
* :func:`serving_tiers`, :func:`write_hps_json`: the HPS JSON and its tiers;
* :func:`build_inference_model`, :func:`compare_with_trained`: the inference model rebuilt with
  :class:`embedlab.hps.LookupLayer` over the HPS JSON, checked against the trained one.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .._io import atomic_dir, atomic_file
from ..sparse_model import write_sparse_model

if TYPE_CHECKING:
    from ..tutorials.naive_dnn import DemoArgs

log = logging.getLogger("embedlab.hps")

__all__ = ["dense_part", "save_dense_savedmodels", "export_onnx", "check_onnx", "write_embedding",
           "write_hps_json", "serving_tiers", "build_inference_model", "compare_with_trained",
           "MODEL_NAME", "ONNX_INPUT", "ONNX_OUTPUT"]

# The naive DNN's trainer and its end-to-end export live in embedlab.tutorials.naive_dnn; these
# names stay reachable here, loaded on first use.
_TUTORIAL = ("DemoArgs", "demo_args", "ClickModel", "generate_samples", "evaluate", "train_naive_dnn",
             "write_manifest", "export_for_serving")


def __getattr__(name):
    if name in _TUTORIAL:
        from ..tutorials import naive_dnn
        return getattr(naive_dnn, name)
    raise AttributeError(f"module 'embedlab.hps.export' has no attribute {name!r}")


MODEL_NAME = "naive_dnn"
TABLE_NAME = "sparse_embedding1"
ONNX_INPUT = "dense_input"
ONNX_OUTPUT = "logits"


def _tf():
    import tensorflow as tf
    return tf


def dense_part(model, args: DemoArgs):
    """The trained fc layers as their own Keras model: ``[batch, slot_num * dim]`` -> ``[batch, 1]``."""
    tf = _tf()
    x = tf.keras.Input(shape=(args.slot_num * args.embed_vec_size,), dtype=tf.float32, name=ONNX_INPUT)
    y = model.fc_3(model.fc_2(model.fc_1(x)))
    return tf.keras.Model(x, y, name="tf_dense_model")


def save_dense_savedmodels(dense, args: DemoArgs, dense_path, reshape_path) -> None:
    """Saves the dense model (signature input ``dense_input`` [batch, slot*dim] -> ``logits``) and
    HugeCTR's reshaping wrapper (input ``lookup_vectors``: the HPS's flat vectors, float32 of any
    shape, reshaped to [batch, slot*dim] -> ``logits``) as SavedModels."""
    tf = _tf()
    width = args.slot_num * args.embed_vec_size

    class Dense(tf.Module):
        def __init__(self, dense):
            super().__init__()
            self.dense = dense

        @tf.function(input_signature=[tf.TensorSpec([None, width], tf.float32, name=ONNX_INPUT)])
        def serve(self, x):
            return {"logits": self.dense(x)}

    class Reshape(tf.Module):
        def __init__(self, dense):
            super().__init__()
            self.dense = dense

        @tf.function(input_signature=[tf.TensorSpec(None, tf.float32, name="lookup_vectors")])
        def serve(self, v):
            return {"logits": self.dense(tf.reshape(v, [-1, width]))}

    for cls, path in ((Dense, dense_path), (Reshape, reshape_path)):
        m = cls(dense)
        with atomic_dir(path) as tmp:
            tf.saved_model.save(m, str(tmp), signatures={"serving_default": m.serve})


def export_onnx(dense, args: DemoArgs, path, opset: int = 13) -> dict:
    """Converts the dense model to ONNX with tf2onnx (dynamic batch); returns input/output names."""
    tf = _tf()
    import tf2onnx
    width = args.slot_num * args.embed_vec_size
    fn = tf.function(lambda x: dense(x))
    spec = (tf.TensorSpec([None, width], tf.float32, name=ONNX_INPUT),)
    model_proto, _ = tf2onnx.convert.from_function(fn, input_signature=spec, opset=opset)
    # tf2onnx names the output after the TF graph ("Identity:0"); give it a stable name.
    old = model_proto.graph.output[0].name
    for node in model_proto.graph.node:
        for i, o in enumerate(node.output):
            if o == old:
                node.output[i] = ONNX_OUTPUT
    model_proto.graph.output[0].name = ONNX_OUTPUT
    with atomic_file(Path(path)) as tmp:
        Path(tmp).write_bytes(model_proto.SerializeToString())
    return {"input": model_proto.graph.input[0].name, "output": model_proto.graph.output[0].name}


def check_onnx(path, dense, args: DemoArgs, table, batch: int = 257, seed: int = 1) -> float:
    """``onnx.checker`` on the file, then onnxruntime against TensorFlow on what the served dense
    model receives: the rows of ``table`` (the trained embedding, ``[vocabulary, dim]``) for the
    keys of ``batch`` samples drawn uniformly from every slot's range, concatenated per sample.
    Returns the max abs difference of the logits (float32 summation order: about 1e-6 here)."""
    import onnx
    import onnxruntime as ort
    onnx.checker.check_model(onnx.load(str(path)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    keys = np.stack([rng.integers(lo, hi, batch) for lo, hi in args.vocabulary_range_per_slot], axis=1)
    x = np.ascontiguousarray(np.asarray(table, np.float32)[keys].reshape(batch, -1))
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    ref = dense(x).numpy()
    return float(np.max(np.abs(got - ref)))


def write_embedding(model, path) -> Path:
    """The trained table as ``key`` (0..V-1) / ``emb_vector``."""
    table = model.params.numpy()
    return write_sparse_model(path, np.arange(table.shape[0], dtype=np.int64), table)


def write_hps_json(path, sparse_dir, args: DemoArgs, *, model_name: str = MODEL_NAME, gpucache: bool = True,
                   gpucacheper: float = 0.5, volatile_db: dict | None = None,
                   persistent_db: dict | None = None, max_batch_size: int | None = None) -> Path:
    """Writes the HPS JSON for the demo model (absolute paths), atomically."""
    cfg = {
        "supportlonglong": True,
        "volatile_db": volatile_db or {"type": "parallel_hash_map", "initial_cache_rate": 1.0},
        "persistent_db": persistent_db or {"type": "disabled"},
        "models": [{
            "model": model_name,
            "sparse_files": [str(Path(sparse_dir).resolve())],
            "embedding_table_names": [TABLE_NAME],
            "embedding_vecsize_per_table": [args.embed_vec_size],
            "maxnum_catfeature_query_per_table_per_sample": [args.slot_num],
            "default_value_for_each_table": [0.0],
            "deployed_device_list": [0],
            "max_batch_size": int(max_batch_size or args.global_batch_size),
            "hit_rate_threshold": 0.9,
            "gpucacheper": gpucacheper,
            "gpucache": gpucache,
            "embedding_cache_type": "dynamic",
        }],
    }
    with atomic_file(Path(path)) as tmp:
        Path(tmp).write_text(json.dumps(cfg, indent=2) + "\n")
    return Path(path)


def _inference_module(ps_config_file: str, dense, args: DemoArgs, model_name: str = MODEL_NAME):
    tf = _tf()
    from .layers import LookupLayer

    class InferenceModel(tf.Module):
        """keys int64 ``[batch, slot_num]`` -> ``{"logits": [batch, 1], "embeddings": [batch, slot*dim]}``."""

        def __init__(self):
            super().__init__()
            self.lookup = LookupLayer(model_name, 0, args.embed_vec_size, ps_config_file=str(ps_config_file),
                                      global_batch_size=args.global_batch_size)
            self.dense = dense

        @tf.function(input_signature=[tf.TensorSpec([None, args.slot_num], tf.int64, name="keys")])
        def serve(self, keys):
            emb = tf.reshape(self.lookup(keys), [-1, args.slot_num * args.embed_vec_size])
            return {"logits": self.dense(emb), "embeddings": emb}

    return InferenceModel()


def build_inference_model(ps_config_file, dense, args: DemoArgs, path=None, model_name: str = MODEL_NAME):
    """The inference model: ``hps.LookupLayer`` + the dense part; saved as a SavedModel when ``path`` is given."""
    m = _inference_module(ps_config_file, dense, args, model_name)
    if path is not None:
        with atomic_dir(path) as tmp:
            _tf().saved_model.save(m, str(tmp), signatures={"serving_default": m.serve})
    return m


def compare_with_trained(trained, infer, keys) -> dict:
    """MSE of the inference model's logits and embeddings against the trained model's."""
    tf = _tf()
    ref_logit, ref_emb = trained(tf.constant(keys))
    out = infer.serve(tf.constant(keys))
    return {"logits_mse": float(np.mean((out["logits"].numpy() - ref_logit.numpy()) ** 2)),
            "embeddings_mse": float(np.mean((out["embeddings"].numpy() - ref_emb.numpy()) ** 2))}


def _native_tiers_available() -> bool:
    try:
        from .._native import core
        c = core()
        return hasattr(c, "EmbeddingCache") and hasattr(c, "HashMapStore")
    except Exception:
        return False


def serving_tiers(out_dir, sparse_dir, args: DemoArgs, native_tiers: bool | None = None) -> dict:
    """The tiers of ``hps_demo.json``: the compiled cache + ``parallel_hash_map`` (``native_tiers``),
    or a RocksDB filled here and opened read-only by the servers (several Triton instances may
    share it). None: the compiled tiers when this build has them (logged).

    Returns:
        keyword arguments for :func:`write_hps_json` (``gpucache``, ``volatile_db``, ``persistent_db``).
    """
    if native_tiers is None:
        native_tiers = _native_tiers_available()
        log.info("HPS demo config: %s", "compiled cache + parallel_hash_map tiers" if native_tiers
                 else "this build has no compiled cache / hash map: rocks_db tier only")
    if native_tiers:
        return dict(gpucache=True, volatile_db={"type": "parallel_hash_map", "initial_cache_rate": 1.0},
                    persistent_db={"type": "disabled"})
    from .server import ParameterServer
    out_dir = Path(out_dir)
    rdb = out_dir / "naive_dnn_rocksdb"
    fill = out_dir / ".hps_fill.json"
    write_hps_json(fill, sparse_dir, args, gpucache=False, volatile_db={"type": "disabled"},
                   persistent_db={"type": "rocks_db", "path": str(rdb), "read_only": False})
    ParameterServer(str(fill)).close()
    fill.unlink()
    return dict(gpucache=False, volatile_db={"type": "disabled"},
                persistent_db={"type": "rocks_db", "path": str(rdb), "read_only": True})
