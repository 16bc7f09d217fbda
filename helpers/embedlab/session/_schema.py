"""What the JSON parser (`spec.py`) and the layer classes (`layers/`) share: `ModelError`, the
tensor shapes `T2` / `T3`, `LayerSpec`, and the readers of a layer's JSON fields."""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ModelError", "T2", "T3", "LayerSpec", "need", "names"]


class ModelError(ValueError):
    """A JSON model file that cannot be built; the message names the layer and the field."""


@dataclass(frozen=True)
class T2:
    """A 2-D tensor [batch * rows, cols]."""
    rows: int
    cols: int


@dataclass(frozen=True)
class T3:
    """A 3-D tensor [batch, slots, vec] (embedding output)."""
    slots: int
    vec: int


@dataclass
class LayerSpec:
    name: str
    type: str
    bottoms: list
    tops: list
    in_shapes: list
    out_shapes: list
    params: dict = field(default_factory=dict)


def need(d, key, where, kind=None):
    """`d[key]`, checked to be there (and of `kind`: int, float or str); else a ModelError naming
    `where` and the field."""
    if not isinstance(d, dict) or key not in d:
        raise ModelError(f"{where}: missing field {key!r}")
    v = d[key]
    if kind is int:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or int(v) != v:
            raise ModelError(f"{where}: field {key!r} must be an integer, got {v!r}")
        return int(v)
    if kind is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelError(f"{where}: field {key!r} must be a number, got {v!r}")
        return float(v)
    if kind is str and not isinstance(v, str):
        raise ModelError(f"{where}: field {key!r} must be a string, got {v!r}")
    return v


def names(v, where, field_name):
    """A `bottom` / `top` field as a list of names."""
    if isinstance(v, str):
        return [v]
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return list(v)
    raise ModelError(f"{where}: field {field_name!r} must be a name or a list of names, got {v!r}")
