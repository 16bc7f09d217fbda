"""Element-wise layers: ReLU, ELU, Dropout."""
from __future__ import annotations

import tensorflow as tf

from .._schema import ModelError, need
from .base import Layer, one_2d

__all__ = ["ReLU", "ELU", "Dropout"]


class ReLU(Layer):
    type = "ReLU"

    def infer(self, where, spec, j, data):
        return [one_2d(where, spec)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.nn.relu(ins[0])]


class ELU(Layer):
    """`x` where positive, else `alpha * (exp(x) - 1)`."""
    type = "ELU"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        spec.params["alpha"] = need(need(j, "elu_param", where), "alpha", where + ".elu_param", float)
        return [s]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        x, a = ins[0], spec.params["alpha"]
        return [tf.where(x > 0, x, tf.cast(a, x.dtype) * (tf.exp(tf.minimum(x, 0)) - 1))]


class Dropout(Layer):
    """Inverted dropout in training (kept values scaled by 1 / (1 - rate)); the identity in
    evaluation."""
    type = "Dropout"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        rate = need(j, "rate", where, float)
        if not 0 <= rate < 1:
            raise ModelError(f"{where}: field 'rate' must be in [0, 1), got {rate}")
        spec.params["rate"] = rate
        return [s]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        rate = spec.params["rate"]
        if not training or rate == 0:
            return [tf.identity(ins[0])]
        x = ins[0]
        if dropout_seed is None:
            return [tf.nn.dropout(x, rate=rate)]
        # Stateless: the mask is a function of (seed, layer, step), so two runs of the same
        # data order drop the same units (oversubscription / resume comparisons).
        keep = tf.random.stateless_uniform(tf.shape(x), seed=dropout_seed) >= rate
        return [tf.where(keep, x / tf.cast(1 - rate, x.dtype), tf.zeros_like(x))]
