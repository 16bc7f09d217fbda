"""The served model's two steps in one process: HPS lookup, then onnxruntime.

This is what the ensemble computes, without a server: the oracle the tests compare the served
answers with, and the in-process baseline the serving benchmark measures the server against.
"""
from __future__ import annotations

import os

import numpy as np

from .repository import ServingManifest, load_manifest, verify_manifest_files

__all__ = ["InProcessModel", "TFInferenceModel", "table_keys", "sample_keys", "labeled_samples"]


class InProcessModel:
    """`embedlab.hps.ParameterServer` + an onnxruntime session over an exported model.

    The manifest's recorded files are checked first (size and SHA-256): an interrupted or mixed
    export raises `embedlab.hps.export.ManifestFileError` naming the file.

    Args:
        manifest: a `ServingManifest` or the path of `serving.json` / its folder.
        threads: onnxruntime intra-op threads (default: all cores).

    Example:
        >>> import tensorflow as tf
        >>> from embedlab.hps import export
        >>> dense = tf.keras.Sequential([tf.keras.Input((3 * 16,)), tf.keras.layers.Dense(1)])
        >>> vectors = np.random.default_rng(0).standard_normal((3000, 16)).astype(np.float32)
        >>> _ = export.export_model("hps_triton", dense, np.arange(3000), vectors, model_name="tiny",
        ...                         keys_per_sample=3, max_batch_size=256)   # a dense model + its table
        >>> model = InProcessModel("hps_triton")
        >>> model.lookup(np.array([[1, 1001, 2001]])).shape     # keys -> the HPS's vectors
        (1, 3, 16)
        >>> model.predict(np.array([[1, 1001, 2001]])).shape    # -> the dense model's logit
        (1, 1)
    """

    def __init__(self, manifest, *, threads: int | None = None):
        import onnxruntime as ort
        from embedlab.hps import ParameterServer
        self.manifest = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
        m = self.manifest
        verify_manifest_files(m)      # a manifest loaded earlier: its files may have changed since
        self.ps = ParameterServer(m.ps_config_file)
        so = ort.SessionOptions()
        so.intra_op_num_threads = int(threads or os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        # The served dense model's settings (no spin-waiting), so both sides run the same way.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(m.onnx_file, sess_options=so, providers=["CPUExecutionProvider"])
        shape = next(i.shape for i in self.session.get_inputs() if i.name == m.onnx_input)
        self._tail = tuple(int(d) for d in shape[1:])

    def lookup(self, keys) -> np.ndarray:
        """int64 [batch, keys_per_sample] -> float32 [batch, keys_per_sample, emb_vec_size]."""
        keys = np.asarray(keys)
        m = self.manifest
        if keys.dtype != np.int64 or keys.ndim != 2 or keys.shape[1] != m.keys_per_sample:
            raise ValueError(f"keys must be int64 [batch, {m.keys_per_sample}], got {keys.dtype} {list(keys.shape)}")
        v = self.ps.lookup(m.model_name, m.table_id, keys.reshape(-1))
        return v.reshape(keys.shape[0], m.keys_per_sample, m.emb_vec_size)

    def dense(self, vectors) -> np.ndarray:
        """float32 [batch, keys_per_sample, emb_vec_size] -> the dense model's output [batch, k]."""
        x = np.ascontiguousarray(vectors, dtype=np.float32).reshape((len(vectors),) + self._tail)
        y = self.session.run([self.manifest.onnx_output], {self.manifest.onnx_input: x})[0]
        return np.asarray(y, np.float32).reshape(len(vectors), -1)

    def predict(self, keys) -> np.ndarray:
        """Both steps: what the served `ensemble` returns as DENSE_OUTPUT."""
        return self.dense(self.lookup(keys))

    def close(self) -> None:
        self.ps.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def table_keys(manifest) -> np.ndarray:
    """The keys of the served table (from the sparse model the HPS JSON names)."""
    import json
    from embedlab.sparse_model import read_sparse_model
    m = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
    cfg = json.loads(open(m.ps_config_file).read())
    models = [x for x in cfg.get("models", []) if x.get("model") == m.model_name]
    if not models:
        raise ValueError(f"{m.ps_config_file} has no model {m.model_name!r}")
    files = models[0].get("sparse_files", [])
    if m.table_id >= len(files):
        raise ValueError(f"{m.ps_config_file}: model {m.model_name!r} has no table {m.table_id}")
    return np.asarray(read_sparse_model(files[m.table_id], dim=m.emb_vec_size, mmap=True).keys)


def sample_keys(manifest, batch: int, rng, keys: np.ndarray | None = None) -> np.ndarray:
    """int64 [batch, keys_per_sample] like the model's data: slot s drawn uniformly from
    `vocabulary_range_per_slot[s]` when the manifest has it (one key per slot), else every key
    drawn uniformly from the served table's keys."""
    m = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
    ranges = m.extra.get("vocabulary_range_per_slot")
    if ranges and len(ranges) == m.keys_per_sample:
        return np.stack([rng.integers(lo, hi, batch) for lo, hi in ranges], axis=1).astype(np.int64)
    pool = table_keys(m) if keys is None else keys
    return rng.choice(pool, size=(batch, m.keys_per_sample)).astype(np.int64)


def labeled_samples(manifest, n: int, rng, sampler) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of the training data's distribution, for scoring the served model (AUC).

    Args:
        manifest: a `ServingManifest` or the path of `serving.json` / its folder; its ``data``
            field describes the distribution the training data came from (the export recorded it).
        n: the number of samples.
        rng: a NumPy Generator.
        sampler: callable ``(data, n, rng) -> (keys, labels)`` that draws from that distribution.

    Returns:
        keys int64 [n, keys_per_sample] and labels float32 [n, 1].

    Raises:
        ValueError: the manifest has no ``data``, or the sampler's keys do not fit the model.

    Example:
        >>> from embedlab.serving import load_manifest
        >>> m = load_manifest("hps_triton")                      # doctest: +SKIP
        >>> def coin(data, n, rng):                              # every key of the table, label a coin flip
        ...     return rng.integers(0, 3000, (n, 3)), (rng.random((n, 1)) < 0.5).astype(np.float32)
        >>> keys, labels = labeled_samples(m, 4, np.random.default_rng(0), coin)   # doctest: +SKIP
    """
    m = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
    spec = m.extra.get("data")
    if spec is None:
        raise ValueError(f"{m.path} has no 'data' (the distribution the training data came from): "
                         "export it with one (notebook 05 does)")
    keys, labels = sampler(spec, int(n), rng)
    keys, labels = np.asarray(keys, np.int64), np.asarray(labels, np.float32)
    if keys.ndim != 2 or keys.shape[1] != m.keys_per_sample:
        raise ValueError(f"{m.path}: its sampler draws keys of shape {list(keys.shape)}, the model takes "
                         f"{m.keys_per_sample} per sample")
    return keys, labels


class TFInferenceModel:
    """The exported TensorFlow inference SavedModel (`hps.LookupLayer` + the dense model,
    :func:`embedlab.hps.export.build_inference_model`).

    Its `serving_default` signature takes `keys` int64 [batch, slot_num] and returns `logits`
    (and `embeddings`); the HPS layer initialises itself from the `ps_config_file` saved in it.
    The HPS op library and its lookup callback are registered before the SavedModel loads.
    """

    def __init__(self, manifest, output: str = "logits"):
        import embedlab
        from embedlab.hps import register_tf_callback
        tf = embedlab.import_tensorflow()     # without TensorFlow's C++ start-up banner
        register_tf_callback()     # loads the op library (EmbedLabHpsLookup) and its lookup callback
        self.manifest = manifest if isinstance(manifest, ServingManifest) else load_manifest(manifest)
        self._tf = tf
        self.model = tf.saved_model.load(self.manifest.inference_savedmodel)
        self.signature = self.model.signatures["serving_default"]
        self._input = list(self.signature.structured_input_signature[1].keys())[0]
        outs = list(self.signature.structured_outputs.keys())
        if output not in outs:
            raise ValueError(f"{self.manifest.inference_savedmodel}: no output {output!r} (it has {outs})")
        self.output = output

    def predict(self, keys) -> np.ndarray:
        """int64 [batch, slot_num] -> the model's logits as float32 [batch, 1]."""
        out = self.signature(**{self._input: self._tf.constant(np.asarray(keys, np.int64))})
        return out[self.output].numpy()
