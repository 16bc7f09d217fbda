"""The few Horovod calls that SOK's examples and tests make, over embedlab.sok's collectives.

SparseOperationKit's code runs under `horovodrun -np N` and calls `horovod.tensorflow`; here the
workers are `python -m embedlab.sok.launch -n N` processes of a `MultiWorkerMirroredStrategy`,
so `import embedlab.sok.compat.horovod as hvd` in place of `import horovod.tensorflow as hvd` gives
that code the same answers::

    init()  rank()  size()  local_rank()  local_size()  shutdown()
    allreduce(tensor, average=None, op=None)    Sum / Average (default) / Min / Max; an
                                                `IndexedSlices` is all-gathered, as Horovod does
    allgather(tensor)                           first dimensions may differ between workers
    broadcast(tensor, root_rank)   broadcast_variables(variables, root_rank)
    DistributedGradientTape(tape, op=Average)   gradients all-reduced

Every call is a collective (every worker must make it, in the same order), eager or inside a
`tf.function`. Reductions add the workers' tensors in rank order, so every worker gets the same
bits. Not provided: Horovod's process sets, compression, `join`, elastic training and its
Keras callbacks; `local_rank()` is the rank (one machine per launcher; several machines run one
worker each).
"""
from __future__ import annotations

import tensorflow as tf

from .. import _context, exchange

__all__ = ["init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size", "allreduce", "allgather",
           "broadcast", "broadcast_variables", "DistributedGradientTape", "Average", "Sum", "Min", "Max", "Adasum"]

# Horovod's ReduceOp values
Average, Sum, Adasum, Min, Max = 0, 1, 2, 3, 4
_OPS = {Average: "Average", Sum: "Sum", Min: "Min", Max: "Max"}

_initialized = False


def init(*args, **kwargs):
    """Joins the job (`embedlab.sok.init()`: the strategy from the launcher's TF_CONFIG)."""
    global _initialized
    if args or any(v is not None for v in kwargs.values()):
        raise ValueError("embedlab.sok.compat.horovod.init: process sets and communicators are not supported; "
                         "call init()")
    _context.init()
    _initialized = True


def shutdown():
    """Nothing to release (the strategy lives as long as the process)."""


def is_initialized() -> bool:
    return _initialized


def rank() -> int:
    return _context.context().rank


def size() -> int:
    return _context.context().world_size


def local_rank() -> int:
    return _context.context().rank


def local_size() -> int:
    return _context.context().world_size


def _op_of(average, op, where):
    if average is not None and op is not None:
        raise ValueError(f"embedlab.sok.compat.horovod.{where}: give op or average, not both")
    if op is None:
        op = Average if average is None or average else Sum
    if op not in _OPS:
        raise ValueError(f"embedlab.sok.compat.horovod.{where}: op {op!r} is not supported (Sum, Average, Min, Max)")
    return op


def _gather_any_dtype(x):
    """all_gather of x (same shape everywhere) for any dtype the collectives lack (bool)."""
    if x.dtype == tf.bool:
        return tf.cast(exchange.all_gather(tf.cast(x, tf.int32)), tf.bool)
    return exchange.all_gather(x)


def allreduce(tensor, average=None, device_dense="", device_sparse="", compression=None, op=None, name=None,
              prescale_factor=1.0, postscale_factor=1.0, **kwargs):
    """The reduction of `tensor` over the workers (default: the average, as Horovod).

    An `IndexedSlices` (a sparse gradient) is all-gathered: values and indices of every worker
    concatenated in rank order (values divided by the number of workers for Average).
    """
    op = _op_of(average, op, "allreduce")
    n = size()
    if isinstance(tensor, tf.IndexedSlices):
        if op not in (Sum, Average):
            raise ValueError("embedlab.sok.compat.horovod.allreduce: an IndexedSlices can only be summed or averaged")
        values = tf.concat(exchange.all_gather_varying(tensor.values * prescale_factor), 0)
        indices = tf.concat(exchange.all_gather_varying(tensor.indices), 0)
        if op == Average:
            values = values / tf.cast(n, values.dtype)
        return tf.IndexedSlices(values * postscale_factor, indices, tensor.dense_shape)
    x = tf.convert_to_tensor(tensor)
    if prescale_factor != 1.0:
        x = x * tf.cast(prescale_factor, x.dtype)
    if n == 1:
        out = tf.identity(x)
    else:
        g = _gather_any_dtype(x)
        if op in (Sum, Average):
            out = g[0]
            for i in range(1, n):          # rank order: the same bits on every worker
                out = out + g[i]
            if op == Average:
                out = out / n if x.dtype.is_floating else out // n
        elif op == Min:
            out = tf.reduce_min(g, axis=0)
        else:
            out = tf.reduce_max(g, axis=0)
    if postscale_factor != 1.0:
        out = out * tf.cast(postscale_factor, out.dtype)
    return out


def allgather(tensor, name=None, **kwargs):
    """Every worker's tensor concatenated along the first dimension (sizes may differ)."""
    x = tf.convert_to_tensor(tensor)
    if x.shape.rank == 0:
        raise ValueError("embedlab.sok.compat.horovod.allgather: the tensor needs at least one dimension")
    if size() == 1:
        return tf.identity(x)
    return tf.concat(exchange.all_gather_varying(x), 0)


def broadcast(tensor, root_rank, name=None, **kwargs):
    """Worker `root_rank`'s tensor, on every worker (the shape must be the same everywhere)."""
    n = size()
    if not 0 <= int(root_rank) < n:
        raise ValueError(f"embedlab.sok.compat.horovod.broadcast: root_rank {root_rank} is outside 0..{n - 1}")
    x = tf.convert_to_tensor(tensor)
    if n == 1:
        return tf.identity(x)
    return _gather_any_dtype(x)[int(root_rank)]


def broadcast_variables(variables, root_rank, **kwargs):
    """Assigns worker `root_rank`'s values to these variables on every worker."""
    ops = [v.assign(broadcast(v.read_value() if hasattr(v, "read_value") else v, root_rank)) for v in variables]
    return tf.group(ops) if not tf.executing_eagerly() else None


class DistributedGradientTape:
    """A `tf.GradientTape` whose `gradient()` all-reduces every gradient (average by default)."""

    def __init__(self, gradtape, device_dense="", device_sparse="", compression=None, sparse_as_dense=False,
                 op=Average, **kwargs):
        self._tape = gradtape
        self._op = _op_of(None, op, "DistributedGradientTape")
        self._sparse_as_dense = sparse_as_dense

    def __getattr__(self, name):
        return getattr(self._tape, name)

    def gradient(self, target, sources, output_gradients=None, **kwargs):
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        single = not isinstance(grads, (list, tuple))
        out = []
        for g in ([grads] if single else grads):
            if g is None:
                out.append(None)
                continue
            if self._sparse_as_dense and isinstance(g, tf.IndexedSlices):
                g = tf.convert_to_tensor(g)
            out.append(allreduce(g, op=self._op))
        return out[0] if single else out
