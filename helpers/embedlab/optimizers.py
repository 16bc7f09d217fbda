"""Keras optimizers whose sparse (IndexedSlices) updates run in EmbedLab's compiled kernels.

`SGD`, `Adagrad`, `Adam` and `Ftrl` are Keras 3 optimizers (use them in `model.compile` or call
`apply_gradients([(grad, variable), ...])`). For a dense gradient they do exactly what the
Keras optimizer does. For an `IndexedSlices` gradient, such as the one `embedlab.ops` returns
for a table, they update only the touched rows, in place, in one fused op for all tables of
a step: no dense gradient and no dense state update of the whole table ever happens.

* SGD and Adagrad give the same tables as Keras' own (untouched rows do not move there either).
* Adam is *lazy*: only touched rows' moments move (as in TensorFlow Addons' LazyAdam and
  SOK's Adam); bias correction uses the global step. On rows touched every step it equals
  Keras' Adam.
* Ftrl is Keras' FTRL on the touched rows only (as TensorFlow's sparse FTRL kernels do): rows
  a step does not touch keep their weights and state; Keras' dense step would recompute them.

Duplicate indices in a gradient are summed before the update.

Inside a `tf.function` (and so in `model.fit`), `apply_gradients` also fuses the update with
the backward of the EmbedLab lookup that produced the gradient: where a table's gradient is,
unchanged, the output of the lookup's backward op, the optimizer builds one op that sums the
gradient rows and updates the table in place ("optimizer in backward", as
`fused_embedding_lookup(..., optimizer=...)` does), and TensorFlow prunes the backward op,
whose outputs nothing reads any more. Same tables, bit for bit; no `IndexedSlices` tensors are
written. A gradient that was clipped, scaled, summed over several lookups, computed in another
`tf.function` or eagerly takes the unfused path. `fuse_lookup_backward=False` turns it off.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from . import _native, tables as _tables
from ._lookup import on_cpu

__all__ = ["SGD", "Adagrad", "Adam", "Ftrl"]


def _is_sparse(grad, var) -> bool:
    return isinstance(grad, tf.IndexedSlices) and var.dtype == tf.float32 and var.shape.rank == 2


def _handle(v):
    return v.handle  # tf.Variable and keras.Variable (TensorFlow backend) both expose it


_LOOKUP_GRAD_OP = "EmbedLabFusedLookupGrad"


def _lookup_grad_source(grad):
    """(op, t) when `grad` is table t's IndexedSlices exactly as the backward op `op` of an
    EmbedLab lookup returned it, in the graph now being built; else None."""
    try:
        op, indices_op = grad.values.op, grad.indices.op
    except AttributeError:  # eager tensors have no op
        return None
    if op.type != _LOOKUP_GRAD_OP or indices_op is not op or op.graph is not tf.compat.v1.get_default_graph():
        return None
    n, nw = op.get_attr("num_tables"), op.get_attr("num_weights")
    t = grad.values.value_index - n  # outputs: unique_keys (n), then rows (n)
    if grad.indices.value_index != t or not 0 <= t < n or nw not in (0, n):
        return None
    return op, t


class _SparseMixin:
    """Routes IndexedSlices gradients to fused EmbedLab ops, dense ones to Keras."""

    def _sparse_apply(self, grads, variables, learning_rate):
        """One fused op over variables that all live on one device (subclasses implement)."""
        raise NotImplementedError

    def apply_sparse(self, grads, variables, learning_rate=None):
        """Applies IndexedSlices gradients to float32 tables in place, one fused op per device.

        Does not advance `iterations` (call `apply_gradients`, or advance it yourself once per
        step) and applies no gradient clipping or loss scaling: it is the building block for
        layers that train their own tables (see `embedlab.plugin`).

        Args:
            grads: list of `tf.IndexedSlices`.
            variables: list of `[rows, dim]` float32 variables (tf.Variable or keras.Variable).
            learning_rate: defaults to the optimizer's current learning rate.
        """
        if learning_rate is None:
            learning_rate = self.learning_rate
        by_device = {}
        for g, v in zip(grads, variables):
            by_device.setdefault(_handle(v).device, []).append((g, v))
        for device, pairs in by_device.items():
            # A fused op cannot take resources on different devices: one op per device.
            with tf.device(device or None):
                self._sparse_apply([g for g, _ in pairs], [v for _, v in pairs], learning_rate)

    def _slot_handles(self, variables):
        """(optimizer name for the fused kernels, slot variable handles in their input order)."""
        raise NotImplementedError

    def apply_lookup_gradients(self, output_grads, row_splits, keys, weights, combiners, variables,
                               learning_rate=None):
        """Backward of a fused lookup and this optimizer's update in one compiled op per device.

        The gradient rows of each touched key are summed exactly as the lookup's own gradient
        sums them (into a buffer the op reuses, not into `IndexedSlices` tensors) and applied to
        those table rows in place (FBGEMM's "optimizer in backward"). Same tables, bit for bit,
        as the gradient followed by `apply_sparse`. Like `apply_sparse` it does not advance
        `iterations` and applies no clipping or loss scaling.
        `embedlab.ops.fused_embedding_lookup(..., optimizer=opt)` calls it from the lookup's
        gradient.

        Args:
            output_grads: per table, the gradient of the lookup output `[batch, dim]`.
            row_splits, keys, weights: the CSR ids the forward used (weights: list or None).
            combiners: one "sum" / "mean" per table.
            variables: the `[rows, dim]` float32 tables (all on one device).
        """
        if learning_rate is None:
            learning_rate = self.learning_rate
        name, slots = self._slot_handles(variables)
        step = tf.cast(self.iterations + 1, tf.int64)
        _native.tf_ops().embed_lab_fused_lookup_grad_apply(
            list(output_grads), list(row_splits), list(keys), list(weights or []),
            [_handle(v) for v in variables], slots, tf.cast(learning_rate, tf.float32),
            tf.constant(getattr(self, "epsilon", 0.0) or 0.0, tf.float32),
            tf.constant(getattr(self, "beta_1", 0.0), tf.float64), tf.constant(getattr(self, "beta_2", 0.0), tf.float64),
            step, combiners=list(combiners), optimizer=name, **self._fused_attrs())

    def _fused_attrs(self):
        """Optimizer-specific attributes of the fused backward + update op (FTRL's)."""
        return {}

    def _apply_fused_with_lookup_backward(self, pairs, learning_rate):
        """Applies the (IndexedSlices grad, variable) pairs that come straight from an EmbedLab
        lookup's backward op through one fused backward + update op per (backward op, device);
        returns the pairs it did not take."""

        groups, rest = {}, []
        for g, v in pairs:
            # The fused backward + update op has a CPU kernel only.
            src = _lookup_grad_source(g) if on_cpu([v]) else None
            if src is None:
                rest.append((g, v))
                continue
            op, t = src
            groups.setdefault((op.name, _handle(v).device), (op, []))[1].append((t, v))
        for op, members in groups.values():
            n, nw = op.get_attr("num_tables"), op.get_attr("num_weights")
            combiners = op.get_attr("combiners")
            ts = [t for t, _ in members]
            with tf.device(_handle(members[0][1]).device or None):
                self.apply_lookup_gradients(
                    [op.inputs[t] for t in ts], [op.inputs[n + t] for t in ts], [op.inputs[2 * n + t] for t in ts],
                    [op.inputs[3 * n + t] for t in ts] if nw else None,
                    [c.decode() if isinstance(c, bytes) else c for c in (combiners[t] for t in ts)],
                    [v for _, v in members], learning_rate)
        return rest

    def add_variable_from_reference(self, reference_variable, name=None, initializer="zeros"):
        # The state of a table (as large as the table, read and written by the fused step) gets
        # its initial value in an aligned huge-page mapping (`_tables.aligned`: 32 MiB and more,
        # float32, on the CPU; anything else stays as Keras makes it).
        return super().add_variable_from_reference(
            reference_variable, name=name, initializer=_tables.initializer(initializer))

    def load_own_variables(self, store):
        # Keras's loading, with each variable written through `_tables.assign`: large state
        # stays in its aligned huge-page mapping (Keras's own method warns and skips on a
        # mismatched store, as before).
        if len(store.keys()) != len(self.variables):
            return super().load_own_variables(store)
        for i, variable in enumerate(self.variables):
            _tables.assign(variable, store[str(i)])

    def slot_variables(self, variable) -> list:
        """The state this optimizer keeps for `variable` (it must be built for it), as
        `tf.Variable`s in the order the compiled kernels take them: Adam [m, v], Adagrad
        [accumulator], Ftrl [accumulator, linear], SGD []. Writing them (e.g. restoring rows) changes the optimizer's state."""
        i = self._slot_index(variable)
        return [s[i].value if isinstance(s[i], keras.Variable) else s[i] for s in self._slot_lists()]

    def _slot_lists(self):
        """The Keras per-variable state lists, in the compiled kernels' order."""
        raise NotImplementedError

    def _slot_index(self, variable):
        try:
            return self._get_variable_index(variable)
        except KeyError:
            raise ValueError(f"{type(self).__name__} {self.name!r} has no state for variable {variable.name!r}: "
                             "it was built for other variables (give each set of tables its own optimizer, "
                             "or build it with these tables)") from None

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if tf.distribute.has_strategy():
            # Under a strategy, Keras updates each variable through update_step (per replica).
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        variables = [v.value if isinstance(v, keras.Variable) else v for v in trainable_variables]
        sparse = [(g, kv) for g, v, kv in zip(grads, variables, trainable_variables) if _is_sparse(g, v)]
        dense = [(g, kv) for g, v, kv in zip(grads, variables, trainable_variables) if not _is_sparse(g, v)]
        if sparse and self.fuse_lookup_backward:
            sparse = self._apply_fused_with_lookup_backward(sparse, learning_rate)
        if sparse:
            self.apply_sparse([g for g, _ in sparse], [kv for _, kv in sparse], learning_rate)
        if dense:
            super()._backend_update_step([g for g, _ in dense], [kv for _, kv in dense], learning_rate)

    def update_step(self, gradient, variable, learning_rate):
        if _is_sparse(gradient, variable):
            self._sparse_apply([gradient], [variable], learning_rate)
        else:
            super().update_step(gradient, variable, learning_rate)

    def get_config(self):
        config = super().get_config()
        config["fuse_lookup_backward"] = self.fuse_lookup_backward
        return config

    @staticmethod
    def _parts(grads):
        return ([tf.cast(g.indices, tf.int64) for g in grads],
                [tf.convert_to_tensor(g.values, tf.float32) for g in grads])


@keras.saving.register_keras_serializable(package="embedlab")
class SGD(_SparseMixin, keras.optimizers.SGD):
    """Plain SGD (no momentum): `w[i] -= learning_rate * g[i]` on touched rows.

    Example:
        >>> import tensorflow as tf
        >>> table = tf.Variable(tf.ones([4, 2]))
        >>> grad = tf.IndexedSlices(tf.fill([1, 2], 2.0), tf.constant([3]), tf.constant([4, 2]))
        >>> opt = SGD(learning_rate=0.25)
        >>> _ = opt.apply_gradients([(grad, table)])
        >>> table.numpy()[:, 0].tolist()
        [1.0, 1.0, 1.0, 0.5]
    """

    def __init__(self, learning_rate=0.01, name="embedlab_sgd", fuse_lookup_backward=True, **kwargs):
        momentum, nesterov = kwargs.pop("momentum", 0.0), kwargs.pop("nesterov", False)  # from get_config()
        if momentum or nesterov:
            raise ValueError(f"embedlab.optimizers.SGD has no momentum (got momentum={momentum!r}, "
                             f"nesterov={nesterov!r}); use Adam or Adagrad")
        super().__init__(learning_rate=learning_rate, momentum=0.0, nesterov=False, name=name, **kwargs)
        self.fuse_lookup_backward = bool(fuse_lookup_backward)

    def _slot_handles(self, variables):
        return "sgd", []

    def _slot_lists(self):
        return []

    def _sparse_apply(self, grads, variables, learning_rate):
        idx, vals = self._parts(grads)
        _native.tf_ops().embed_lab_sparse_apply_sgd(
            [_handle(v) for v in variables], idx, vals, tf.cast(learning_rate, tf.float32))


@keras.saving.register_keras_serializable(package="embedlab")
class Adagrad(_SparseMixin, keras.optimizers.Adagrad):
    """Keras Adagrad (`acc += g*g; w -= lr*g/sqrt(acc+eps)`), sparse rows in place."""

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                 name="embedlab_adagrad", fuse_lookup_backward=True, **kwargs):
        super().__init__(learning_rate=learning_rate, initial_accumulator_value=initial_accumulator_value,
                         epsilon=epsilon, name=name, **kwargs)
        self.fuse_lookup_backward = bool(fuse_lookup_backward)

    def _slot_handles(self, variables):
        return "adagrad", [_handle(self._accumulators[self._slot_index(v)]) for v in variables]

    def _slot_lists(self):
        return [self._accumulators]

    def _sparse_apply(self, grads, variables, learning_rate):
        idx, vals = self._parts(grads)
        accs = [self._accumulators[self._get_variable_index(v)] for v in variables]
        _native.tf_ops().embed_lab_sparse_apply_adagrad(
            [_handle(v) for v in variables], [_handle(a) for a in accs], idx, vals,
            tf.cast(learning_rate, tf.float32), tf.constant(self.epsilon, tf.float32))


@keras.saving.register_keras_serializable(package="embedlab")
class Adam(_SparseMixin, keras.optimizers.Adam):
    """Lazy Adam for IndexedSlices gradients, Keras Adam for dense ones (no amsgrad)."""

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 name="embedlab_adam", fuse_lookup_backward=True, **kwargs):
        if kwargs.pop("amsgrad", False):  # get_config() carries Keras' False
            raise ValueError("embedlab.optimizers.Adam has no amsgrad variant (got amsgrad=True)")
        super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                         amsgrad=False, name=name, **kwargs)
        self.fuse_lookup_backward = bool(fuse_lookup_backward)

    def _slot_handles(self, variables):
        pos = [self._slot_index(v) for v in variables]
        return "adam", ([_handle(self._momentums[i]) for i in pos] + [_handle(self._velocities[i]) for i in pos])

    def _slot_lists(self):
        return [self._momentums, self._velocities]

    def _sparse_apply(self, grads, variables, learning_rate):
        idx, vals = self._parts(grads)
        pos = [self._get_variable_index(v) for v in variables]
        _native.tf_ops().embed_lab_sparse_apply_adam(
            [_handle(v) for v in variables],
            [_handle(self._momentums[i]) for i in pos], [_handle(self._velocities[i]) for i in pos],
            idx, vals, tf.cast(learning_rate, tf.float32),
            tf.constant(self.beta_1, tf.float64), tf.constant(self.beta_2, tf.float64),
            tf.constant(self.epsilon, tf.float32), tf.cast(self.iterations + 1, tf.int64))


@keras.saving.register_keras_serializable(package="embedlab")
class Ftrl(_SparseMixin, keras.optimizers.Ftrl):
    """Keras 3 FTRL-Proximal; IndexedSlices gradients update the touched rows in place.

    Per touched element, in Keras' float32 order (accumulator n starts at
    `initial_accumulator_value`, linear z at 0; p = `learning_rate_power`):
    `g' = g + 2 l2_shrinkage w; n' = n + g^2; z += g' - (n'^-p - n^-p) / lr * w;
    w = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 (l2 + beta / (2 lr))); n = n'`.
    Untouched rows keep w, n and z (Keras' dense step would recompute w from z on every row,
    which sets a never-touched row to 0). Dense gradients go to Keras' own update.
    Keras-RS's FTRL tables (`keras.optimizers.Ftrl` or `tf.tpu.experimental.embedding.FTRL`
    in a `TableConfig`) take these hyperparameters one to one.

    Args:
        learning_rate: float or schedule, > 0.
        learning_rate_power: <= 0 (-0.5: the square root; 0: a fixed learning rate).
        initial_accumulator_value: >= 0, the accumulator's starting value.
        l1_regularization_strength: >= 0.
        l2_regularization_strength: >= 0.
        l2_shrinkage_regularization_strength: >= 0.
        beta: >= 0.
        fuse_lookup_backward: fuse the update into the lookup's backward (module docstring).

    Raises:
        ValueError: a hyperparameter out of range or not finite (the message names it).

    Example:
        >>> import tensorflow as tf
        >>> table = tf.Variable(tf.ones([3, 1]))
        >>> grad = tf.IndexedSlices(tf.constant([[1.0]]), tf.constant([2]), tf.constant([3, 1]))
        >>> opt = Ftrl(learning_rate=1.0, initial_accumulator_value=0.0, l1_regularization_strength=2.0)
        >>> _ = opt.apply_gradients([(grad, table)])
        >>> table.numpy()[:, 0].tolist()   # |z| = 1 - 1 <= l1: row 2 is zeroed; rows 0, 1 untouched
        [1.0, 1.0, 0.0]
    """

    def __init__(self, learning_rate=0.001, learning_rate_power=-0.5, initial_accumulator_value=0.1,
                 l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                 l2_shrinkage_regularization_strength=0.0, beta=0.0, name="embedlab_ftrl",
                 fuse_lookup_backward=True, **kwargs):
        import math
        import numbers
        hyper = {"learning_rate_power": learning_rate_power, "initial_accumulator_value": initial_accumulator_value,
                 "l1_regularization_strength": l1_regularization_strength,
                 "l2_regularization_strength": l2_regularization_strength,
                 "l2_shrinkage_regularization_strength": l2_shrinkage_regularization_strength, "beta": beta}
        for key, value in hyper.items():
            if not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"embedlab.optimizers.Ftrl: {key} must be a finite number, got {value!r}")
        if beta < 0:
            raise ValueError(f"embedlab.optimizers.Ftrl: beta must be >= 0, got beta={beta!r}")
        if isinstance(learning_rate, numbers.Real) and not learning_rate > 0:
            raise ValueError(f"embedlab.optimizers.Ftrl: learning_rate must be > 0, got learning_rate={learning_rate!r}")
        # Keras checks learning_rate_power <= 0 and the others >= 0, naming each.
        super().__init__(learning_rate=learning_rate, name=name, **hyper, **kwargs)
        self.fuse_lookup_backward = bool(fuse_lookup_backward)

    def _fused_attrs(self):
        return {"lr_power": float(self.learning_rate_power), "l1": float(self.l1_regularization_strength),
                "l2": float(self.l2_regularization_strength),
                "l2_shrinkage": float(self.l2_shrinkage_regularization_strength), "beta": float(self.beta)}

    def _slot_handles(self, variables):
        pos = [self._slot_index(v) for v in variables]
        return "ftrl", ([_handle(self._accumulators[i]) for i in pos] + [_handle(self._linears[i]) for i in pos])

    def _slot_lists(self):
        return [self._accumulators, self._linears]

    def _sparse_apply(self, grads, variables, learning_rate):
        idx, vals = self._parts(grads)
        pos = [self._get_variable_index(v) for v in variables]
        _native.tf_ops().embed_lab_sparse_apply_ftrl(
            [_handle(v) for v in variables], [_handle(self._accumulators[i]) for i in pos],
            [_handle(self._linears[i]) for i in pos], idx, vals, tf.cast(learning_rate, tf.float32),
            **self._fused_attrs())
