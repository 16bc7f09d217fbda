"""BinaryCrossEntropyLoss: the model's last layer, with an optional L1 / L2 regularizer."""
from __future__ import annotations

import tensorflow as tf

from .._schema import T2, ModelError, need
from .base import Layer

__all__ = ["BinaryCrossEntropyLoss"]


class BinaryCrossEntropyLoss(Layer):
    """Bottoms [logit `[batch, 1]`, label]; `loss(...)` is the mean sigmoid cross-entropy plus
    HugeCTR's regularizer term (L2: ``lambda / (2 batch) sum w^2``; L1: ``lambda / batch sum |w|``)."""
    type = "BinaryCrossEntropyLoss"
    is_loss = True

    def infer(self, where, spec, j, data):
        ins = spec.in_shapes
        if len(ins) != 2:
            raise ModelError(f"{where}: takes two bottoms [logit, label]")
        if spec.bottoms[1] != data.label_top:
            raise ModelError(f"{where}: the second bottom must be the label {data.label_top!r}, got "
                             f"{spec.bottoms[1]!r}")
        if not isinstance(ins[0], T2) or ins[0] != T2(1, 1) or data.label_dim != 1:
            raise ModelError(f"{where}: bottom {spec.bottoms[0]!r} must be [batch, 1] (got {ins[0]}) "
                             f"and label_dim 1 (got {data.label_dim})")
        reg = j.get("regularizer")
        if reg is not None:
            if reg not in ("L1", "L2"):
                raise ModelError(f"{where}: field 'regularizer' must be 'L1' or 'L2', got {reg!r}")
            spec.params["regularizer"] = reg
            spec.params["lambda"] = need(j, "lambda", where, float)
        return [T2(0, 1)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        raise ValueError(f"layer {spec.name!r}: type {spec.type!r} has no forward here")

    def loss(self, spec, logit, label, batch, regularized):
        """The loss of a batch of `batch` samples; `regularized`: the weights the regularizer
        covers (`DenseModel.regularized()`)."""
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logit))
        p = spec.params
        if p.get("regularizer"):
            lam = p["lambda"]
            if p["regularizer"] == "L2":
                loss += lam / (2.0 * batch) * tf.add_n([tf.reduce_sum(tf.square(w)) for w in regularized])
            else:
                loss += lam / batch * tf.add_n([tf.reduce_sum(tf.abs(w)) for w in regularized])
        return loss
