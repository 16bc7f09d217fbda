"""DeepFM on Criteo-style inputs, with the plugin embedding or native Keras embeddings.

Inputs (a dict, as `criteo_inputs` builds it):

* `"dense"`: float32 `[batch, dense_dim]` (the 13 integer features, normalized);
* `"sparse"`: int64 `[batch, slot_num, max_nnz]` global keys (per-slot offsets already
  added, as `embedlab.data.criteo.preprocess` writes them), -1 for padding.

Output: click probability, float32 `[batch, 1]`.

The model (Guo et al., 2017, in HugeCTR's layout): each key has a row of
`embedding_vec_size + 1` floats (HugeCTR's "10+1"): element 0 is its first-order weight, the
rest its factor vector. logit = first order (sum of the slots' weights + a linear term of
the dense features) + the FM second order (0.5 * sum((sum_s v_s)^2 - sum_s v_s^2)) + an MLP
over [the slots' factor vectors, the dense features].

`embedding="plugin"` uses `embedlab.plugin.EmbeddingLayer` (compiled fused lookup, sparse
gradients, optionally its own optimizer); `embedding="native"` uses
`keras.layers.Embedding` with -1 masked out and the same pooling. Both start from the same
per-key initial rows (`embedlab.plugin.initial_values`), so their losses are comparable.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import keras
import numpy as np
import tensorflow as tf

from .. import plugin

__all__ = ["DeepFM", "NativeSlotEmbedding", "criteo_inputs", "load_criteo_parquet"]


@keras.saving.register_keras_serializable(package="embedlab")
class NativeSlotEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` pooled per slot: `[batch, slots, max_nnz]` keys (-1 = none) -> `[batch, slots, dim]`.

    The baseline a Keras user would write: clamp -1 to row 0, gather with
    `keras.layers.Embedding`, zero the padded positions, and sum (or average) over max_nnz.

    Args:
        vocabulary_size, embedding_vec_size: table shape.
        combiner: "sum" or "mean".
        seed: per-key initial values as in the plugin layer (`plugin.initial_values`).

    Example:
        >>> NativeSlotEmbedding(10, 3)(tf.constant([[[1, -1]]], tf.int64)).shape
        TensorShape([1, 1, 3])
    """

    def __init__(self, vocabulary_size, embedding_vec_size, combiner="sum", seed=0, **kwargs):
        super().__init__(**kwargs)
        if combiner not in ("sum", "mean"):
            raise ValueError(f"NativeSlotEmbedding: combiner must be 'sum' or 'mean', got {combiner!r}")
        self.vocabulary_size, self.embedding_vec_size = int(vocabulary_size), int(embedding_vec_size)
        self.combiner, self.seed = combiner, int(seed)
        init = plugin.initial_values(np.arange(self.vocabulary_size), self.embedding_vec_size, self.seed)
        self.embedding = keras.layers.Embedding(
            self.vocabulary_size, self.embedding_vec_size,
            embeddings_initializer=lambda shape, dtype=None: tf.constant(init))

    def get_config(self):
        cfg = super().get_config()
        cfg.update(vocabulary_size=self.vocabulary_size, embedding_vec_size=self.embedding_vec_size,
                   combiner=self.combiner, seed=self.seed)
        return cfg

    def call(self, ids):
        ids = tf.convert_to_tensor(ids)
        valid = ids >= 0
        rows = self.embedding(tf.where(valid, ids, tf.zeros_like(ids)))
        mask = tf.cast(valid, rows.dtype)[..., None]
        pooled = tf.reduce_sum(rows * mask, axis=2)
        if self.combiner == "mean":
            pooled = pooled / tf.maximum(tf.reduce_sum(mask, axis=2), 1.0)
        return pooled


@keras.saving.register_keras_serializable(package="embedlab")
class DeepFM(keras.Model):
    """DeepFM click model over `{"dense": [b, dense_dim], "sparse": [b, slot_num, max_nnz]}`.

    Args:
        vocabulary_size: total keys over all slots (e.g. `sum(slot_size_array)`).
        slot_num: categorical slots (26 for Criteo).
        dense_dim: dense features (13 for Criteo).
        embedding_vec_size: factor size; rows hold embedding_vec_size + 1 floats.
        deep_layers: hidden sizes of the MLP.
        embedding: "plugin" (embedlab.plugin.EmbeddingLayer) or "native" (keras Embedding).
        combiner: "sum" or "mean" within a slot.
        max_nnz: keys per slot (1 for Criteo).
        embedding_optimizer: plugin only: an embedlab optimizer the embedding layer applies
            itself (None: the model's optimizer trains the table, through IndexedSlices).
        embedding_type, slot_size_array, devices: passed to the plugin layer.
        seed: initial rows of the embedding (same for both kinds) and of the dense layers.

    Saving: `model.save("m.keras")` and `keras.saving.load_model("m.keras")` (in any process
    that imports embedlab.models), and `model.export(dir)`, a SavedModel for serving whose
    `serve` endpoint takes `{"dense": float32 [b, dense_dim], "sparse": int64 [b, slot_num,
    max_nnz]}` (see `input_signature()`).

    Example:
        >>> import numpy as np, pandas as pd
        >>> from embedlab.data.criteo import CAT_COLUMNS, INT_COLUMNS
        >>> df = pd.DataFrame({"label": np.arange(8) % 2, **{c: np.arange(8) % 5 for c in CAT_COLUMNS},
        ...                    **{c: np.linspace(0, 1, 8) for c in INT_COLUMNS}})
        >>> import embedlab.optimizers
        >>> m = DeepFM(1000, slot_num=26, deep_layers=(64, 64))
        >>> m.compile(embedlab.optimizers.Adam(1e-3), "binary_crossentropy")
        >>> x, y = criteo_inputs(df)
        >>> len(m.fit(x, y, batch_size=4, verbose=0).history["loss"])
        1
    """

    def __init__(self, vocabulary_size: int, slot_num: int = 26, dense_dim: int = 13,
                 embedding_vec_size: int = 10, deep_layers: Sequence[int] = (400, 400, 400),
                 embedding: str = "plugin", combiner: str = "sum", max_nnz: int = 1,
                 embedding_optimizer=None, embedding_type: str = "distributed", slot_size_array=None,
                 devices=None, seed: int = 0, name: str = "deepfm", **kwargs):
        super().__init__(name=name, **kwargs)
        if embedding not in ("plugin", "native"):
            raise ValueError(f"DeepFM: embedding must be 'plugin' or 'native', got {embedding!r}")
        if embedding == "native" and embedding_optimizer is not None:
            raise ValueError("DeepFM: embedding_optimizer applies to embedding='plugin' only")
        self.vocabulary_size, self.slot_num, self.dense_dim = int(vocabulary_size), int(slot_num), int(dense_dim)
        self.embedding_vec_size, self.max_nnz = int(embedding_vec_size), int(max_nnz)
        self.embedding_kind, self.combiner = embedding, combiner
        self.deep_layers = tuple(int(u) for u in deep_layers)
        self.embedding_type, self.seed = embedding_type, int(seed)
        self.slot_size_array = None if slot_size_array is None else [int(n) for n in slot_size_array]
        self.embedding_optimizer = embedding_optimizer
        width = self.embedding_vec_size + 1
        if embedding == "plugin":
            self.embedding = plugin.EmbeddingLayer(
                self.vocabulary_size, width, self.slot_num, self.max_nnz, combiner=combiner,
                embedding_type=embedding_type, optimizer=embedding_optimizer,
                slot_size_array=slot_size_array, devices=devices, seed=seed, name="sparse_embedding")
        else:
            self.embedding = NativeSlotEmbedding(self.vocabulary_size, width, combiner=combiner, seed=seed,
                                                 name="sparse_embedding")
        init = lambda i: keras.initializers.GlorotUniform(seed=seed + i)  # noqa: E731
        self.dense_linear = keras.layers.Dense(1, kernel_initializer=init(100), name="dense_linear")
        self.deep = [keras.layers.Dense(u, activation="relu", kernel_initializer=init(i), name=f"deep_{i}")
                     for i, u in enumerate(deep_layers)]
        self.deep_out = keras.layers.Dense(1, kernel_initializer=init(101), name="deep_out")

    def get_config(self):
        cfg = super().get_config()
        opt = self.embedding_optimizer
        cfg.update(vocabulary_size=self.vocabulary_size, slot_num=self.slot_num, dense_dim=self.dense_dim,
                   embedding_vec_size=self.embedding_vec_size, deep_layers=list(self.deep_layers),
                   embedding=self.embedding_kind, combiner=self.combiner, max_nnz=self.max_nnz,
                   embedding_optimizer=None if opt is None else keras.optimizers.serialize(opt),
                   embedding_type=self.embedding_type, slot_size_array=self.slot_size_array, seed=self.seed)
        return cfg

    @classmethod
    def from_config(cls, config):
        """The model from `get_config()`'s dict (the embedding optimizer deserialized)."""
        config = dict(config)
        opt = config.pop("embedding_optimizer", None)
        if isinstance(opt, dict):
            opt = keras.optimizers.deserialize(opt)
        return cls(embedding_optimizer=opt, **config)

    def get_build_config(self):
        return {"dense_dim": self.dense_dim, "slot_num": self.slot_num, "max_nnz": self.max_nnz}

    def build_from_config(self, config):
        # Creates the dense layers' weights (the embedding's exist from __init__) with one forward
        # pass over an all-padding batch, so that a loaded model can take its saved weights.
        if not self.built:
            self({"dense": tf.zeros([1, self.dense_dim], tf.float32),
                  "sparse": tf.fill([1, self.slot_num, self.max_nnz], tf.constant(-1, tf.int64))})

    def input_signature(self) -> list:
        """The serving signature: one dict of `dense` float32 and `sparse` int64 keys."""
        return [{"dense": tf.TensorSpec([None, self.dense_dim], tf.float32, name="dense"),
                 "sparse": tf.TensorSpec([None, self.slot_num, self.max_nnz], tf.int64, name="sparse")}]

    @property
    def _default_save_signature(self):
        # Keras builds the default SavedModel signature of a subclassed model with one dtype
        # (float32) for every input; the keys are int64.
        @tf.function(input_signature=self.input_signature())
        def serving_default(inputs):
            return self(inputs)

        return serving_default

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """`keras.Model.export` with this model's typed signature (int64 keys) as the default."""
        if input_signature is None and format == "tf_saved_model":
            input_signature = self.input_signature()
        return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)

    def call(self, inputs, training=False):
        dense = tf.convert_to_tensor(inputs["dense"], tf.float32)
        e = self.embedding(inputs["sparse"])                       # [b, S, vec + 1]
        w, v = e[..., 0], e[..., 1:]
        first = tf.reduce_sum(w, axis=1, keepdims=True) + self.dense_linear(dense)
        s = tf.reduce_sum(v, axis=1)
        fm = 0.5 * tf.reduce_sum(tf.square(s) - tf.reduce_sum(tf.square(v), axis=1), axis=1, keepdims=True)
        h = tf.concat([tf.reshape(v, [-1, self.slot_num * self.embedding_vec_size]), dense], axis=1)
        for layer in self.deep:
            h = layer(h)
        return tf.sigmoid(first + fm + self.deep_out(h))


def criteo_inputs(df, slot_columns: Sequence[str] | None = None, dense_columns: Sequence[str] | None = None,
                  label: str = "label"):
    """Preprocessed Criteo columns -> (`{"dense", "sparse"}` inputs, labels).

    Args:
        df: a pandas DataFrame or pyarrow Table with `label`, `I1..I13` (float) and `C1..C26`
            (global int64 ids), as `embedlab.data.criteo.preprocess` writes them.
        slot_columns: categorical columns in slot order (default C1..C26).
        dense_columns: dense columns (default I1..I13).
        label: label column.

    Returns:
        `({"dense": float32 [n, 13], "sparse": int64 [n, slots, 1]}, float32 [n])`.

    Example:
        >>> import numpy as np, pandas as pd
        >>> from embedlab.data.criteo import CAT_COLUMNS, INT_COLUMNS
        >>> df = pd.DataFrame({"label": np.arange(8) % 2, **{c: np.arange(8) % 5 for c in CAT_COLUMNS},
        ...                    **{c: np.linspace(0, 1, 8) for c in INT_COLUMNS}})
        >>> x, y = criteo_inputs(df)
        >>> x["sparse"].shape, x["dense"].shape, y.shape
        ((8, 26, 1), (8, 13), (8,))
    """
    from ..data.criteo import CAT_COLUMNS, INT_COLUMNS
    slot_columns = list(slot_columns or CAT_COLUMNS)
    dense_columns = list(dense_columns or INT_COLUMNS)
    if hasattr(df, "to_pandas"):
        df = df.to_pandas()
    missing = [c for c in [label] + dense_columns + slot_columns if c not in df.columns]
    if missing:
        raise ValueError(f"criteo_inputs: columns {missing} not found (have {list(df.columns)[:8]}...)")
    dense = df[dense_columns].to_numpy(np.float32)
    sparse = df[slot_columns].to_numpy(np.int64)[:, :, None]
    return {"dense": dense, "sparse": sparse}, df[label].to_numpy(np.float32)


def load_criteo_parquet(dst, split: str = "train", max_rows: int | None = None):
    """Reads one split written by `embedlab.data.criteo.preprocess` into model inputs.

    Args:
        dst: the preprocess output folder.
        split: "train", "val" or "test".
        max_rows: keep only the first rows.

    Returns:
        `(inputs, labels, slot_size_array)`; see `criteo_inputs`.

    Example:
        >>> from embedlab.data import criteo
        >>> txt = criteo.generate("day.txt", rows=2000, seed=0, progress=False)
        >>> _ = criteo.preprocess(txt, "criteo_pq", progress=False)
        >>> x, y, sizes = load_criteo_parquet("criteo_pq", "val")
        >>> x["sparse"].shape[1:], len(sizes)      # C1..C26 and preprocess's two crosses
        ((28, 1), 28)
    """
    import pyarrow.parquet as pq

    from ..data.criteo import load_slot_sizes
    info = load_slot_sizes(dst)
    files = sorted((Path(dst) / split).glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"load_criteo_parquet: no parquet files in {Path(dst) / split}")
    import pyarrow as pa
    table = pa.concat_tables([pq.read_table(f) for f in files])
    if max_rows is not None:
        table = table.slice(0, max_rows)
    x, y = criteo_inputs(table, slot_columns=info["columns"])
    return x, y, list(info["slot_size_array"])
