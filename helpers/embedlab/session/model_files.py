"""HugeCTR's dense model file: raw float32 values, no header, trainable layers in JSON order.

InnerProduct / FusedInnerProduct: weight `[in, out]` row-major, then bias `[out]`; MultiCross:
per layer weight `[1, dim]` then bias `[1, dim]`; Multiply: weight `[n, k]`; BatchNorm: gamma,
beta (their running mean and variance go to `<file>.bn.json`, HugeCTR keeps them apart too).
The sparse models are `embedlab.sparse_model` folders.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._io import atomic_file

__all__ = ["write_dense", "read_dense", "DenseModelError"]


class DenseModelError(ValueError):
    """A dense model file that does not fit the model (the message names file and sizes)."""


def write_dense(path, arrays, bn_stats=None) -> Path:
    """Writes the dense weights (model-file order) atomically, flushed to disk before the rename
    (a checkpoint); BatchNorm statistics to a side file, the same way."""
    path = Path(path)
    with atomic_file(path, fsync=True) as tmp:
        with open(tmp, "wb") as f:
            for a in arrays:
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    if bn_stats:
        side = path.with_name(path.name + ".bn.json")
        with atomic_file(side, fsync=True) as tmp:
            Path(tmp).write_text(json.dumps({"layers": [
                {"name": k, "type": "BatchNorm", "mean": np.asarray(m).tolist(), "var": np.asarray(v).tolist()}
                for k, (m, v) in bn_stats.items()]}, indent=1))
    return path


def read_dense(path, shapes, layer_names=None):
    """Reads a dense model file into arrays of `shapes` (model-file order).

    Raises:
        DenseModelError when the file's size differs from what the shapes need, naming both.
    """
    path = Path(path)
    if not path.is_file():
        raise DenseModelError(f"model_file {path} does not exist")
    need = int(sum(int(np.prod(s)) for s in shapes))
    size = path.stat().st_size
    if size != 4 * need:
        raise DenseModelError(f"model_file {path}: {size} bytes, but the JSON's dense weights take "
                              f"{need} float32 values ({4 * need} bytes)"
                              + (f" for layers {', '.join(layer_names)}" if layer_names else ""))
    flat = np.fromfile(path, dtype="<f4")
    out, pos = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(flat[pos:pos + n].reshape(s))
        pos += n
    bn = None
    side = path.with_name(path.name + ".bn.json")
    if side.is_file():
        bn = {l["name"]: (np.asarray(l["mean"], np.float32), np.asarray(l["var"], np.float32))
              for l in json.loads(side.read_text())["layers"]}
    return out, bn
