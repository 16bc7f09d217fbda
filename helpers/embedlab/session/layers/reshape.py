"""Layers that move values without arithmetic: Reshape, Concat, Slice."""
from __future__ import annotations

import tensorflow as tf

from .._schema import T2, T3, ModelError, need
from .base import Layer, one_2d

__all__ = ["Reshape", "Concat", "Slice"]


class Reshape(Layer):
    """`[rows, cols]` (or an embedding's `[batch, slots, vec]`) to `[-1, leading_dim]`."""
    type = "Reshape"

    def infer(self, where, spec, j, data):
        ins = spec.in_shapes
        if len(ins) != 1:
            raise ModelError(f"{where}: takes one bottom")
        s = ins[0]
        ld = need(j, "leading_dim", where, int)
        last, per_sample = (s.vec, s.slots * s.vec) if isinstance(s, T3) else (s.cols, s.rows * s.cols)
        if ld < last or ld % last or per_sample % ld:
            raise ModelError(f"{where}: field 'leading_dim' {ld} does not fit bottom {spec.bottoms[0]!r} "
                             f"({per_sample} values per sample, last dimension {last}): it must be a "
                             f"multiple of {last} that divides {per_sample}")
        spec.params["leading_dim"] = ld
        return [T2(per_sample // ld, ld)]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.reshape(ins[0], [-1, spec.params["leading_dim"]])]


class Concat(Layer):
    """1 to 5 tensors of one row count, joined along the columns."""
    type = "Concat"

    def infer(self, where, spec, j, data):
        ins = spec.in_shapes
        if not 1 <= len(ins) <= 5:
            raise ModelError(f"{where}: Concat joins 1 to 5 tensors, got {len(ins)}")
        for b, s in zip(spec.bottoms, ins):
            if not isinstance(s, T2):
                raise ModelError(f"{where}: bottom {b!r} is 3-D; Concat joins 2-D tensors")
        rows = {s.rows for s in ins}
        if len(rows) != 1:
            desc = ", ".join(f"{b!r}: [{s.rows} x batch, {s.cols}]" for b, s in zip(spec.bottoms, ins))
            raise ModelError(f"{where}: bottoms have different batch (row) counts: {desc}")
        return [T2(ins[0].rows, sum(s.cols for s in ins))]

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [tf.concat(ins, axis=1)] if len(ins) > 1 else [tf.identity(ins[0])]


class Slice(Layer):
    """Column ranges `[begin, end)` of one tensor, one output each (they may overlap)."""
    type = "Slice"

    def infer(self, where, spec, j, data):
        s = one_2d(where, spec)
        ranges = need(j, "ranges", where)
        if not isinstance(ranges, list) or not ranges:
            raise ModelError(f"{where}: field 'ranges' must be a list of [begin, end) pairs")
        out = []
        for r in ranges:
            if (not isinstance(r, list) or len(r) != 2 or not all(isinstance(x, int) for x in r)
                    or not 0 <= r[0] < r[1] <= s.cols):
                raise ModelError(f"{where}: range {r!r} in field 'ranges' is out of range for bottom "
                                 f"{spec.bottoms[0]!r} of {s.cols} columns (need 0 <= begin < end <= {s.cols})")
            out.append(T2(s.rows, r[1] - r[0]))
        spec.params["ranges"] = [list(r) for r in ranges]
        return out

    def forward(self, spec, ins, weights, training, state=None, dropout_seed=None):
        return [ins[0][:, a:b] for a, b in spec.params["ranges"]]
