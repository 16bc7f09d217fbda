"""Export a trained dense Keras model and its embedding table for the HPS and Triton (the steps of
HugeCTR's "HPS + Triton ensemble, 01 model training" workflow after training,
``hugectr_backend:hps_backend/samples/hps-triton-ensemble/01_model_training.ipynb``).

The served model: ``keys_per_sample`` int64 keys per sample are looked up in one table by the
HPS, their ``emb_vec_size`` vectors concatenated into ``[batch, keys_per_sample * emb_vec_size]``
(the dense model's ``input_width``) and fed to any dense Keras model ``[batch, input_width] ->
[batch, k]``. Keys, vectors and sizes are given explicitly; nothing here knows a particular model.

* :func:`dense_model`: trained Keras layers chained into their own dense model;
* :func:`save_dense_savedmodels`: the dense model as a SavedModel, plus a reshaping wrapper (HPS
  returns flat vectors);
* :func:`write_embedding`: the table as ``key`` / ``emb_vector`` (:func:`embedlab.sparse_model.write_sparse_model`);
* :func:`export_onnx`, :func:`check_onnx`: the dense model in ONNX (tf2onnx), checked with
  ``onnx.checker`` and onnxruntime;
* :func:`serving_tiers`, :func:`write_hps_json`: the HPS JSON and its tiers;
* :func:`build_inference_model`, :func:`compare_with_trained`: the inference model rebuilt with
  :class:`embedlab.hps.LookupLayer` over the HPS JSON, checked against the trained one;
* :func:`write_manifest`: ``serving.json``, the manifest :mod:`embedlab.serving` reads, with each
  file's size and SHA-256 (:func:`record_files`), which its readers check (:func:`verify_files`);
* :func:`export_model`: all of the above into one folder, atomically as a whole: the export is
  built in a hidden folder beside ``out_dir`` and swapped in only when complete, so a reader sees
  the previous export or the new one, never a mix (a killed export leaves the previous one intact;
  the next export removes its temporary).

Example:
    >>> import numpy as np
    >>> from embedlab.hps import export
    >>> tf = export._tf()
    >>> dense = tf.keras.Sequential([tf.keras.Input((3 * 4,)), tf.keras.layers.Dense(1)])
    >>> keys = np.arange(300, dtype=np.int64)
    >>> vectors = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    >>> m = export.export_model("served", dense, keys, vectors, model_name="tiny", keys_per_sample=3,
    ...                         max_batch_size=64)
    >>> m["model_name"], m["keys_per_sample"], m["checks"]["onnx_max_abs_diff"] < 1e-5
    ('tiny', 3, True)
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from .._io import atomic_dir, atomic_file
from ..sparse_model import write_sparse_model

log = logging.getLogger("embedlab.hps")

__all__ = ["dense_model", "save_dense_savedmodels", "export_onnx", "check_onnx", "write_embedding",
           "write_hps_json", "serving_tiers", "build_inference_model", "compare_with_trained",
           "serving_paths", "write_manifest", "export_model", "record_files", "verify_files",
           "ManifestFileError", "ONNX_INPUT", "ONNX_OUTPUT"]

ONNX_INPUT = "dense_input"
ONNX_OUTPUT = "logits"


def _tf():
    import tensorflow as tf
    return tf


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def dense_model(layers, input_width: int, *, name: str = "tf_dense_model"):
    """Trained Keras layers applied in order, as their own Keras model (the weights are shared).

    Args:
        layers: callables (Keras layers) applied one after another.
        input_width: the width of the model's input, ``[batch, input_width]`` float32, named
            ``dense_input`` (``ONNX_INPUT``).
        name: the Keras model's name.

    Returns:
        A ``tf.keras.Model`` ``[batch, input_width]`` -> the last layer's output.

    Example:
        >>> tf = _tf()
        >>> fc = [tf.keras.layers.Dense(8, activation="relu"), tf.keras.layers.Dense(1)]
        >>> dense_model(fc, 12).output_shape
        (None, 1)
    """
    tf = _tf()
    layers = list(layers)
    if not layers:
        raise ValueError("dense_model: layers is empty")
    x = tf.keras.Input(shape=(_positive("input_width", input_width),), dtype=tf.float32, name=ONNX_INPUT)
    y = x
    for layer in layers:
        y = layer(y)
    return tf.keras.Model(x, y, name=name)


def save_dense_savedmodels(dense, input_width: int, dense_path, reshape_path) -> None:
    """Saves the dense model and HugeCTR's reshaping wrapper as SavedModels, each atomically.

    Args:
        dense: a Keras model ``[batch, input_width]`` float32 -> ``[batch, k]``.
        input_width: its input width (``keys_per_sample * emb_vec_size``).
        dense_path: the dense SavedModel: signature input ``dense_input`` ``[batch, input_width]``
            -> ``logits``.
        reshape_path: the wrapper: input ``lookup_vectors`` (the HPS's flat vectors, float32 of any
            shape, reshaped to ``[batch, input_width]``) -> ``logits``.

    Example:
        >>> tf = _tf()
        >>> dense = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])
        >>> save_dense_savedmodels(dense, 6, "dense.model", "reshape.model")
        >>> f = tf.saved_model.load("reshape.model").signatures["serving_default"]
        >>> f(lookup_vectors=tf.zeros([12]))["logits"].shape
        TensorShape([2, 1])
    """
    tf = _tf()
    width = _positive("input_width", input_width)

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


def export_onnx(dense, input_width: int, path, opset: int = 13) -> dict:
    """Converts the dense model to ONNX with tf2onnx (dynamic batch), written atomically.

    Args:
        dense: a Keras model ``[batch, input_width]`` float32 -> ``[batch, k]``.
        input_width: its input width.
        path: the ``.onnx`` file to write.
        opset: the ONNX opset.

    Returns:
        ``{"input": "dense_input", "output": "logits"}``: the graph's input and output names.

    Example:
        >>> tf = _tf()
        >>> dense = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])
        >>> export_onnx(dense, 6, "dense.onnx")
        {'input': 'dense_input', 'output': 'logits'}
    """
    tf = _tf()
    import tf2onnx
    width = _positive("input_width", input_width)
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


def check_onnx(path, dense, inputs) -> float:
    """``onnx.checker`` on the file, then onnxruntime against TensorFlow on ``inputs``.

    Args:
        path: the ``.onnx`` file (from :func:`export_onnx`).
        dense: the Keras model it was converted from.
        inputs: float32 ``[batch, input_width]``: what the served dense model receives (the
            looked-up vectors of a batch, concatenated per sample).

    Returns:
        The max abs difference of the outputs (float32 summation order: about 1e-6).

    Example:
        >>> tf = _tf()
        >>> dense = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(1)])
        >>> _ = export_onnx(dense, 6, "dense.onnx")
        >>> check_onnx("dense.onnx", dense, np.ones((5, 6), np.float32)) < 1e-5
        True
    """
    import onnx
    import onnxruntime as ort
    x = np.ascontiguousarray(inputs, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"check_onnx: inputs must be [batch, input_width], got shape {list(x.shape)}")
    onnx.checker.check_model(onnx.load(str(path)))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    ref = dense(x).numpy()
    return float(np.max(np.abs(got - ref)))


def write_embedding(path, keys, vectors) -> Path:
    """Writes one table as HugeCTR's sparse model ``key`` / ``emb_vector`` (atomically).

    Args:
        path: the folder to write.
        keys: int64 ``[n]``, unique.
        vectors: float32 ``[n, emb_vec_size]``: row i is the vector of ``keys[i]``.

    Returns:
        ``path`` as a Path.

    Example:
        >>> p = write_embedding("t.model", np.arange(4), np.zeros((4, 2), np.float32))
        >>> sorted(f.name for f in p.iterdir())
        ['emb_vector', 'key']
    """
    return write_sparse_model(path, np.asarray(keys, dtype=np.int64), np.asarray(vectors, dtype=np.float32))


def _model_entry(model_name: str, sparse_files, emb_vec_sizes, keys_per_sample, max_batch_size: int,
                 table_names, default_values, gpucache: bool, gpucacheper: float) -> dict:
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"model_name must be a non-empty string, got {model_name!r}")
    sparse_files = [str(Path(f).resolve()) for f in sparse_files]
    n = len(sparse_files)
    if n == 0:
        raise ValueError("sparse_files is empty: the model needs at least one table")
    table_names = list(table_names) if table_names is not None else [f"sparse_embedding{i + 1}" for i in range(n)]
    default_values = list(default_values) if default_values is not None else [0.0] * n
    for name, seq in (("emb_vec_sizes", emb_vec_sizes), ("keys_per_sample", keys_per_sample),
                      ("table_names", table_names), ("default_values", default_values)):
        if len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries, sparse_files {n}: give one per table")
    return {
        "model": model_name,
        "sparse_files": sparse_files,
        "embedding_table_names": table_names,
        "embedding_vecsize_per_table": [_positive("emb_vec_sizes[]", d) for d in emb_vec_sizes],
        "maxnum_catfeature_query_per_table_per_sample": [_positive("keys_per_sample[]", k) for k in keys_per_sample],
        "default_value_for_each_table": [float(v) for v in default_values],
        "deployed_device_list": [0],
        "max_batch_size": _positive("max_batch_size", max_batch_size),
        "hit_rate_threshold": 0.9,
        "gpucacheper": gpucacheper,
        "gpucache": gpucache,
        "embedding_cache_type": "dynamic",
    }


def write_hps_json(path, *, model_name: str, sparse_files, emb_vec_sizes, keys_per_sample, max_batch_size: int,
                   table_names=None, default_values=None, gpucache: bool = True, gpucacheper: float = 0.5,
                   volatile_db: dict | None = None, persistent_db: dict | None = None) -> Path:
    """Writes HugeCTR's HPS JSON for one model (absolute paths), atomically.

    Args:
        path: the JSON file to write.
        model_name: the model's name in the HPS (``"model"``).
        sparse_files: one sparse-model folder per table (:func:`write_embedding`).
        emb_vec_sizes: each table's vector size.
        keys_per_sample: each table's keys per sample (``maxnum_catfeature_query_per_table_per_sample``).
        max_batch_size: the largest batch (samples) of a lookup.
        table_names: default ``sparse_embedding1``, ``sparse_embedding2``, ...
        default_values: each table's default value (for keys the model does not hold); default 0.0.
        gpucache, gpucacheper: the embedding cache and its share of the table.
        volatile_db, persistent_db: the tiers (default: ``parallel_hash_map`` filled with every
            row, no persistent tier).

    Returns:
        ``path`` as a Path.

    Example:
        >>> p = write_hps_json("hps.json", model_name="m", sparse_files=["m_sparse.model"], emb_vec_sizes=[16],
        ...                    keys_per_sample=[3], max_batch_size=1024)
        >>> json.loads(p.read_text())["models"][0]["embedding_table_names"]
        ['sparse_embedding1']
    """
    cfg = {
        "supportlonglong": True,
        "volatile_db": volatile_db or {"type": "parallel_hash_map", "initial_cache_rate": 1.0},
        "persistent_db": persistent_db or {"type": "disabled"},
        "models": [_model_entry(model_name, sparse_files, emb_vec_sizes, keys_per_sample, max_batch_size,
                                table_names, default_values, gpucache, gpucacheper)],
    }
    with atomic_file(Path(path)) as tmp:
        Path(tmp).write_text(json.dumps(cfg, indent=2) + "\n")
    return Path(path)


def _inference_module(ps_config_file: str, dense, model_name: str, table_id: int, emb_vec_size: int,
                      keys_per_sample: int, global_batch_size: int):
    tf = _tf()
    from .layers import LookupLayer

    class InferenceModel(tf.Module):
        """keys int64 ``[batch, keys_per_sample]`` -> ``{"logits": [batch, k], "embeddings": [batch, keys*dim]}``."""

        def __init__(self):
            super().__init__()
            self.lookup = LookupLayer(model_name, table_id, emb_vec_size, ps_config_file=str(ps_config_file),
                                      global_batch_size=global_batch_size)
            self.dense = dense

        @tf.function(input_signature=[tf.TensorSpec([None, keys_per_sample], tf.int64, name="keys")])
        def serve(self, keys):
            emb = tf.reshape(self.lookup(keys), [-1, keys_per_sample * emb_vec_size])
            return {"logits": self.dense(emb), "embeddings": emb}

    return InferenceModel()


def build_inference_model(ps_config_file, dense, *, model_name: str, emb_vec_size: int, keys_per_sample: int,
                          global_batch_size: int, table_id: int = 0, path=None):
    """The inference model: ``hps.LookupLayer`` over the HPS JSON + the dense model.

    Args:
        ps_config_file: the HPS JSON (:func:`write_hps_json`).
        dense: the dense Keras model ``[batch, keys_per_sample * emb_vec_size]`` -> ``[batch, k]``.
        model_name, table_id: the HPS model and the table the keys are looked up in.
        emb_vec_size, keys_per_sample: that table's sizes.
        global_batch_size: the lookup layer's batch size.
        path: when given, the model is saved there as a SavedModel (atomically), signature
            ``serving_default``: ``keys`` int64 ``[batch, keys_per_sample]`` -> ``logits``, ``embeddings``.

    Returns:
        The ``tf.Module``; ``serve(keys)`` runs it.

    Example (+SKIP: it needs a written HPS JSON; :func:`export_model` runs it):
        >>> m = build_inference_model("hps.json", dense, model_name="m", emb_vec_size=16,  # doctest: +SKIP
        ...                           keys_per_sample=3, global_batch_size=1024)
    """
    m = _inference_module(ps_config_file, dense, model_name, int(table_id), _positive("emb_vec_size", emb_vec_size),
                          _positive("keys_per_sample", keys_per_sample), _positive("global_batch_size", global_batch_size))
    if path is not None:
        with atomic_dir(path) as tmp:
            _tf().saved_model.save(m, str(tmp), signatures={"serving_default": m.serve})
    return m


def compare_with_trained(trained, infer, keys) -> dict:
    """MSE of the inference model's logits and embeddings against the trained model's.

    Args:
        trained: callable, keys ``[batch, keys_per_sample]`` -> ``(logits, embeddings)`` tensors.
        infer: the inference model (:func:`build_inference_model`).
        keys: int64 ``[batch, keys_per_sample]``.

    Returns:
        ``{"logits_mse": ..., "embeddings_mse": ...}``.

    Example (+SKIP: it needs a trained model and an inference model):
        >>> compare_with_trained(model, infer, keys)["logits_mse"] <= 1e-6  # doctest: +SKIP
        True
    """
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


def serving_tiers(out_dir, *, model_name: str, sparse_files, emb_vec_sizes, keys_per_sample, max_batch_size: int,
                  native_tiers: bool | None = None, **table_kw) -> dict:
    """The tiers to serve with: the compiled cache + ``parallel_hash_map`` (``native_tiers``), or a
    RocksDB at ``out_dir / f"{model_name}_rocksdb"`` filled here and opened read-only by the
    servers (several Triton instances may share it). None: the compiled tiers when this build has
    them (logged).

    Args:
        out_dir: where the RocksDB goes.
        model_name, sparse_files, emb_vec_sizes, keys_per_sample, max_batch_size, table_kw: the
            model, as for :func:`write_hps_json`.
        native_tiers: see above.

    Returns:
        keyword arguments for :func:`write_hps_json` (``gpucache``, ``volatile_db``, ``persistent_db``).

    Example:
        >>> serving_tiers(".", model_name="m", sparse_files=["m.model"], emb_vec_sizes=[16], keys_per_sample=[3],
        ...               max_batch_size=64, native_tiers=True)["volatile_db"]["type"]
        'parallel_hash_map'
    """
    if native_tiers is None:
        native_tiers = _native_tiers_available()
        log.info("HPS tiers: %s", "compiled cache + parallel_hash_map tiers" if native_tiers
                 else "this build has no compiled cache / hash map: rocks_db tier only")
    if native_tiers:
        return dict(gpucache=True, volatile_db={"type": "parallel_hash_map", "initial_cache_rate": 1.0},
                    persistent_db={"type": "disabled"})
    from .server import ParameterServer
    out_dir = Path(out_dir)
    rdb = out_dir / f"{model_name}_rocksdb"
    fill = out_dir / ".hps_fill.json"
    write_hps_json(fill, model_name=model_name, sparse_files=sparse_files, emb_vec_sizes=emb_vec_sizes,
                   keys_per_sample=keys_per_sample, max_batch_size=max_batch_size, gpucache=False,
                   volatile_db={"type": "disabled"},
                   persistent_db={"type": "rocks_db", "path": str(rdb), "read_only": False}, **table_kw)
    ParameterServer(str(fill)).close()
    fill.unlink()
    return dict(gpucache=False, volatile_db={"type": "disabled"},
                persistent_db={"type": "rocks_db", "path": str(rdb), "read_only": True})


def serving_paths(out_dir, model_name: str, ps_config_name: str | None = None) -> dict:
    """The absolute paths :func:`export_model` writes in ``out_dir`` (the manifest's file fields).

    Example:
        >>> sorted(serving_paths("out", "m"))[:3]
        ['dense_savedmodel', 'inference_savedmodel', 'onnx_file']
    """
    out = Path(out_dir).resolve()
    return {"ps_config_file": out / (ps_config_name or f"{model_name}.json"),
            "onnx_file": out / "dense.onnx",
            "dense_savedmodel": out / f"{model_name}_dense.model",
            "inference_savedmodel": out / f"{model_name}_inference.model",
            "reshape_dense_savedmodel": out / f"{model_name}_reshape_dense.model",
            "sparse_model": out / f"{model_name}_sparse.model"}


class ManifestFileError(ValueError):
    """A file that ``serving.json`` records is missing, or its size or SHA-256 differs from the
    record (an export was interrupted, or a file was changed after it); the message names it."""


# RocksDB rewrites its info log and lock file whenever a database is opened, read-only included:
# they are not part of the exported rows and are not recorded.
_UNRECORDED = re.compile(r"(?:^|/)(?:LOG|LOG\.old\.\d+|LOCK)$")
_HASH_CACHE: dict = {}      # absolute path -> (stat signature, sha256): each file hashed once while unchanged


def _sha256(path: Path) -> str:
    st = path.stat()
    sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    hit = _HASH_CACHE.get(str(path))
    if hit is not None and hit[0] == sig:
        return hit[1]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    _HASH_CACHE[str(path)] = (sig, h.hexdigest())
    return h.hexdigest()


def _record_key(folder: Path, path: Path) -> str:
    try:
        return path.relative_to(folder).as_posix()
    except ValueError:
        return str(path)        # a file outside the export's folder is recorded by its absolute path


def _walk(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(Path(d, f) for d, _dirs, files in os.walk(path) for f in files)
    return [path]


def record_files(folder, paths) -> dict:
    """Size and SHA-256 of every file of ``paths`` (files, or folders taken whole), for a manifest.

    Args:
        folder: the manifest's folder: files inside it are recorded by their path relative to it.
        paths: the files and folders to record.

    Returns:
        ``{"files": {name: {"size": bytes, "sha256": hex}}, "folders": [name, ...]}``: what
        :func:`verify_files` checks (a recorded folder must hold exactly its recorded files).

    Raises:
        FileNotFoundError: a path does not exist (named).

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.bin").write_bytes(b"abc")
        >>> record_files(d, [d / "a.bin"])["files"]["a.bin"]["size"]
        3
    """
    folder = Path(folder).resolve()
    files, folders = {}, []
    for p in (Path(x).resolve() for x in paths):
        if not p.exists():
            raise FileNotFoundError(f"record_files: {p} does not exist")
        if p.is_dir():
            folders.append(_record_key(folder, p))
        for f in _walk(p):
            key = _record_key(folder, f)
            if not _UNRECORDED.search(key):
                files[key] = {"size": f.stat().st_size, "sha256": _sha256(f)}
    return {"files": files, "folders": sorted(set(folders))}


def verify_files(folder, records: dict, *, where: str = "") -> None:
    """Checks the files a manifest recorded (:func:`record_files`): each exists with its size and
    SHA-256, and each recorded folder holds no other file. A file is hashed again only when its
    size, times or inode changed since this process last hashed it.

    Args:
        folder: the manifest's folder (recorded names are relative to it).
        records: the manifest's ``{"files": ..., "folders": ...}``.
        where: the manifest's path, for the messages.

    Raises:
        ManifestFileError: naming the manifest, the file and what differs.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); _ = (d / "a.bin").write_bytes(b"abc")
        >>> r = record_files(d, [d / "a.bin"]); _ = (d / "a.bin").write_bytes(b"abd")
        >>> verify_files(d, r)
        Traceback (most recent call last):
        ...
        embedlab.hps.export.ManifestFileError: ...a.bin: its SHA-256 ... differs from the recorded ...
    """
    folder = Path(folder).resolve()
    where = where or str(folder / "serving.json")
    head = f"{where}: the export is incomplete or mixed (an interrupted or concurrent export, or a file " \
           f"changed after it); export it again (notebook 05)"
    files = records.get("files") if isinstance(records, dict) else None
    if not isinstance(files, dict) or not files:
        raise ManifestFileError(f"{where}: no file records (size and SHA-256 of each exported file); "
                                "export it again with embedlab.hps.export (notebook 05)")
    for key, rec in files.items():
        p = Path(key) if os.path.isabs(key) else folder / key
        if not p.is_file():
            raise ManifestFileError(f"{head}. File {p} is missing")
        size = p.stat().st_size
        if size != rec.get("size"):
            raise ManifestFileError(f"{head}. File {p}: {size} bytes, the manifest recorded {rec.get('size')}")
        digest = _sha256(p)
        if digest != rec.get("sha256"):
            raise ManifestFileError(f"{head}. File {p}: its SHA-256 {digest[:16]}... differs from the recorded "
                                    f"{str(rec.get('sha256'))[:16]}...")
    for name in records.get("folders", []):
        d = Path(name) if os.path.isabs(name) else folder / name
        for f in _walk(d) if d.is_dir() else []:
            key = _record_key(folder, f)
            if key not in files and not _UNRECORDED.search(key):
                raise ManifestFileError(f"{head}. File {f} is not in the manifest's records of {d}")


def _manifest(out: Path, *, model_name: str, emb_vec_size: int, keys_per_sample: int, onnx_names: dict,
              checks: dict, tiers: dict, ps_config_name: str | None, extra: dict | None) -> dict:
    paths = {k: str(v) for k, v in serving_paths(out, model_name, ps_config_name).items()}
    return {
        "model_name": model_name,
        "ps_config_file": paths["ps_config_file"],
        "table_id": 0,
        "emb_vec_size": int(emb_vec_size),
        "slot_num": int(keys_per_sample),
        "keys_per_sample": int(keys_per_sample),
        "onnx_file": paths["onnx_file"],
        "onnx_input": onnx_names["input"],
        "onnx_output": onnx_names["output"],
        "dense_savedmodel": paths["dense_savedmodel"],
        "inference_savedmodel": paths["inference_savedmodel"],
        "reshape_dense_savedmodel": paths["reshape_dense_savedmodel"],
        "sparse_model": paths["sparse_model"],
        **(extra or {}),
        "tiers": {"gpucache": tiers["gpucache"], "volatile_db": tiers["volatile_db"]["type"],
                  "persistent_db": tiers["persistent_db"]["type"]},
        "checks": checks,
    }


def _recorded_paths(manifest: dict, built: Path, final: Path) -> list[Path]:
    """The files of an export (in ``built``; the manifest names them under ``final``): those the
    manifest names, and the HPS JSON's sparse files and RocksDB that lie in the export's folder."""
    def here(p) -> Path:
        p = Path(p)
        try:
            return built / p.relative_to(final)
        except ValueError:
            return p
    out = [here(manifest[k]) for k in ("ps_config_file", "onnx_file", "dense_savedmodel", "inference_savedmodel",
                                       "reshape_dense_savedmodel", "sparse_model")]
    cfg = json.loads(here(manifest["ps_config_file"]).read_text())
    for m in cfg.get("models", []):
        out += [here(f) for f in m.get("sparse_files", [])]
    per = cfg.get("persistent_db") or {}
    if per.get("type") == "rocks_db" and per.get("path"):
        out.append(here(per["path"]))
    seen, keep = set(), []
    for p in out:
        inside = p.resolve().is_relative_to(built.resolve())
        if p.exists() and inside and p.resolve() not in seen:
            seen.add(p.resolve())
            keep.append(p)
    return keep


def _write_manifest_file(manifest: dict, built: Path, final: Path) -> dict:
    for k in ("ps_config_file", "onnx_file", "dense_savedmodel", "inference_savedmodel", "sparse_model"):
        p = built / Path(manifest[k]).relative_to(final) if Path(manifest[k]).is_relative_to(final) \
            else Path(manifest[k])
        if not p.exists():
            raise FileNotFoundError(f"write_manifest: {k} {manifest[k]} does not exist; export it first")
    rec = record_files(built, _recorded_paths(manifest, built, final))
    manifest = {**manifest, "files": rec["files"], "folders": rec["folders"]}
    with atomic_file(built / "serving.json") as tmp:
        Path(tmp).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def write_manifest(out_dir, *, model_name: str, emb_vec_size: int, keys_per_sample: int, onnx_names: dict,
                   checks: dict, tiers: dict, ps_config_name: str | None = None, extra: dict | None = None) -> dict:
    """Writes ``serving.json``: the served model's sizes, the absolute paths of its files
    (:func:`serving_paths`) and each file's size and SHA-256 (``files``, ``folders``:
    :func:`record_files`), which :func:`embedlab.serving.load_manifest` reads and checks.

    Args:
        out_dir: the export folder.
        model_name, emb_vec_size, keys_per_sample: the served model and its table's sizes.
        onnx_names: :func:`export_onnx`'s return value.
        checks: numbers recorded under ``checks`` (e.g. :func:`check_onnx`'s difference).
        tiers: :func:`serving_tiers`'s return value (recorded by type).
        ps_config_name: the HPS JSON's file name (default ``{model_name}.json``).
        extra: more fields, recorded before ``tiers`` and ``checks``.

    Returns:
        The manifest dict.

    Raises:
        FileNotFoundError: a file the manifest names has not been written.

    Example (+SKIP: it needs the exported files; :func:`export_model` writes them):
        >>> write_manifest("out", model_name="m", emb_vec_size=16, keys_per_sample=3,  # doctest: +SKIP
        ...                onnx_names={"input": "dense_input", "output": "logits"}, checks={}, tiers=tiers)
    """
    out = Path(out_dir).resolve()
    m = _manifest(out, model_name=model_name, emb_vec_size=emb_vec_size, keys_per_sample=keys_per_sample,
                  onnx_names=onnx_names, checks=checks, tiers=tiers, ps_config_name=ps_config_name, extra=extra)
    return _write_manifest_file(m, out, out)


def _final_tiers(tiers: dict, built: Path, final: Path) -> dict:
    """``tiers`` with a RocksDB path under the build folder moved to the export's folder."""
    per = dict(tiers["persistent_db"])
    if per.get("path") and Path(per["path"]).is_relative_to(built):
        per["path"] = str(final / Path(per["path"]).relative_to(built))
    return {**tiers, "persistent_db": per}


def export_model(out_dir, dense, keys, vectors, *, model_name: str, keys_per_sample: int, max_batch_size: int,
                 ps_config_name: str | None = None, native_tiers: bool | None = None, check_keys=None,
                 trained=None, checks: dict | None = None, extra: dict | None = None) -> dict:
    """Writes everything serving needs for a dense Keras model over one embedding table.

    Into ``out_dir`` (:func:`serving_paths`): ``{model_name}_sparse.model/`` (``key`` /
    ``emb_vector``), the HPS JSON (``ps_config_name``, default ``{model_name}.json``, absolute
    paths), ``dense.onnx`` (input ``dense_input`` ``[batch, keys_per_sample * dim]``),
    ``{model_name}_dense.model/`` and ``{model_name}_reshape_dense.model/`` (SavedModels),
    ``{model_name}_inference.model/`` (``hps.LookupLayer`` + dense, keys ``[batch, keys_per_sample]``)
    and ``serving.json`` (:func:`write_manifest`, with each file's size and SHA-256).

    The export is atomic as a whole: it is built and checked in a hidden folder beside
    ``out_dir`` (the files name their final paths), then swapped in for the previous export in
    one rename. A reader sees the old export or the new one;
    an export that fails or is killed leaves the old one as it was, and the next export removes
    a killed one's folder. The folder is replaced whole: what was written from the previous
    export into it (a Triton repository, ``serve/``, ``triton.log``) goes with it.

    Args:
        out_dir: the folder (created).
        dense: a Keras model ``[batch, keys_per_sample * dim]`` float32 -> ``[batch, k]``.
        keys, vectors: the table: int64 ``[n]`` and float32 ``[n, dim]``.
        model_name: the model's name in the HPS and the files' prefix.
        keys_per_sample: keys looked up per sample.
        max_batch_size: the largest batch of a lookup.
        ps_config_name: the HPS JSON's file name.
        native_tiers: as for :func:`serving_tiers`.
        check_keys: int64 ``[batch, keys_per_sample]`` of the table's keys, for the checks; default
            257 samples drawn uniformly from ``keys`` (seed 1).
        trained: optional callable keys -> ``(logits, embeddings)`` (the trained model): its MSEs
            against the inference model are recorded (:func:`compare_with_trained`).
        checks: more numbers to record under the manifest's ``checks``.
        extra: more manifest fields.

    Returns:
        The manifest dict; ``checks`` holds ``onnx_max_abs_diff`` (ONNX against TensorFlow on the
        vectors of ``check_keys``), and ``logits_mse`` / ``embeddings_mse`` when ``trained`` is given.

    Example: see the module's.
    """
    from ._registry import shutdown
    keys = np.asarray(keys, dtype=np.int64)
    vectors = np.asarray(vectors, dtype=np.float32)
    if keys.ndim != 1 or vectors.ndim != 2 or len(keys) != len(vectors):
        raise ValueError(f"export_model: keys must be [n] and vectors [n, dim], got {list(keys.shape)} and "
                         f"{list(vectors.shape)}")
    k = _positive("keys_per_sample", keys_per_sample)
    dim = vectors.shape[1]
    if check_keys is None:
        check_keys = np.random.default_rng(1).choice(keys, size=(257, k))
    check_keys = np.asarray(check_keys, dtype=np.int64)
    order = np.argsort(keys)
    rows = order[np.minimum(np.searchsorted(keys, check_keys, sorter=order), len(keys) - 1)]
    if check_keys.ndim != 2 or check_keys.shape[1] != k or not np.array_equal(keys[rows], check_keys):
        raise ValueError(f"export_model: check_keys must be [batch, {k}] keys of the table, got shape "
                         f"{list(check_keys.shape)}")
    final = Path(out_dir).resolve()
    sizes = dict(model_name=model_name, emb_vec_sizes=[dim], keys_per_sample=[k], max_batch_size=max_batch_size)
    with atomic_dir(final) as built:
        built = Path(built)
        paths = serving_paths(built, model_name, ps_config_name)
        sparse = write_embedding(paths["sparse_model"], keys, vectors)
        save_dense_savedmodels(dense, k * dim, paths["dense_savedmodel"], paths["reshape_dense_savedmodel"])
        names = export_onnx(dense, k * dim, paths["onnx_file"])
        found = {"onnx_max_abs_diff": check_onnx(paths["onnx_file"], dense,
                                                 vectors[rows].reshape(len(check_keys), -1))}
        tiers = serving_tiers(built, sparse_files=[sparse], native_tiers=native_tiers, **sizes)
        # The checks run on an HPS JSON naming the files where they are now; the JSON and the
        # inference SavedModel that are kept name the files' final paths.
        ps = paths["ps_config_file"]
        check_ps = built / ".hps_check.json"
        write_hps_json(check_ps, sparse_files=[sparse], **sizes, **tiers)
        shutdown(str(check_ps))
        try:
            infer = build_inference_model(str(check_ps), dense, model_name=model_name, emb_vec_size=dim,
                                          keys_per_sample=k, global_batch_size=max_batch_size)
            if trained is not None:
                found.update(compare_with_trained(trained, infer, check_keys))
        finally:
            shutdown(str(check_ps))   # release the server (and its RocksDB) before the folder moves
        check_ps.unlink()
        final_ps = final / ps.name
        write_hps_json(ps, sparse_files=[final / sparse.relative_to(built)], **sizes,
                       **_final_tiers(tiers, built, final))
        build_inference_model(str(final_ps), dense, model_name=model_name, emb_vec_size=dim, keys_per_sample=k,
                              global_batch_size=max_batch_size, path=paths["inference_savedmodel"])
        manifest = _manifest(final, model_name=model_name, emb_vec_size=dim, keys_per_sample=k, onnx_names=names,
                             checks={**found, **(checks or {})}, tiers=tiers, ps_config_name=ps_config_name,
                             extra=extra)
        manifest = _write_manifest_file(manifest, built, final)
    return manifest

