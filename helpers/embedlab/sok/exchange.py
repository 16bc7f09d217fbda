"""The only place where embedlab.sok moves data between workers.

Two collectives over the workers of the strategy, run on each worker's own device:

* `all_gather(x)`: every worker's `x` (same shape everywhere), stacked `[n, ...]`.
* `all_to_all(x)`: `x` is `[n, ...]`; row i goes to worker i, and row i of the result came
  from worker i. Differentiable: its gradient is the all-to-all of the incoming gradient.

On CPUs (and wherever nothing faster is available) they are TensorFlow's own collectives,
`CollectiveGatherV2` and the generic `CollectiveAllToAllV2`, over the gRPC channels of
`MultiWorkerMirroredStrategy`. Their rules shape the callers: every worker sends the same
shape (so counts go first, then everything is padded to the largest), a collective instance
cannot change shape (so each call draws fresh instance keys), and a zero-element collective
crashes the process (so sizes are at least 1; see `_at_least_one`). On GPUs an NCCL all-to-all
can replace `_all_to_all_raw` here without touching the callers.

Timeouts: every collective gives up after `init(timeout=...)` seconds (the launcher's
`--collective-timeout`), raising `DeadlineExceededError`; after any collective error the
process must be restarted (TensorFlow aborts the collective executor).
"""
from __future__ import annotations

import tensorflow as tf

from . import _context

__all__ = ["all_gather", "all_to_all", "all_gather_varying"]


def _at_least_one(x: tf.Tensor, where: str) -> None:
    if x.shape.num_elements() == 0:
        raise ValueError(f"embedlab.sok.exchange.{where}: a zero-element collective would crash the process")


def _collective(op, x, key):
    """One TensorFlow V2 collective (`op`, e.g. CollectiveGatherV2) over the job's workers."""
    ctx = _context.context()
    with tf.device(ctx.device):
        return op(input=x, group_size=ctx.world_size, group_key=_context.GROUP_KEY, instance_key=key,
                  ordering_token=[], communication_hint="auto", timeout_seconds=ctx.timeout)


def _all_gather_raw(x, key):
    return _collective(tf.raw_ops.CollectiveGatherV2, x, key)


def _all_to_all_raw(x, key):
    return _collective(tf.raw_ops.CollectiveAllToAllV2, x, key)


def all_gather(x: tf.Tensor, key=None) -> tf.Tensor:
    """`[n, *x.shape]`: x of every worker, in rank order. Same shape on every worker; not
    differentiable. `key`: an instance key from `_context.draw_keys()` (+ offset), drawn if None."""
    x = tf.convert_to_tensor(x)
    ctx = _context.context()
    if ctx.world_size == 1:
        return x[None]
    _at_least_one(x, "all_gather")
    key = _context.draw_keys() if key is None else key
    g = _all_gather_raw(x[None], key)   # gathers along axis 0
    return tf.reshape(g, tf.concat([[ctx.world_size], tf.shape(x)], 0))


def all_to_all(x: tf.Tensor, key=None, grad_key=None) -> tf.Tensor:
    """All-to-all of `x [n, ...]` (row i to worker i). Differentiable in x: the gradient is sent
    back by another all-to-all with instance key `grad_key`. Same shape on every worker."""
    x = tf.convert_to_tensor(x)
    ctx = _context.context()
    if ctx.world_size == 1:
        return x
    _at_least_one(x, "all_to_all")
    if key is None:
        key = _context.draw_keys()
        grad_key = key + 1
    if not x.dtype.is_floating:
        return _all_to_all_raw(x, key)

    @tf.custom_gradient
    def exchange(v):
        def grad(dy):
            return _all_to_all_raw(tf.convert_to_tensor(dy), grad_key)
        return _all_to_all_raw(v, key), grad

    return exchange(x)


def all_gather_varying(x: tf.Tensor) -> list:
    """Every worker's x, whose first dimension may differ between workers: a list of n tensors.
    Two collectives (the sizes, then the rows padded to the largest). Eager or graph."""
    x = tf.convert_to_tensor(x)
    ctx = _context.context()
    if ctx.world_size == 1:
        return [x]
    key = _context.draw_keys()
    rows = tf.shape(x, out_type=tf.int64)[0]
    sizes = all_gather(tf.reshape(rows, [1]), key)[:, 0]
    m = tf.maximum(tf.reduce_max(sizes), 1)
    pad = tf.concat([[[0, m - rows]], tf.zeros([tf.rank(x) - 1, 2], tf.int64)], 0)
    padded = tf.pad(x, pad)
    g = all_gather(padded, key + 1)
    return [g[i, :sizes[i]] for i in range(ctx.world_size)]
