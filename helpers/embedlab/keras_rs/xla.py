"""`DistributedEmbedding`'s lookup and fused optimizers as XLA-compilable TensorFlow ops.

EmbedLab's lookups and fused updates are custom ops without XLA kernels. When the layer is
traced inside an XLA context (`tf.function(jit_compile=True)`, or anything TensorFlow compiles
with XLA), it runs these instead: a gather of the table rows and a segment sum per feature
(the same combiners, weights and truncation: the inputs are prepared by `inputs.feature_input`
as for the kernels), and, in the backward, each table's fused optimizer applied to the touched
rows with resource gathers and scatters (`apply_rows`): the same SGD / Adagrad / lazy Adam /
FTRL update, in the same float32 expression order, as `embedlab.optimizers`' kernels, on the
same variables (tables, slots, step counter). Results agree with the kernel path to float32
summation order (duplicate keys' gradients are summed in another order).

Every written row of a scatter is written with one value: entries that share a key compute the
same new row from the same summed gradient, and an entry with no key (-1) writes the row of
the smallest valid key of its table with that row's own new value (or, when the batch holds no
valid key, row 0 with its old value), so the scatters are deterministic.

Keys are not range-checked here: XLA clamps an out-of-range gather index (the kernels reject the
key with an error naming it), so check ids against `vocabulary_size` upstream when unsure.
"""
from __future__ import annotations

import logging

import tensorflow as tf
from tensorflow.python.ops import control_flow_util, resource_variable_ops

from .. import optimizers as _el
from .._lookup import as_variable
from .inputs import row_ids

__all__ = ["in_xla_context", "log_xla_once", "flat_ids", "pool", "entry_scales", "apply_rows"]

_log = logging.getLogger("embedlab.keras_rs")
_logged = []


def in_xla_context() -> bool:
    """True while ops are being built for XLA (inside `tf.function(jit_compile=True)`, or a
    function called from one).

    Example:
        >>> in_xla_context()
        False
        >>> tf.function(lambda: tf.constant(in_xla_context()), jit_compile=True)().numpy()
        True
    """
    if tf.executing_eagerly():
        return False
    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def log_xla_once(where: str):
    """Logs (once per process, INFO on the `embedlab.keras_rs` logger) that the layer runs as
    XLA ops."""
    if not _logged:
        _logged.append(True)
        _log.info("%s is traced under XLA (jit_compile=True): it runs as XLA-compilable TensorFlow ops "
                  "(gather, segment sums, resource scatters), not EmbedLab's custom kernels", where)


def flat_ids(x):
    """A `SparseInput` as flat COO tensors, with XLA-compilable ops only.

    Args:
        x: an `embedlab.SparseInput`.

    Returns:
        `(rows, keys, weights, nrows)`: int64 `[nnz]` row of each key, int64 `[nnz]` keys (-1:
        none), float32 `[nnz]` weights (1 where none are given) and the int64 row count.

    Example:
        >>> from embedlab.sparse_input import SparseInput
        >>> rows, keys, w, n = flat_ids(SparseInput.from_dense([[4, -1], [0, 2]]))
        >>> rows.numpy().tolist(), keys.numpy().tolist(), int(n)
        ([0, 0, 1, 1], [4, -1, 0, 2], 2)
    """
    if x.is_coo:
        indices, keys, shape, w = x.coo
        rows, nrows = indices[:, 0], shape[0]
    else:
        splits, keys, w = x.row_splits, x.keys, x.weights
        nrows = tf.shape(splits, out_type=tf.int64)[0] - 1
        rows = row_ids(splits, tf.shape(keys)[0])   # an int32 count: see apply_rows
    if w is None:
        w = tf.ones_like(keys, tf.float32)
    return rows, keys, w, nrows


def entry_scales(keys, weights, rows, nrows, combiner):
    """Each entry's factor in its row's pooled output: its weight ("sum") or its weight over its
    row's summed weights ("mean"); 0 for an entry with no key.

    Example:
        >>> entry_scales(tf.constant([1, 2, -1], tf.int64), tf.constant([1., 3., 5.]),
        ...              tf.constant([0, 0, 1], tf.int64), 2, "mean").numpy().tolist()
        [0.25, 0.75, 0.0]
    """
    w = tf.where(keys >= 0, weights, tf.zeros_like(weights))
    if combiner == "sum":
        return w
    if combiner != "mean":
        raise ValueError(f"embedlab.keras_rs.xla: combiner must be 'sum' or 'mean', got {combiner!r}")
    total = tf.math.unsorted_segment_sum(w, rows, nrows)
    return tf.math.divide_no_nan(w, tf.gather(total, rows))


def pool(gather_rows, rows, keys, scales, nrows):
    """`out[r] = sum over r's entries of scale * table[key]` with `gather_rows(clipped keys)`
    reading the table rows (a differentiable `tf.gather`, or a resource gather).

    Example:
        >>> t = tf.constant([[1.], [2.], [4.]])
        >>> pool(lambda k: tf.gather(t, k), tf.constant([0, 0, 1], tf.int64), tf.constant([1, 2, -1], tf.int64),
        ...      tf.constant([1., 1., 0.]), 2).numpy().tolist()
        [[6.0], [0.0]]
    """
    emb = gather_rows(tf.maximum(keys, 0))
    return tf.math.unsorted_segment_sum(emb * scales[:, None], rows, nrows)


def _targets(keys):
    """(target row of each entry, whether any key is valid): valid keys stay; entries with no
    key take the smallest valid key (the module docstring says why)."""
    valid = keys >= 0
    big = tf.constant(tf.int64.max, tf.int64)
    smallest = tf.reduce_min(tf.where(valid, keys, tf.fill(tf.shape(keys), big)))
    any_valid = smallest < big
    fallback = tf.where(any_valid, smallest, tf.constant(0, tf.int64))
    return tf.where(valid, keys, tf.fill(tf.shape(keys), fallback)), valid, any_valid


def _gather(var, idx):
    return resource_variable_ops.resource_gather(var.handle, idx, dtype=var.dtype)


def _scatter(var, idx, values):
    return resource_variable_ops.resource_scatter_update(var.handle, idx, values)


def apply_rows(optimizer, table, keys, grads):
    """Applies `optimizer`'s update to the rows of `table` that `keys` touch, with XLA-compilable
    ops: the gradient rows of each key are summed (duplicates once), then SGD / Adagrad / lazy
    Adam / FTRL updates the row and its slots (`optimizer.slot_variables`) as the fused kernels
    do (`embedlab.optimizers`). Does not advance `optimizer.iterations`.

    Args:
        optimizer: an `embedlab.optimizers` SGD, Adagrad, Adam or Ftrl, built for `table`.
        table: the `[rows, dim]` float32 table (tf.Variable or Keras variable).
        keys: int64 `[n]` keys (-1: none, ignored).
        grads: float32 `[n, dim]` gradient rows (any value where the key is -1).

    Example:
        >>> from embedlab.optimizers import SGD
        >>> v = tf.Variable(tf.ones([3, 1])); opt = SGD(0.5); opt.build([v])
        >>> _ = apply_rows(opt, v, tf.constant([2, -1, 2], tf.int64), tf.ones([3, 1]))
        >>> v.numpy()[:, 0].tolist()
        [1.0, 1.0, 0.0]
    """
    var = as_variable(table)
    target, valid, any_valid = _targets(keys)
    _, seg = tf.unique(target, out_idx=tf.int64)
    grads = tf.where(valid[:, None], grads, tf.zeros_like(grads))
    # An int32 segment count: XLA sizes a dynamic dimension (ids that tf.sparse.retain filtered) with it.
    g = tf.gather(tf.math.unsorted_segment_sum(grads, seg, tf.shape(target)[0]), seg)
    slots = optimizer.slot_variables(table)
    old = [_gather(v, target) for v in [var] + slots]
    new = _update(optimizer, g, *old)
    writes = []
    for v, o, n in zip([var] + slots, old, new):
        writes.append(_scatter(v, target, tf.where(any_valid, n, o)))
    return tf.group(writes)


def _update(opt, g, w, *slots):
    """The new (row, slots...) of `opt`'s step: the float32 expressions of the fused kernels
    (csrc/core/sparse_optimizer_cpu.cc), which follow Keras' own."""
    lr = tf.cast(opt.learning_rate, tf.float32)
    if isinstance(opt, _el.Ftrl):
        n, z = slots
        neg_p = -float(opt.learning_rate_power)

        def power(x):
            if neg_p == 0.5:
                return tf.sqrt(x)
            if neg_p == 0.0:
                return tf.ones_like(x)
            return tf.pow(x, neg_p)

        l1 = float(opt.l1_regularization_strength)
        two_l2 = 2.0 * (tf.constant(float(opt.l2_regularization_strength), tf.float32)
                        + float(opt.beta) / (2.0 * lr))
        gs = g + 2.0 * float(opt.l2_shrinkage_regularization_strength) * w
        n_new = n + g * g
        p_new = power(n_new)
        z = z + (gs - ((p_new - power(n)) / lr) * w)
        zc = tf.clip_by_value(z, -l1, l1)
        return (zc - z) / (p_new / lr + two_l2), n_new, z
    if isinstance(opt, _el.Adam):
        m, v = slots
        t = tf.cast(opt.iterations + 1, tf.float32)
        b1p = tf.pow(tf.constant(float(opt.beta_1), tf.float32), t)
        b2p = tf.pow(tf.constant(float(opt.beta_2), tf.float32), t)
        alpha = lr * tf.sqrt(1.0 - b2p) / (1.0 - b1p)
        m = m + (g - m) * (1.0 - float(opt.beta_1))
        v = v + (g * g - v) * (1.0 - float(opt.beta_2))
        return w - (m * alpha) / (tf.sqrt(v) + float(opt.epsilon)), m, v
    if isinstance(opt, _el.Adagrad):
        (acc,) = slots
        acc = acc + g * g
        return w - (lr * g) / tf.sqrt(acc + float(opt.epsilon)), acc
    if isinstance(opt, _el.SGD):
        return (w - g * lr,)
    raise ValueError(f"embedlab.keras_rs.xla: optimizer {type(opt).__name__} has no XLA update; "
                     "use embedlab.optimizers SGD, Adagrad, Adam or Ftrl")
