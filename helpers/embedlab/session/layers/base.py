"""`Layer`: what every dense layer type of a HugeCTR JSON model provides."""
from __future__ import annotations

import numpy as np

from .._schema import T2, LayerSpec, ModelError

__all__ = ["Layer", "xavier", "one_2d"]


def xavier(rng, fan_in, fan_out, shape):
    """Xavier-normal initial weights (HugeCTR's default), float32."""
    return (rng.standard_normal(shape) * np.sqrt(2.0 / (fan_in + fan_out))).astype(np.float32)


def one_2d(where, spec: LayerSpec) -> T2:
    """The single 2-D input of `spec` (else a ModelError)."""
    if len(spec.in_shapes) != 1:
        raise ModelError(f"{where}: takes one bottom, got {len(spec.in_shapes)}")
    s = spec.in_shapes[0]
    if not isinstance(s, T2):
        raise ModelError(f"{where}: bottom {spec.bottoms[0]!r} is 3-D [batch, {s.slots}, {s.vec}]; "
                         "put a Reshape in front of it")
    return s


class Layer:
    """One dense layer type (`type`, the JSON's name for it).

    - `infer(where, spec, j, data)`: checks the layer's JSON fields `j` against its input shapes
      (`spec.in_shapes`), stores what the forward needs in `spec.params`, and returns the output
      shapes (`T2` / `T3`). Errors are ModelErrors that start with `where` (file, layer, type).
    - `init_weights(spec, rng)`: the initial trainable weights, in HugeCTR's dense model-file
      order (NumPy arrays; `rng` is shared by the layers of a model, drawn in file order).
    - `make_state(spec)`: non-trainable variables (BatchNorm's running statistics), or None.
    - `regularized(weights)`: the weights an L1 / L2 regularizer covers.
    - `forward(spec, ins, weights, training, state, dropout_seed)`: the outputs (a list), from
      TensorFlow ops (so TensorFlow differentiates them).
    """

    type = ""
    is_loss = False

    def infer(self, where, spec: LayerSpec, j: dict, data) -> list:
        raise NotImplementedError

    def init_weights(self, spec: LayerSpec, rng) -> list:
        return []

    def make_state(self, spec: LayerSpec):
        return None

    def regularized(self, weights: list) -> list:
        return []

    def forward(self, spec: LayerSpec, ins: list, weights: list, training: bool, state=None,
                dropout_seed=None) -> list:
        raise NotImplementedError
