"""`DenseModel`: the dense layers of a parsed model, their variables and the forward pass."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .registry import LAYERS

__all__ = ["DenseModel"]


class DenseModel:
    """The dense part of a model: variables (model-file order) and the forward pass.

    Args:
        spec: the parsed model (`ModelSpec`). seed: initial values come from one NumPy
            generator seeded with it, drawn layer by layer in file order (weights Xavier-normal,
            as HugeCTR's default; biases zero; BatchNorm gamma 1, beta 0).
    """

    def __init__(self, spec, seed: int = 0):
        self.spec, self.seed = spec, int(seed)
        rng = np.random.default_rng([seed, 0xDE45E])
        self.layer_weights: dict[str, list] = {}
        self.bn: dict[str, tuple] = {}          # BatchNorm layer name -> (moving mean, moving variance)
        self._order: list[tf.Variable] = []
        for l in spec.layers:
            layer = LAYERS[l.type]
            state = layer.make_state(l)
            if state is not None:
                self.bn[l.name] = state
            vs = [tf.Variable(w, name=f"{l.name}_{i}") for i, w in enumerate(layer.init_weights(l, rng))]
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
            out += LAYERS[l.type].regularized(self.layer_weights[l.name])
        return out

    def loss(self, logit, label, batch):
        """The loss layer's loss of a batch of `batch` samples (float)."""
        l = self.spec.loss
        return LAYERS[l.type].loss(l, logit, label, batch, self.regularized())

    def __call__(self, tensors: dict, training: bool, compute_dtype=tf.float32, seed=None):
        """Runs every dense layer but the loss; returns the logit (the loss's first bottom)."""
        env = dict(tensors)
        for name in list(env):
            if compute_dtype != tf.float32 and env[name].dtype == tf.float32:
                env[name] = tf.cast(env[name], compute_dtype)
        for i, l in enumerate(self.spec.layers):
            layer = LAYERS[l.type]
            if layer.is_loss:
                continue
            ins = [env[b] for b in l.bottoms]
            dseed = None if seed is None else tf.stack([tf.constant(1000 * self.seed + i, tf.int64),
                                                         tf.cast(seed, tf.int64)])
            outs = layer.forward(l, ins, self.layer_weights[l.name], training, self.bn.get(l.name),
                                 dropout_seed=dseed)
            for tp, o in zip(l.tops, outs):
                env[tp] = o
        return tf.cast(tf.reshape(env[self.spec.loss.bottoms[0]], [-1, 1]), tf.float32)
