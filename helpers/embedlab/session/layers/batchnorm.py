"""BatchNorm: weights gamma then beta; the running mean and variance are state, not weights
(HugeCTR keeps them out of the dense model file too)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .._schema import need
from .base import Layer, one_2d

__all__ = ["BatchNorm"]


class BatchNorm(Layer):
    """Training: the batch's mean and variance, and the running statistics move by `factor`
    (the variance unbiased); evaluation: the running statistics."""
    type = "BatchNorm"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        bn = need(j, "bn_param", where)
        spec.params["factor"] = need(bn, "factor", where + ".bn_param", float)
        spec.params["eps"] = need(bn, "eps", where + ".bn_param", float)
        return [s]

    def init_weights(self, spec, rng):
        cols = spec.in_shapes[0].cols
        return [np.ones(cols, np.float32), np.zeros(cols, np.float32)]

    def make_state(self, spec):
        cols = spec.in_shapes[0].cols
        return (tf.Variable(np.zeros(cols, np.float32), trainable=False, name=f"{spec.name}_mean"),
                tf.Variable(np.ones(cols, np.float32), trainable=False, name=f"{spec.name}_var"))

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        p = spec.params
        gamma, beta = weights
        x = ins[0]
        mean_v, var_v = state
        if training:
            mean, var = tf.nn.moments(x, axes=[0])
            f = p["factor"]
            n = tf.cast(tf.shape(x)[0], x.dtype)
            unbiased = var * n / tf.maximum(n - 1.0, 1.0)
            mean_v.assign((1 - f) * mean_v + f * tf.cast(mean, mean_v.dtype))
            var_v.assign((1 - f) * var_v + f * tf.cast(unbiased, var_v.dtype))
        else:
            mean, var = tf.cast(mean_v, x.dtype), tf.cast(var_v, x.dtype)
        y = (x - mean) * tf.math.rsqrt(var + tf.cast(p["eps"], x.dtype))
        return [y * tf.cast(gamma, x.dtype) + tf.cast(beta, x.dtype)]
