"""Layers with trainable weights: InnerProduct, FusedInnerProduct, MultiCross, Multiply."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .._schema import T2, ModelError, need
from .base import Layer, one_2d, xavier

__all__ = ["InnerProduct", "FusedInnerProduct", "MultiCross", "Multiply"]


class InnerProduct(Layer):
    """`x @ w + b`; weights `w [in, out]` (Xavier), then `b [out]` (zeros)."""
    type = "InnerProduct"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        n = need(need(j, "fc_param", where), "num_output", where + ".fc_param", int)
        if n < 1:
            raise ModelError(f"{where}: fc_param.num_output must be >= 1")
        spec.params["num_output"] = n
        return [T2(s.rows, n)]

    def init_weights(self, spec, rng):
        n_in, n_out = spec.in_shapes[0].cols, spec.params["num_output"]
        return [xavier(rng, n_in, n_out, (n_in, n_out)), np.zeros(n_out, np.float32)]

    def regularized(self, weights):
        return [weights[0]]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        w, b = weights
        return [tf.matmul(ins[0], tf.cast(w, ins[0].dtype)) + tf.cast(b, ins[0].dtype)]


class FusedInnerProduct(InnerProduct):
    """InnerProduct followed by ReLU (one layer in HugeCTR's file)."""
    type = "FusedInnerProduct"

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.nn.relu(y) for y in super().forward(spec, ins, weights, training)]


class MultiCross(Layer):
    """DCN's cross network: `x_{l+1} = x0 * (x_l . w_l) + b_l + x_l`, `num_layers` times; weights
    per layer `w [1, dim]` (Xavier), then `b [1, dim]` (zeros)."""
    type = "MultiCross"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        n = need(need(j, "mc_param", where), "num_layers", where + ".mc_param", int)
        if n < 1:
            raise ModelError(f"{where}: mc_param.num_layers must be >= 1")
        spec.params["num_layers"] = n
        return [s]

    def init_weights(self, spec, rng):
        cols, ws = spec.in_shapes[0].cols, []
        for _ in range(spec.params["num_layers"]):
            ws += [xavier(rng, cols, 1, (1, cols)), np.zeros((1, cols), np.float32)]
        return ws

    def regularized(self, weights):
        return weights[0::2]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        x0 = ins[0]
        x = x0
        for l in range(spec.params["num_layers"]):
            w, b = weights[2 * l], weights[2 * l + 1]
            xw = tf.matmul(x, tf.cast(w, x.dtype), transpose_b=True)      # [rows, 1]
            x = x0 * xw + tf.cast(b, x.dtype) + x
        return [x]


class Multiply(Layer):
    """Each of the `n` input columns times a learned row of `k` values: `[rows, n]` to
    `[rows, n * k]`; weight `[n, k]` (Xavier)."""
    type = "Multiply"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        wd = need(j, "weight_dims", where)
        if (not isinstance(wd, list) or len(wd) != 2 or not all(isinstance(x, int) and x > 0 for x in wd)
                or wd[0] != s.cols):
            raise ModelError(f"{where}: field 'weight_dims' {wd!r} must be [{s.cols}, k] (the bottom has "
                             f"{s.cols} columns)")
        spec.params["weight_dims"] = list(wd)
        return [T2(s.rows, wd[0] * wd[1])]

    def init_weights(self, spec, rng):
        n, k = spec.params["weight_dims"]
        return [xavier(rng, n, k, (n, k))]

    def regularized(self, weights):
        return [weights[0]]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        n, k = spec.params["weight_dims"]
        w = tf.cast(weights[0], ins[0].dtype)
        return [tf.reshape(ins[0][:, :, None] * w[None, :, :], [-1, n * k])]
