"""The dense layers of a HugeCTR JSON model, in TensorFlow.

`DenseModel(spec, seed)` creates the variables of every trainable layer in file order and
`__call__(tensors, training)` runs the layers on a dict {top name: tensor}. The variable
order is HugeCTR's dense model-file order (`weights()`): InnerProduct weight `[in, out]` then
bias `[out]`; MultiCross per layer weight `[1, dim]` then bias `[1, dim]`; Multiply weight
`[n, k]`; BatchNorm gamma then beta (running mean and variance are kept apart, `bn_stats()`).

Each layer's forward is a handful of TensorFlow ops (matmul, element-wise math), so TensorFlow
differentiates it; the tests compare every layer with a NumPy oracle, forward and gradient.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .spec import T2, T3, LayerSpec, ModelSpec

__all__ = ["DenseModel", "forward_layer"]


def _xavier(rng, fan_in, fan_out, shape):
    return (rng.standard_normal(shape) * np.sqrt(2.0 / (fan_in + fan_out))).astype(np.float32)


def _rows(x, cols):
    return tf.reshape(x, [-1, cols])


def forward_layer(spec: LayerSpec, ins: list, weights: list, training: bool, bn_stats=None,
                  dropout_seed=None):
    """Outputs (a list) of one dense layer.

    Args:
        spec: the layer. ins: input tensors (2-D, or 3-D for an embedding output).
        weights: the layer's variables in model-file order. training: dropout / batch statistics.
        bn_stats: (moving_mean, moving_var) variables of a BatchNorm layer.
    """
    t, p = spec.type, spec.params
    if t == "Reshape":
        return [tf.reshape(ins[0], [-1, p["leading_dim"]])]
    if t == "Concat":
        return [tf.concat(ins, axis=1)] if len(ins) > 1 else [tf.identity(ins[0])]
    if t == "Slice":
        return [ins[0][:, a:b] for a, b in p["ranges"]]
    if t in ("InnerProduct", "FusedInnerProduct"):
        w, b = weights
        y = tf.matmul(ins[0], tf.cast(w, ins[0].dtype)) + tf.cast(b, ins[0].dtype)
        return [tf.nn.relu(y) if t == "FusedInnerProduct" else y]
    if t == "ReLU":
        return [tf.nn.relu(ins[0])]
    if t == "ELU":
        x, a = ins[0], p["alpha"]
        return [tf.where(x > 0, x, tf.cast(a, x.dtype) * (tf.exp(tf.minimum(x, 0)) - 1))]
    if t == "Dropout":
        if not training or p["rate"] == 0:
            return [tf.identity(ins[0])]
        x, rate = ins[0], p["rate"]
        if dropout_seed is None:
            return [tf.nn.dropout(x, rate=rate)]
        # Stateless: the mask is a function of (seed, layer, step), so two runs of the same
        # data order drop the same units (oversubscription / resume comparisons).
        keep = tf.random.stateless_uniform(tf.shape(x), seed=dropout_seed) >= rate
        return [tf.where(keep, x / tf.cast(1 - rate, x.dtype), tf.zeros_like(x))]
    if t == "MultiCross":
        x0 = ins[0]
        x = x0
        for l in range(p["num_layers"]):
            w, b = weights[2 * l], weights[2 * l + 1]
            xw = tf.matmul(x, tf.cast(w, x.dtype), transpose_b=True)      # [rows, 1]
            x = x0 * xw + tf.cast(b, x.dtype) + x
        return [x]
    if t == "FmOrder2":
        k = p["out_dim"]
        x = tf.reshape(ins[0], [tf.shape(ins[0])[0], -1, k])               # [rows, slots, k]
        s = tf.reduce_sum(x, axis=1)
        return [0.5 * (s * s - tf.reduce_sum(x * x, axis=1))]
    if t == "Multiply":
        n, k = p["weight_dims"]
        w = tf.cast(weights[0], ins[0].dtype)
        return [tf.reshape(ins[0][:, :, None] * w[None, :, :], [-1, n * k])]
    if t == "ReduceSum":
        return [tf.reduce_sum(ins[0], axis=1, keepdims=True)]
    if t == "Add":
        return [tf.add_n(list(ins))]
    if t == "Interaction":
        mlp, emb = ins
        d = spec.in_shapes[0].cols
        allv = tf.concat([mlp[:, None, :], emb], axis=1)                   # [b, n, d]
        z = tf.matmul(allv, allv, transpose_b=True)                        # [b, n, n]
        n = spec.in_shapes[1].slots + 1
        li, lj = np.tril_indices(n, -1)
        flat = tf.reshape(z, [-1, n * n])
        pairs = tf.gather(flat, (li * n + lj).astype(np.int32), axis=1)
        pad = tf.zeros_like(mlp[:, :1])
        del d
        return [tf.concat([mlp, pairs, pad], axis=1)]
    if t == "BatchNorm":
        gamma, beta = weights
        x = ins[0]
        mean_v, var_v = bn_stats
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
    raise ValueError(f"layer {spec.name!r}: type {t!r} has no forward here")


class DenseModel:
    """The dense part of a model: variables (model-file order) and the forward pass.

    Args:
        spec: the parsed model. seed: initial values come from `np.random.default_rng(seed)`
            (weights Xavier-normal, as HugeCTR's default; biases zero; BatchNorm gamma 1, beta 0).
    """

    def __init__(self, spec: ModelSpec, seed: int = 0):
        self.spec, self.seed = spec, int(seed)
        rng = np.random.default_rng([seed, 0xDE45E])
        self.layer_weights: dict[str, list] = {}
        self.bn: dict[str, tuple] = {}
        self._order: list[tf.Variable] = []
        for l in spec.layers:
            ws = []
            s = l.in_shapes[0] if l.in_shapes else None
            if l.type in ("InnerProduct", "FusedInnerProduct"):
                n_in, n_out = s.cols, l.params["num_output"]
                ws = [_xavier(rng, n_in, n_out, (n_in, n_out)), np.zeros(n_out, np.float32)]
            elif l.type == "MultiCross":
                for _ in range(l.params["num_layers"]):
                    ws += [_xavier(rng, s.cols, 1, (1, s.cols)), np.zeros((1, s.cols), np.float32)]
            elif l.type == "Multiply":
                n, k = l.params["weight_dims"]
                ws = [_xavier(rng, n, k, (n, k))]
            elif l.type == "BatchNorm":
                ws = [np.ones(s.cols, np.float32), np.zeros(s.cols, np.float32)]
                self.bn[l.name] = (tf.Variable(np.zeros(s.cols, np.float32), trainable=False,
                                               name=f"{l.name}_mean"),
                                   tf.Variable(np.ones(s.cols, np.float32), trainable=False,
                                               name=f"{l.name}_var"))
            vs = [tf.Variable(w, name=f"{l.name}_{i}") for i, w in enumerate(ws)]
            self.layer_weights[l.name] = vs
            self._order += vs

    def weights(self) -> list:
        """Trainable variables in HugeCTR's dense model-file order."""
        return list(self._order)

    def num_values(self) -> int:
        return int(sum(int(np.prod(v.shape)) for v in self._order))

    def regularized(self) -> list:
        """The weights a regularizer covers: InnerProduct / FusedInnerProduct / MultiCross /
        Multiply weights (not biases, not BatchNorm)."""
        out = []
        for l in self.spec.layers:
            ws = self.layer_weights[l.name]
            if l.type in ("InnerProduct", "FusedInnerProduct", "Multiply"):
                out.append(ws[0])
            elif l.type == "MultiCross":
                out += ws[0::2]
        return out

    def __call__(self, tensors: dict, training: bool, compute_dtype=tf.float32, seed=None):
        """Runs every dense layer but the loss; returns the logit (the loss's first bottom)."""
        env = dict(tensors)
        for name in list(env):
            if compute_dtype != tf.float32 and env[name].dtype == tf.float32:
                env[name] = tf.cast(env[name], compute_dtype)
        for i, l in enumerate(self.spec.layers):
            if l.type == "BinaryCrossEntropyLoss":
                continue
            ins = [env[b] for b in l.bottoms]
            dseed = None if seed is None else tf.stack([tf.constant(1000 * self.seed + i, tf.int64),
                                                         tf.cast(seed, tf.int64)])
            outs = forward_layer(l, ins, self.layer_weights[l.name], training, self.bn.get(l.name),
                                 dropout_seed=dseed)
            for tp, o in zip(l.tops, outs):
                env[tp] = o
        return tf.cast(tf.reshape(env[self.spec.loss.bottoms[0]], [-1, 1]), tf.float32)


def out_shape(shape, batch):
    """Concrete shape of a `T2`/`T3` for a batch size (tests)."""
    if isinstance(shape, T3):
        return (batch, shape.slots, shape.vec)
    return (batch * shape.rows, shape.cols)
