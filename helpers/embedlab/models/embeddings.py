"""`FusedEmbedding`: one embedding table per categorical column, all looked up in one EmbedLab op."""
from __future__ import annotations

from typing import Sequence

import keras
import tensorflow as tf

from .. import ops, tables as _tables

__all__ = ["FusedEmbedding"]


@keras.saving.register_keras_serializable(package="embedlab")
class FusedEmbedding(keras.layers.Layer):
    """Tables of any sizes and widths, looked up together by `ops.fused_embedding_lookup`.

    The drop-in for a list of `keras.layers.Embedding` (one per categorical column): one compiled
    op for every table's forward, one for every table's backward, `IndexedSlices` gradients. With
    an `embedlab.optimizers` optimizer in `model.fit`, each table's update is fused into that
    backward (only the touched rows move).

    Args:
        vocabulary_sizes: rows of each table.
        dims: width of each table (one int for all, or one per table).
        combiner: "sum" or "mean" over a row's keys (ids with several keys per row, -1 padded).
        seed: initial values uniform(-0.05, 0.05), table j seeded with seed + j.

    Tables of 32 MiB and more live in their own 2 MiB-aligned huge-page mappings on the CPU
    (`embedlab.tables`), from creation and through training and Keras loading.

    Input: a list (or tuple) with one ids tensor per table, each int64 `[batch]` (one key per
    row) or `[batch, n]` padded with -1; keys lie in [0, vocabulary_sizes[j]).

    Returns (when called): a list of float32 `[batch, dims[j]]`.

    Example:
        >>> emb = FusedEmbedding([10, 4], dims=[3, 2])
        >>> [o.shape.as_list() for o in emb([tf.constant([1, 9]), tf.constant([0, 3])])]
        [[2, 3], [2, 2]]
    """

    def __init__(self, vocabulary_sizes: Sequence[int], dims, combiner: str = "sum", seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_sizes = [int(v) for v in vocabulary_sizes]
        n = len(self.vocabulary_sizes)
        self.dims = [int(dims)] * n if isinstance(dims, int) else [int(d) for d in dims]
        if n == 0 or len(self.dims) != n:
            raise ValueError(f"FusedEmbedding {self.name!r}: need one dim per table, got {len(self.dims)} dims "
                             f"for {n} tables")
        if min(self.vocabulary_sizes) < 1 or min(self.dims) < 1:
            raise ValueError(f"FusedEmbedding {self.name!r}: vocabulary sizes and dims must be >= 1")
        if combiner not in ("sum", "mean"):
            raise ValueError(f"FusedEmbedding {self.name!r}: combiner must be 'sum' or 'mean', got {combiner!r}")
        self.combiner, self.seed = combiner, int(seed)
        self.tables = [self.add_weight(name=f"table_{j}", shape=(v, d), dtype="float32",
                                       initializer=_tables.initializer(
                                           keras.initializers.RandomUniform(-0.05, 0.05, seed=self.seed + j)))
                       for j, (v, d) in enumerate(zip(self.vocabulary_sizes, self.dims))]
        self.built = True

    def call(self, ids):
        ids = list(ids)
        if len(ids) != len(self.tables):
            raise ValueError(f"FusedEmbedding {self.name!r}: got {len(ids)} ids tensors for {len(self.tables)} tables")
        ids = [tf.cast(i, tf.int64) if i.dtype != tf.int64 else i for i in map(tf.convert_to_tensor, ids)]
        return ops.fused_embedding_lookup(self.tables, ids, self.combiner)

    def load_own_variables(self, store):
        # Keras's loading (`load_model`, `load_weights`), with each table assigned through
        # `_tables.assign`: a large table stays in its aligned huge-page mapping.
        self._check_load_own_variables(store)
        for i, v in enumerate(self._trainable_variables + self._non_trainable_variables):
            _tables.assign(v, store[f"{i}"])

    def compute_output_shape(self, input_shape):
        return [(s[0], d) for s, d in zip(input_shape, self.dims)]

    def get_config(self):
        cfg = super().get_config()
        cfg.update(vocabulary_sizes=self.vocabulary_sizes, dims=self.dims, combiner=self.combiner, seed=self.seed)
        return cfg
