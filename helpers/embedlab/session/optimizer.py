"""HugeCTR's optimizers on TensorFlow variables, for the Session's dense weights and the
embeddings whose updates are not compiled into the lookup's backward (MomentumSGD, Nesterov,
any `Global` update): `TFOptimizer`, and `lr_at`, the JSON's learning-rate schedule.
"""
from __future__ import annotations

import tensorflow as tf

from .. import _native, tables as _tables
from .spec import OptimizerSpec

__all__ = ["TFOptimizer", "lr_at"]



class TFOptimizer:
    """HugeCTR's Adam / MomentumSGD / Nesterov / SGD update rules on TensorFlow variables.

    Adam:      m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr sqrt(1-b2^t)/(1-b1^t) m/(sqrt(v)+eps)
    Momentum:  a = mu a - lr g; w += a
    Nesterov:  a' = mu a - lr g; w += (1+mu) a' - mu a
    SGD:       w -= lr g
    """

    def __init__(self, spec: OptimizerSpec):
        self.spec = spec
        self.nslots = {"Adam": 2, "MomentumSGD": 1, "Nesterov": 1, "SGD": 0}[spec.type]
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="opt_step")

    def make_slots(self, var_shape, name, table: bool = False):
        """The update rule's state of a variable (zeros). `table`: an embedding table's state,
        placed as the table is (`_tables.zeros`: 32 MiB and more on the CPU)."""
        make = _tables.zeros if table else tf.zeros
        return [tf.Variable(make(var_shape), trainable=False, name=f"{name}_slot{i}")
                for i in range(self.nslots)]

    def rule(self, w, g, slots, lr, t):
        """New (w, slots) from current ones and gradient g (all tensors)."""
        s = self.spec
        if s.type == "Adam":
            m, v = slots
            m = s.beta1 * m + (1 - s.beta1) * g
            v = s.beta2 * v + (1 - s.beta2) * g * g
            tf_ = tf.cast(t, tf.float32)
            alpha = lr * tf.sqrt(1 - tf.pow(s.beta2, tf_)) / (1 - tf.pow(s.beta1, tf_))
            return w - alpha * m / (tf.sqrt(v) + s.epsilon), [m, v]
        if s.type == "MomentumSGD":
            a = s.momentum_factor * slots[0] - lr * g
            return w + a, [a]
        if s.type == "Nesterov":
            a_old = slots[0]
            a = s.momentum_factor * a_old - lr * g
            return w + (1 + s.momentum_factor) * a - s.momentum_factor * a_old, [a]
        return w - lr * g, []

    def apply_dense(self, grads, variables, slots, lr, t):
        """Dense update of every variable and its state, in place: one TensorFlow training
        kernel per variable for Adam and SGD (`ResourceApplyAdam` / `ResourceApplyGradientDescent`,
        the same formulas as `rule`), `rule` as TensorFlow ops for MomentumSGD and Nesterov.

        (Not XLA: an XLA-compiled update per variable is no faster on the CPU and keeps about
        100 MB of compiler state resident, which counts against oversubscription's memory.)
        """
        for g, w, sl in zip(grads, variables, slots):
            if g is None:
                continue
            self._apply_one(w, sl, tf.convert_to_tensor(g), lr, t)

    def _apply_one(self, w, sl, g, lr, t):
        s = self.spec
        if s.type == "Adam":
            tf_ = tf.cast(t, tf.float32)
            tf.raw_ops.ResourceApplyAdam(
                var=w.handle, m=sl[0].handle, v=sl[1].handle,
                beta1_power=tf.pow(tf.constant(s.beta1, tf.float32), tf_),
                beta2_power=tf.pow(tf.constant(s.beta2, tf.float32), tf_),
                lr=tf.cast(lr, tf.float32), beta1=tf.constant(s.beta1, tf.float32),
                beta2=tf.constant(s.beta2, tf.float32), epsilon=tf.constant(s.epsilon, tf.float32), grad=g)
        elif s.type == "SGD":
            tf.raw_ops.ResourceApplyGradientDescent(var=w.handle, alpha=tf.cast(lr, tf.float32), delta=g)
        else:
            # TensorFlow's assign: the new values' buffer becomes the variable's (no copy). A
            # placed table under a Global MomentumSGD / Nesterov update leaves its mapping at the
            # first step here, rather than being copied back into it at every step.
            nw, ns = self.rule(w.read_value(), g, [x.read_value() for x in sl], lr, t)
            w.assign(nw)
            for var, val in zip(sl, ns):
                var.assign(val)

    def apply_rows(self, idx, g, table, slots, lr, t):
        """Local / LazyGlobal: update rows idx (unique) only."""
        w = tf.gather(table, idx)
        nw, ns = self.rule(w, g, [tf.gather(s, idx) for s in slots], lr, t)
        table.scatter_update(tf.IndexedSlices(nw, idx))
        for var, val in zip(slots, ns):
            var.scatter_update(tf.IndexedSlices(val, idx))

    def adam_constants(self):
        """beta_1, beta_2 (float64: `1 - beta` then rounds like Keras' Python floats) and epsilon,
        as the compiled Adam ops take them."""
        s = self.spec
        return tf.constant(s.beta1, tf.float64), tf.constant(s.beta2, tf.float64), tf.constant(s.epsilon, tf.float32)

    def apply_adam_rows(self, idx, g, table, slots, lr, t):
        """Adam on rows idx only, compiled (`EmbedLabSparseApplyAdam`): the update a full Global
        pass gives the rows that have a gradient."""
        _native.tf_ops().embed_lab_sparse_apply_adam(
            [table.handle], [slots[0].handle], [slots[1].handle], [idx], [g], tf.cast(lr, tf.float32),
            *self.adam_constants(), tf.cast(t, tf.int64))

    def apply_global(self, idx, g, table, slots, lr, t, used_rows):
        """Global: every row is updated, untouched ones with a zero gradient. Rows no key ever
        reached (those from `used_rows` on) have zero state and a zero gradient, which these
        rules leave unchanged, so they are skipped.

        Adam: one compiled pass over rows [0, used_rows) (`EmbedLabGlobalApplyAdam`: w, m and v
        read and written once, no dense gradient). MomentumSGD / Nesterov: `apply_dense`'s
        TensorFlow ops over the whole table, on a gradient scattered into its shape."""
        s = self.spec
        if s.type == "Adam":
            _native.tf_ops().embed_lab_global_apply_adam(
                [table.handle], [slots[0].handle], [slots[1].handle], [idx], [g], tf.cast(lr, tf.float32),
                *self.adam_constants(), tf.cast(t, tf.int64), tf.reshape(tf.cast(used_rows, tf.int64), [1]))
            return
        dense_g = tf.scatter_nd(idx[:, None], g, tf.shape(table, out_type=tf.int64))
        self._apply_one(table, slots, dense_g, lr, t)


def lr_at(spec: OptimizerSpec, step: int) -> float:
    """HugeCTR's learning-rate schedule (SGD: warm-up, then polynomial decay), for step >= 1."""
    if spec.type != "SGD":
        return spec.learning_rate
    if step <= spec.warmup_steps:
        return step * spec.learning_rate / spec.warmup_steps
    if spec.decay_start == 0 or step <= spec.decay_start:
        return spec.learning_rate
    if step <= spec.decay_start + spec.decay_steps:
        f = ((spec.decay_start + spec.decay_steps - step) / spec.decay_steps) ** spec.decay_power
        return max(spec.learning_rate * f, spec.end_lr)
    return spec.end_lr
