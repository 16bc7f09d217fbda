"""One Keras-RS feature's ids and weights as the `SparseInput` the fused lookup takes.

Keras-RS's semantics (its `EmbedReduce`): ids are dense (`[batch]`: one id per row, no
reduction; `[..., n]`: every entry is an id, the last axis is reduced), `tf.RaggedTensor
[batch, None]` or `tf.SparseTensor [batch, n]`; weights, when given, have the ids' form and
shape. Combiners: "sum" (`sum w e`), "mean" (`sum w e / sum w`) and "sqrtn"
(`sum w e / sqrt(sum w^2)`); on one-id-per-row dense input, mean and sqrtn ignore the weights
and sum multiplies by them. EmbedLab's kernels pool with sum and mean; sqrtn is the weighted
sum with each weight divided by its row's `sqrt(sum w^2)` (weights 1 when none are given).
A dense id -1 is "no id" (EmbedLab's padding; Keras-RS has none and would fail on it).

Truncation (Keras-RS's `FeatureConfig.input_shape`: "for ragged dimensions in the input, the
dimension provided here presents the maximum value; anything larger will be truncated"): with
`max_len` (the config's last input dimension), a ragged row keeps its first `max_len` ids and a
sparse row its entries in columns `< max_len`. Dense input is used as it is.
"""
from __future__ import annotations

import tensorflow as tf

from ..sparse_input import SparseInput

__all__ = ["feature_input", "row_ids", "COMBINERS"]

COMBINERS = ("sum", "mean", "sqrtn")


def _float_weights(w):
    if isinstance(w, tf.SparseTensor):
        return tf.SparseTensor(w.indices, tf.cast(w.values, tf.float32), w.dense_shape)
    if isinstance(w, tf.RaggedTensor):
        return tf.cast(w, tf.float32)
    return tf.cast(tf.convert_to_tensor(w), tf.float32)


def _rsqrt_rows(keys, weights, rows, nrows):
    """weights / sqrt(sum of the row's squared weights), over valid keys (>= 0) only."""
    w = tf.where(keys >= 0, weights, tf.zeros_like(weights))
    ss = tf.math.unsorted_segment_sum(tf.square(w), rows, nrows)
    scale = tf.where(ss > 0, tf.math.rsqrt(tf.where(ss > 0, ss, tf.ones_like(ss))), tf.zeros_like(ss))
    return w * tf.gather(scale, rows)


def row_ids(row_splits, nnz):
    """The row of each of `nnz` entries of CSR `row_splits`, with static shapes (XLA-compilable,
    unlike `tf.ragged.row_splits_to_segment_ids`): how many rows end at or before each entry.

    Example:
        >>> row_ids(tf.constant([0, 2, 2, 3], tf.int64), 3).numpy().tolist()
        [0, 0, 2]
    """
    ends = tf.math.unsorted_segment_sum(tf.ones_like(row_splits[1:]), row_splits[1:], nnz + 1)
    return tf.cumsum(ends)[:-1]


def feature_input(ids, weights, combiner: str, max_len=None, where: str = "embedlab.keras_rs",
                  static_shapes: bool = False):
    """A feature's ids (and weights) as `(SparseInput, kernel combiner, output leading shape)`.

    Args:
        ids: dense `[batch]` or `[..., n]` int ids, `tf.RaggedTensor [batch, None]` or
            `tf.SparseTensor [batch, n]`.
        weights: None, or float weights of the same form and shape as `ids`.
        combiner: "sum", "mean" or "sqrtn".
        max_len: None, or the most ids a ragged / sparse row keeps (see the module docstring).
        where: names the feature in error messages.
        static_shapes: truncate ragged / sparse rows by making the dropped ids -1 ("no id")
            instead of removing them, so that no shape depends on the ids' values (what XLA
            needs: ragged slicing has no XLA kernel, and `tf.sparse.retain`'s dynamic size
            cannot drive the XLA path's scatters).

    Returns:
        `(x, combiner, lead)`: `x` an `embedlab.SparseInput` of `rows` rows (weights folded in
        for sqrtn), `combiner` "sum" or "mean" for the kernel, and `lead` None (output
        `[rows, dim]`) or an int64 shape tensor: the output is `[*lead, dim]`.

    Raises:
        ValueError: an unknown combiner, rank-0 or ragged-rank > 1 ids, or weights of another form.

    Example:
        >>> x, c, lead = feature_input(tf.constant([[1, 2]]), None, "sqrtn")
        >>> c, [round(float(w), 4) for w in x.weights.numpy()]
        ('sum', [0.7071, 0.7071])
    """
    if combiner not in COMBINERS:
        raise ValueError(f"{where}: combiner must be one of {COMBINERS}, got {combiner!r}")
    if weights is not None:
        weights = _float_weights(weights)
    lead = None
    if isinstance(ids, tf.SparseTensor):
        if weights is not None and not isinstance(weights, tf.SparseTensor):
            raise ValueError(f"{where}: sparse ids need sparse weights, got {type(weights).__name__}")
        if ids.shape.rank not in (None, 2):
            raise ValueError(f"{where}: sparse ids must be [batch, n], got shape {ids.shape}")
        n = ids.shape[1] if ids.shape.rank == 2 else None
        if max_len is not None and (n is None or n > max_len):
            keep = ids.indices[:, 1] < max_len
            if static_shapes:
                values = tf.cast(ids.values, tf.int64)
                ids = tf.SparseTensor(ids.indices, tf.where(keep, values, -tf.ones_like(values)), ids.dense_shape)
            else:
                ids = tf.sparse.retain(ids, keep)
                if weights is not None:
                    weights = tf.sparse.retain(weights, keep)
        if combiner == "sqrtn":
            vals = weights.values if weights is not None else tf.ones_like(ids.values, tf.float32)
            w = _rsqrt_rows(tf.cast(ids.values, tf.int64), vals, ids.indices[:, 0], ids.dense_shape[0])
            weights, combiner = tf.SparseTensor(ids.indices, w, ids.dense_shape), "sum"
        return SparseInput.from_sparse(ids, weights, where=where), combiner, None
    if isinstance(ids, tf.RaggedTensor):
        if ids.ragged_rank != 1 or ids.shape.rank != 2:
            raise ValueError(f"{where}: ragged ids must be [batch, None] (ragged rank 1), got shape {ids.shape}")
        if weights is not None and not isinstance(weights, tf.RaggedTensor):
            raise ValueError(f"{where}: ragged ids need ragged weights, got {type(weights).__name__}")
        rows = None
        if static_shapes:
            splits = tf.cast(ids.row_splits, tf.int64)
            values = tf.cast(ids.values, tf.int64)
            rows = row_ids(splits, tf.shape(values)[0])
            if max_len is not None:
                position = tf.range(tf.shape(values, out_type=tf.int64)[0]) - tf.gather(splits, rows)
                ids = ids.with_values(tf.where(position < max_len, values, -tf.ones_like(values)))
        elif max_len is not None:
            ids = ids[:, :max_len]
            if weights is not None:
                weights = weights[:, :max_len]
        if combiner == "sqrtn":
            vals = weights.values if weights is not None else tf.ones_like(ids.values, tf.float32)
            w = _rsqrt_rows(tf.cast(ids.values, tf.int64), vals, ids.value_rowids() if rows is None else rows,
                            ids.nrows())
            weights, combiner = ids.with_values(w), "sum"
        return SparseInput.from_ragged(ids, weights, where=where), combiner, None
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        # Keras' Embedding casts non-integer ids (a model's float inputs) to int, as Keras-RS does.
        ids = tf.cast(ids, tf.int64)
    if weights is not None:
        if isinstance(weights, (tf.SparseTensor, tf.RaggedTensor)):
            raise ValueError(f"{where}: dense ids need dense weights, got {type(weights).__name__}")
        if weights.shape.rank != ids.shape.rank:
            raise ValueError(f"{where}: weights shape {weights.shape} does not match ids shape {ids.shape}")
    rank = ids.shape.rank
    if rank is None or rank == 0:
        raise ValueError(f"{where}: dense ids must have rank 1 or more, got shape {ids.shape}")
    if rank == 1:
        # One id per row, nothing reduced: mean and sqrtn give the row itself.
        ids = ids[:, None]
        if weights is not None:
            if combiner != "sum":
                weights = None
            else:
                weights = weights[:, None]
        combiner = "sum"
    elif rank > 2:
        shape = tf.shape(ids, out_type=tf.int64)
        lead = shape[:-1]
        ids = tf.reshape(ids, tf.stack([-1, shape[-1]]))
        if weights is not None:
            weights = tf.reshape(weights, tf.stack([-1, shape[-1]]))
    if combiner == "sqrtn":
        keys = tf.cast(ids, tf.int64)
        w = weights if weights is not None else tf.ones_like(ids, tf.float32)
        w = tf.where(keys >= 0, w, tf.zeros_like(w))
        norm = tf.sqrt(tf.reduce_sum(tf.square(w), axis=1, keepdims=True))
        weights = tf.math.divide_no_nan(w, norm)
        combiner = "sum"
    return SparseInput.from_dense(ids, weights, where=where), combiner, lead
