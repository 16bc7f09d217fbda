"""`LAYERS`: every dense layer type by its JSON name, and `forward_layer`."""
from __future__ import annotations

from .._schema import LayerSpec
from .activation import ELU, Dropout, ReLU
from .base import Layer
from .batchnorm import BatchNorm
from .combine import Add, FmOrder2, Interaction, ReduceSum
from .dense import FusedInnerProduct, InnerProduct, MultiCross, Multiply
from .loss import BinaryCrossEntropyLoss
from .reshape import Concat, Reshape, Slice

__all__ = ["LAYERS", "DENSE_TYPES", "forward_layer"]

LAYERS: dict[str, Layer] = {cls.type: cls() for cls in (
    Reshape, Concat, Slice, InnerProduct, FusedInnerProduct, ReLU, ELU, Dropout, MultiCross, FmOrder2,
    Multiply, ReduceSum, Add, Interaction, BatchNorm, BinaryCrossEntropyLoss)}
DENSE_TYPES = tuple(LAYERS)


def forward_layer(spec: LayerSpec, ins: list, weights: list, training: bool, bn_stats=None,
                  dropout_seed=None):
    """Outputs (a list) of one dense layer.

    Args:
        spec: the layer. ins: input tensors (2-D, or 3-D for an embedding output).
        weights: the layer's variables in model-file order. training: dropout / batch statistics.
        bn_stats: (moving_mean, moving_var) variables of a BatchNorm layer.
        dropout_seed: a `[2]` int64 seed for a stateless dropout mask (None: a random one).
    """
    layer = LAYERS.get(spec.type)
    if layer is None:
        raise ValueError(f"layer {spec.name!r}: type {spec.type!r} has no forward here")
    return layer.forward(spec, ins, weights, training, bn_stats, dropout_seed=dropout_seed)

