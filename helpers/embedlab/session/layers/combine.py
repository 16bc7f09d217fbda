"""Layers that combine features: FmOrder2, Interaction, ReduceSum, Add."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .._schema import T2, T3, ModelError, need
from .base import Layer, one_2d

__all__ = ["FmOrder2", "Interaction", "ReduceSum", "Add"]


class FmOrder2(Layer):
    """Factorization machine, second order: `[rows, slots * k]` to `0.5 * ((sum v)^2 - sum v^2)`
    over the slots, `[rows, k]`."""
    type = "FmOrder2"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        k = need(j, "out_dim", where, int)
        if k < 1 or s.cols % k:
            raise ModelError(f"{where}: field 'out_dim' {k} must divide the {s.cols} columns of bottom "
                             f"{spec.bottoms[0]!r} (slots x vec)")
        spec.params["out_dim"] = k
        return [T2(s.rows, k)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        k = spec.params["out_dim"]
        x = tf.reshape(ins[0], [tf.shape(ins[0])[0], -1, k])               # [rows, slots, k]
        s = tf.reduce_sum(x, axis=1)
        return [0.5 * (s * s - tf.reduce_sum(x * x, axis=1))]


class Interaction(Layer):
    """DLRM's dot interaction: the bottom MLP output `[b, d]` and the embedding `[b, S, d]`; the
    output is the MLP output, the S(S+1)/2 pairwise dot products, and one zero column."""
    type = "Interaction"

    def infer(self, where, spec, j, data):
        ins = spec.in_shapes
        if len(ins) != 2 or not isinstance(ins[0], T2) or not isinstance(ins[1], T3):
            raise ModelError(f"{where}: Interaction takes [2-D bottom MLP output, 3-D embedding]")
        if ins[0].rows != 1 or ins[0].cols != ins[1].vec:
            raise ModelError(f"{where}: the bottom MLP output has {ins[0].cols} columns but the "
                             f"embedding vectors have {ins[1].vec}")
        n = ins[1].slots + 1
        return [T2(1, ins[0].cols + n * (n - 1) // 2 + 1)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        mlp, emb = ins
        allv = tf.concat([mlp[:, None, :], emb], axis=1)                   # [b, n, d]
        z = tf.matmul(allv, allv, transpose_b=True)                        # [b, n, n]
        n = spec.in_shapes[1].slots + 1
        li, lj = np.tril_indices(n, -1)
        flat = tf.reshape(z, [-1, n * n])
        pairs = tf.gather(flat, (li * n + lj).astype(np.int32), axis=1)
        pad = tf.zeros_like(mlp[:, :1])
        return [tf.concat([mlp, pairs, pad], axis=1)]


class ReduceSum(Layer):
    """Sum over the columns (`axis` 1): `[rows, 1]`."""
    type = "ReduceSum"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        axis = need(j, "axis", where, int)
        if axis != 1:
            raise ModelError(f"{where}: field 'axis' must be 1 for a 2-D bottom, got {axis}")
        spec.params["axis"] = axis
        return [T2(s.rows, 1)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.reduce_sum(ins[0], axis=1, keepdims=True)]


class Add(Layer):
    """The element-wise sum of two or more tensors of one shape."""
    type = "Add"

    def infer(self, where, spec, j, data):
        ins = spec.in_shapes
        if len(ins) < 2:
            raise ModelError(f"{where}: Add needs at least two bottoms")
        if any(not isinstance(s, T2) or s != ins[0] for s in ins):
            desc = ", ".join(f"{b!r}: {s}" for b, s in zip(spec.bottoms, ins))
            raise ModelError(f"{where}: Add needs bottoms of one shape, got {desc}")
        return [ins[0]]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.add_n(list(ins))]
