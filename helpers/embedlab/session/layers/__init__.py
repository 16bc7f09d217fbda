"""The dense layers of a HugeCTR JSON model, one class per layer type (`base.Layer`: infer the
output shapes, initial weights, forward), and `DenseModel`, which runs them.

`LAYERS` maps each type name to its class; `spec.parse_model` infers every layer's shapes
through it and `DenseModel` builds and runs the layers through it, so a new layer type is one
class added here. The variable order is HugeCTR's dense model-file order (`DenseModel.weights()`):
InnerProduct weight `[in, out]` then bias `[out]`; MultiCross per layer weight `[1, dim]` then
bias `[1, dim]`; Multiply weight `[n, k]`; BatchNorm gamma then beta (running mean and
variance are kept apart, `DenseModel.bn`).

Each layer's forward is a handful of TensorFlow ops (matmul, element-wise math), so TensorFlow
differentiates it; the tests compare every layer with a NumPy oracle, forward and gradient.
"""
from __future__ import annotations

from .base import Layer
from .model import DenseModel
from .registry import DENSE_TYPES, LAYERS, forward_layer

__all__ = ["LAYERS", "DENSE_TYPES", "Layer", "DenseModel", "forward_layer"]
