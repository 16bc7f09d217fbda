"""Compiled embedding lookups for TensorFlow.

`embedding_lookup` and `fused_embedding_lookup` pool rows of float32 tables for int64 ids,
like `tf.nn.safe_embedding_lookup_sparse`, in one multi-threaded kernel (one launch for many
tables). Ids come as a `tf.RaggedTensor [batch, None]`, a `tf.SparseTensor [batch, max_nnz]`,
a dense `[batch, max_nnz]` tensor padded with -1, or an `embedlab.SparseInput` (the one
sparse-input type, made once from any of those); key -1 is skipped everywhere, 0 is a valid
key, and an empty row gives zeros.

The gradient with respect to a table is a `tf.IndexedSlices` holding each touched key once
(duplicates summed, keys ascending), computed deterministically. Tables may be `tf.Variable`s
(read in place, like `tf.nn.embedding_lookup`: no copy of the table), Keras variables, or
plain tensors. Per-key weights are inputs only: no gradient flows to them.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from . import _lookup, _native
from ._lookup import as_variable, is_dtype, resource_forward, sparse_inputs, training_lookup
from .sparse_input import SparseInput, as_csr

__all__ = ["embedding_lookup", "fused_embedding_lookup", "to_csr"]

_COMBINERS = ("sum", "mean")


# Loaded at import, so that a SavedModel using these ops can be restored right after
# `import embedlab.ops`, and a missing or mismatched library fails here with its fix.
_native.tf_ops()


def _lib():
    return _native.tf_ops()


def to_csr(ids, weights=None, where: str = "embedlab.ops"):
    """Converts ids (and weights shaped like them) to CSR tensors.

    Args:
        ids: `tf.RaggedTensor [batch, None]`, `tf.SparseTensor [batch, max_nnz]`, a dense
            `[batch, max_nnz]` (or `[batch]`, one key per row) tensor padded with -1, or an
            `embedlab.SparseInput`.
        weights: None, or float32 of the same kind and shape as `ids`.

    Returns:
        `(row_splits [batch + 1] int64, keys [nnz] int64, weights [nnz] float32 or None)`.

    A SparseTensor is converted by `EmbedLabSparseToCsr`: one pass to count rows, no copy when
    its entries are in row order (canonical order), a stable counting sort otherwise, so
    unordered COO input is fine. Pre-built CSR (ragged or dense input) skips even the pass.
    The same as `SparseInput.from_any(ids, weights)`'s `row_splits, keys, weights`.

    Example:
        >>> splits, keys, _ = to_csr(tf.ragged.constant([[3, 1], [], [7]], dtype=tf.int64))
        >>> splits.numpy().tolist(), keys.numpy().tolist()
        ([0, 2, 2, 3], [3, 1, 7])
    """
    x = SparseInput.from_any(ids, weights, where=where)
    return x.row_splits, x.keys, x.weights


def fused_embedding_lookup(tables: Sequence, ids: Sequence, combiners, weights=None, name=None, optimizer=None,
                           backward_trigger=None):
    """Pooled lookups of many tables in one kernel launch.

    Args:
        tables: list of float32 `[rows_t, dim_t]` tables: `tf.Variable`, Keras variables or tensors.
        ids: list (same length) of ids, each as accepted by `embedding_lookup`, or an
            `embedlab.SparseInput` (which carries its own weights). SparseTensor ids (and
            SparseInputs made from them) of CPU tables go to one op that converts and looks up.
        combiners: "sum" | "mean", or a list with one per table.
        weights: None, or a list of per-key float32 weights shaped like each ids (None entries allowed
            only if all are None).
        optimizer: None, or an `embedlab.optimizers` instance that trains these tables inside the
            backward pass (FBGEMM's "optimizer in backward", HugeCTR's embedding-owned optimizer):
            when a `GradientTape` differentiates through this lookup with respect to the tables,
            one compiled op per device sums each touched key's gradient and updates those rows
            in place, without creating `IndexedSlices` tensors, and advances
            `optimizer.iterations` by one. The tape then returns None for the tables (they are
            already updated): ask the tape for the tables' gradients (e.g.
            `tape.gradient(loss, tables + dense_vars)`), once per step, and apply only the
            other gradients. Same tables, bit for bit, as
            taking the gradient and calling `optimizer.apply_gradients`. Tables must be
            variables; use this optimizer instance for these tables only. The TensorFlow op
            has a CPU kernel only so far (the CUDA kernel, `lookup_backward_apply_cuda`, is in
            the core and the framework-free binding, not yet in the TF GPU adapter).
        backward_trigger: None, or (with `optimizer`) a trainable scalar float32 variable
            whose gradient runs the update, for tables the tape does not watch
            (non-trainable tables, HugeCTR's `bp_trigger`): ask the tape for its gradient
            (zero) instead of the tables'.

    Returns:
        list of `[batch_t, dim_t]` float32 tensors.

    Example:
        >>> t1, t2 = tf.Variable(tf.ones([10, 4])), tf.Variable(tf.ones([5, 2]))
        >>> outs = fused_embedding_lookup([t1, t2], [[[1, -1]], [[0, 4]]], "sum")
        >>> [o.shape.as_list() for o in outs]
        [[1, 4], [1, 2]]
    """
    where = "embedlab.ops.fused_embedding_lookup"
    tables, ids = list(tables), list(ids)
    n = len(tables)
    if n == 0 or len(ids) != n:
        raise ValueError(f"{where}: need one ids per table, got {n} tables and {len(ids)} ids")
    if isinstance(combiners, str):
        combiners = [combiners] * n
    combiners = list(combiners)
    if len(combiners) != n:
        raise ValueError(f"{where}: need one combiner per table, got {len(combiners)} for {n} tables")
    for c in combiners:
        if c not in _COMBINERS:
            raise ValueError(f"{where}: combiner must be 'sum' or 'mean', got {c!r}")
    if weights is not None:
        weights = list(weights)
        if len(weights) != n or any(w is None for w in weights):
            raise ValueError(f"{where}: weights must be None or one weights tensor per table")

    if backward_trigger is not None and optimizer is None:
        raise ValueError(f"{where}: backward_trigger is only used with an optimizer")

    with tf.name_scope(name or "embedlab_fused_lookup"):
        for t, table in enumerate(tables):
            if getattr(table, "is_dynamic", False):   # a sok.DynamicVariable is read by key, not by row
                raise ValueError(f"{where}: tables[{t}] is an embedlab.sok.DynamicVariable, whose rows are found by "
                                 "key: use sok.lookup_sparse or tf.nn.embedding_lookup(table, keys)")
        variables = [as_variable(t) for t in tables]
        if optimizer is not None:
            if not hasattr(optimizer, "apply_lookup_gradients"):
                raise ValueError(f"{where}: optimizer must be an embedlab.optimizers instance (SGD, Adagrad, "
                                 f"Adam, FTRL), got {type(optimizer).__name__}")
            if any(v is None for v in variables):
                raise ValueError(f"{where}: with an optimizer, every table must be a variable")
        if all(v is not None for v in variables):
            for v in variables:
                if not is_dtype(v.dtype, tf.float32):
                    raise ValueError(f"{where}: tables must be float32, got {v.dtype.name}")
            if optimizer is not None:
                return training_lookup(tables, ids, weights, combiners, [optimizer] * n, backward_trigger, where)
            forward = resource_forward(variables, ids, weights, combiners, where)
            _lookup.watch(variables)
            return forward([v.handle for v in variables])[0]
        inputs, weighted = sparse_inputs(ids, weights, where)
        csr = as_csr(inputs)
        tensors = []
        for t, table in enumerate(tables):
            table = tf.convert_to_tensor(table)
            if not is_dtype(table.dtype, tf.float32):
                raise ValueError(f"{where}: tables[{t}] must be float32, got {table.dtype.name}")
            if table.shape.rank not in (None, 2):
                raise ValueError(f"{where}: tables[{t}] must be [rows, dim], got shape {table.shape}")
            tensors.append(table)
        return _lib().embed_lab_fused_lookup(tensors, [c[0] for c in csr], [c[1] for c in csr],
                                             [c[2] for c in csr] if weighted else [],
                                             combiners=combiners)


def embedding_lookup(table, ids, combiner: str = "sum", weights=None, name=None):
    """Pooled embedding lookup of one table: `[batch, dim]`.

    Args:
        table: float32 `[rows, dim]` `tf.Variable`, Keras variable or tensor.
        ids: int64 keys as `tf.RaggedTensor [batch, None]`, `tf.SparseTensor [batch, max_nnz]`,
            or dense `[batch, max_nnz]` padded with -1. Keys must lie in [0, rows) or be -1.
        combiner: "sum" or "mean" (mean divides by the number of valid keys, or by the sum of
            their weights).
        weights: optional float32 per-key weights shaped like `ids`.

    Returns:
        `[batch, dim]` float32; empty rows are zeros. Differentiable in `table` (IndexedSlices).

    Raises:
        ValueError: wrong dtypes or shapes.
        tf.errors.InvalidArgumentError: keys out of range or inconsistent row splits (naming
            the op, the argument and the value).

    Example:
        >>> table = tf.Variable(tf.reshape(tf.range(8, dtype=tf.float32), [4, 2]))
        >>> embedding_lookup(table, tf.constant([[0, 3], [-1, -1]], tf.int64)).numpy().tolist()
        [[6.0, 8.0], [0.0, 0.0]]
    """
    return fused_embedding_lookup([table], [ids], [combiner], None if weights is None else [weights], name)[0]


def _table_grads(op, grads, splits, keys, weights, table_shapes):
    """IndexedSlices gradients of the tables of a lookup op, from the CSR ids it read."""
    grads = [tf.zeros_like(op.outputs[t]) if g is None else g for t, g in enumerate(grads)]
    res = _lib().embed_lab_fused_lookup_grad(grads, splits, keys, weights, combiners=op.get_attr("combiners"))
    return [tf.IndexedSlices(res.rows[t], res.unique_keys[t], table_shapes[t]) for t in range(len(grads))]


def _grad(op, grads, table_shapes):
    n, nw = op.get_attr("num_tables"), op.get_attr("num_weights")
    table_grads = _table_grads(op, grads, op.inputs[n:2 * n], op.inputs[2 * n:3 * n],
                               op.inputs[3 * n:3 * n + nw], table_shapes)
    return table_grads + [None] * (2 * n + nw)


def _variable_shapes(op, n):
    return [resource_variable_ops.variable_shape(op.inputs[t], out_type=tf.int64) for t in range(n)]


@tf.RegisterGradient("EmbedLabFusedLookup")
def _fused_lookup_grad(op, *grads):
    n = op.get_attr("num_tables")
    return _grad(op, grads, [tf.shape(op.inputs[t], out_type=tf.int64) for t in range(n)])


@tf.RegisterGradient("EmbedLabFusedResourceLookup")
def _fused_resource_lookup_grad(op, *grads):
    return _grad(op, grads, _variable_shapes(op, op.get_attr("num_tables")))


@tf.RegisterGradient("EmbedLabFusedResourceSparseLookup")
def _fused_resource_sparse_lookup_grad(op, *grads):
    # Inputs: tables, indices, values, dense_shape (n each), weights; outputs: the pooled rows,
    # then the CSR ids (row_splits, keys, weights) the gradient reads.
    n, nw = op.get_attr("num_tables"), op.get_attr("num_weights")
    table_grads = _table_grads(op, grads[:n], op.outputs[n:2 * n], op.outputs[2 * n:3 * n],
                               op.outputs[3 * n:3 * n + nw], _variable_shapes(op, n))
    return table_grads + [None] * (3 * n + nw)


tf.no_gradient("EmbedLabFusedLookupGrad")
tf.no_gradient("EmbedLabSparseToCsr")
