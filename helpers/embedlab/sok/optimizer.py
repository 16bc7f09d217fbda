"""`OptimizerWrapper`: any Keras optimizer, or EmbedLab's compiled ones, on the local shards.

Keras 3 optimizers under `MultiWorkerMirroredStrategy` all-reduce every gradient and update
through the strategy, which a per-worker shard must never see (its gradient already holds
every worker's contributions, and its shape differs between workers). The wrapper keeps its
own copy of the optimizer (same class and config) whose slot variables are per-worker and whose
update runs locally, variable by variable (Keras' `update_step`), or, for
`embedlab.optimizers`, through the fused sparse ops. The optimizer you pass stays free for the
dense variables.
"""
from __future__ import annotations

import keras
import tensorflow as tf
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.ops import resource_variable_ops

from .. import tables as _tables
from . import _context

__all__ = ["OptimizerWrapper", "SGD", "filter_variables", "local_variable_scope"]


def _local_creator(next_creator, **kwargs):
    """Creates a plain per-process variable on this worker's device, bypassing the strategy."""
    init = kwargs.get("initial_value")
    keep = {k: kwargs[k] for k in ("initial_value", "trainable", "name", "dtype", "shape", "constraint")
            if k in kwargs and kwargs[k] is not None}
    if callable(init) and "shape" in keep:
        keep.pop("shape")
    with tf.init_scope(), tf.device(_context.context().device):
        return resource_variable_ops.ResourceVariable(**keep)


def local_variable_scope():
    """A scope in which tf.Variable / keras.Variable creation makes plain per-worker variables."""
    return tf.variable_creator_scope(_local_creator)


def _dynamic_slot(var, name, initializer):
    """A slot of a DynamicVariable: `[capacity, dim]` like the table, growing with it."""
    init = keras.initializers.get(initializer)
    dim = var.dim
    rows_fn = lambda rows: tf.cast(init(tf.stack([rows, dim]), dtype="float32"), tf.float32)  # noqa: E731
    cap = var.capacity
    with tf.init_scope(), tf.device(_context.context().device):
        slot = resource_variable_ops.ResourceVariable(rows_fn(cap), shape=tf.TensorShape([None, dim]), trainable=False,
                                                      name=f"{var.table_name}_{name}")
    var.add_companion(slot, rows_fn)
    return slot


def _is_embedlab(opt) -> bool:
    return hasattr(opt, "apply_sparse") and hasattr(opt, "_sparse_apply")


class OptimizerWrapper:
    """Applies an optimizer to embedlab.sok shards locally (no all-reduce).

    Args:
        optimizer: a Keras 3 optimizer (SGD, Adam, Adagrad, Adamax, Adadelta, Ftrl, ...) or an
            `embedlab.optimizers` one (SGD, Adagrad, lazy Adam: compiled sparse updates).

    Use it inside or outside `strategy.run`, eager or in a `tf.function`:

        >>> import keras, numpy as np, tensorflow as tf, embedlab.sok as sok
        >>> v1 = sok.Variable(np.zeros((4, 2)), dtype=tf.float32)
        >>> with tf.GradientTape() as tape:
        ...     emb = sok.lookup_sparse([v1], [tf.ragged.constant([[1, 3, 3]], dtype=tf.int64)], combiners=["sum"])
        ...     loss = tf.reduce_sum(emb[0])
        >>> grads = tape.gradient(loss, [v1])
        >>> opt = sok.OptimizerWrapper(keras.optimizers.SGD(learning_rate=1.0))
        >>> _ = opt.apply_gradients(zip(grads, [v1]))
        >>> v1.numpy()[:, 0].tolist()
        [0.0, -1.0, 0.0, -2.0]

    Keras optimizers other than EmbedLab's update densely where their formula is dense (Adam's
    moments decay on every row, as Keras' own Adam does on a whole table); EmbedLab's Adam is
    lazy (only touched rows move, SOK's behaviour).
    """

    def __init__(self, optimizer):
        if not isinstance(optimizer, keras.optimizers.Optimizer):
            raise ValueError(f"embedlab.sok.OptimizerWrapper: expected a Keras 3 optimizer or an embedlab.optimizers "
                             f"one, got {type(optimizer).__name__}")
        self._user = optimizer
        self._embedlab = _is_embedlab(optimizer)
        with tf.init_scope(), local_variable_scope():   # also when first met inside a tf.function
            self._opt = type(optimizer).from_config(optimizer.get_config())
        self._opt._distribution_strategy = distribute_lib._get_default_strategy()
        self._opt._backend_update_step = self._local_update
        self._opt._apply_weight_decay = self._local_weight_decay
        self._slots = {}   # id(var) -> {slot name: variable}
        from keras.src.optimizers.base_optimizer import BaseOptimizer

        def recording_add(reference_variable, name=None, initializer="zeros"):
            if getattr(reference_variable, "is_dynamic", False):
                v = _dynamic_slot(reference_variable, name, initializer)
            else:
                # The base implementation: the TensorFlow one colocates with the strategy's variables.
                # A shard's state of 32 MiB and more on the CPU is placed as the shard is.
                v = BaseOptimizer.add_variable_from_reference(
                    self._opt, reference_variable, name=name,
                    initializer=_tables.initializer(initializer))
            self._slots.setdefault(id(reference_variable), {})[name] = v
            return v

        self._opt.add_variable_from_reference = recording_add
        self._built = set()

    @property
    def optimizer(self):
        """The wrapper's own optimizer instance (its slots are the shards' state)."""
        return self._opt

    @property
    def name(self) -> str:
        return type(self._user).__name__

    @property
    def iterations(self):
        return self._opt.iterations

    @property
    def learning_rate(self):
        return self._opt.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self._opt.learning_rate = value

    def _local_update(self, grads, variables, learning_rate):
        variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
        sync = [op for v in variables if getattr(v, "is_dynamic", False) for op in v.sync_companions()]
        # A DynamicVariable is read and written by key; its gradients index its storage rows,
        # so the update runs on `storage` (the same memory, by position).
        variables = [v.storage if getattr(v, "is_dynamic", False) else v for v in variables]
        with tf.control_dependencies(sync):
            self._local_update_now(grads, variables, learning_rate)

    def _local_update_now(self, grads, variables, learning_rate):
        if self._embedlab:
            sparse = [(g, v) for g, v in zip(grads, variables) if isinstance(g, tf.IndexedSlices)]
            dense = [(g, v) for g, v in zip(grads, variables) if not isinstance(g, tf.IndexedSlices)]
            if sparse:
                self._opt.apply_sparse([g for g, _ in sparse], [v for _, v in sparse], learning_rate)
            for g, v in dense:
                self._opt.update_step(g, v, learning_rate)
            return
        for g, v in zip(grads, variables):
            self._opt.update_step(g, v, learning_rate)

    def _local_weight_decay(self, variables):
        if self._opt.weight_decay is None:
            return
        for v in variables:
            v = v.value if isinstance(v, keras.Variable) else v
            v = v.storage if getattr(v, "is_dynamic", False) else v
            if self._opt._use_weight_decay(v):
                lr = tf.cast(self._opt.learning_rate, v.dtype)
                v.assign_sub(v * tf.cast(self._opt.weight_decay, v.dtype) * lr)

    def _ensure_built(self, variables):
        new = [v for v in variables if id(v) not in self._built]
        if not new:
            return
        with tf.init_scope(), local_variable_scope():
            if not self._opt.built:
                self._opt.build(list(variables))
                self._built.update(id(v) for v in variables)
                return
            raise ValueError("embedlab.sok.OptimizerWrapper: the optimizer was built for other variables; pass every "
                             "table it trains in its first apply_gradients call (or use one wrapper per set of tables)")

    def slots(self, var) -> dict:
        """{slot name: variable} of one shard (e.g. {'momentum': ..., 'velocity': ...} for Adam)."""
        return dict(self._slots.get(id(var), {}))

    def build(self, variables):
        """Creates the slots of these shards now (else on the first apply_gradients)."""
        self._ensure_built(list(variables))

    def apply_gradients(self, grads_and_vars, **kwargs):
        """Updates each shard with its gradient (IndexedSlices or dense), locally.

        Accepts and ignores Keras 2's `experimental_aggregate_gradients`. None gradients are
        skipped. Advances `iterations` by one.
        """
        kwargs.pop("experimental_aggregate_gradients", None)
        pairs = [(g, v) for g, v in grads_and_vars]
        self._ensure_built([v for _, v in pairs])
        pairs = [(g, v) for g, v in pairs if g is not None]
        if not pairs:
            return
        return self._opt.apply([g for g, _ in pairs], [v for _, v in pairs])


class SGD:
    """SOK's own sparse SGD (`sok.SGD(lr)`): `v -= lr * g` on the rows a gradient touches.

    Args:
        lr: the learning rate (kept in a `tf.Variable`, `self.lr`, which may be assigned).

    `apply_gradients(zip(grads, vars))` updates embedlab.sok variables (and plain ones) locally,
    like `OptimizerWrapper(keras.optimizers.SGD(lr))`, which it is.
    """

    def __init__(self, lr):
        self._wrapper = OptimizerWrapper(keras.optimizers.SGD(learning_rate=float(lr)))

    @property
    def lr(self):
        return self._wrapper.learning_rate

    @property
    def learning_rate(self):
        return self._wrapper.learning_rate

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._wrapper.apply_gradients(grads_and_vars)


def filter_variables(vars):
    """(embedlab.sok variables, the others) of a list of variables, as SOK's `filter_variables`:
    the first go to an `OptimizerWrapper` / `sok.SGD`, the others to a Keras optimizer."""
    from .variable import is_sok_variable
    sok_vars, other_vars = [], []
    for v in vars:
        (sok_vars if is_sok_variable(v) else other_vars).append(v)
    return sok_vars, other_vars
