"""HugeCTR's dense model file: raw float32 values, no header, trainable layers in JSON order.

InnerProduct / FusedInnerProduct: weight `[in, out]` row-major, then bias `[out]`; MultiCross:
per layer weight `[1, dim]` then bias `[1, dim]`; Multiply: weight `[n, k]`; BatchNorm: gamma,
beta (their running mean and variance go to `<file>.bn.json`, HugeCTR keeps them apart too).
The sparse models are `embedlab.sparse_model` folders. Like HugeCTR's, the file has no header
and no checksum (only its size is checked against the model); a failed write raises an
`OSError` naming the file and keeping the OS's errno.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._io import atomic_set

__all__ = ["write_dense", "read_dense", "DenseModelError"]


class DenseModelError(ValueError):
    """A dense model file that does not fit the model (the message names file and sizes)."""


def dense_paths(path, bn_stats=None) -> list[Path]:
    """The files `write_dense` writes: the model file, and its `.bn.json` side file if any."""
    path = Path(path)
    return [path] + ([path.with_name(path.name + ".bn.json")] if bn_stats else [])


def write_dense_into(tmps, path, arrays, bn_stats=None) -> None:
    """Writes the files of `dense_paths(path, bn_stats)` to the temporaries `tmps` (for a
    caller that renames them into place, with others, in one `atomic_set`)."""
    path = Path(path)
    try:
        with open(tmps[0], "wb") as f:
            for a in arrays:
                f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
    except OSError as e:
        raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from e
    if bn_stats:
        side = dense_paths(path, bn_stats)[1]
        try:
            Path(tmps[1]).write_text(json.dumps({"layers": [
                {"name": k, "type": "BatchNorm", "mean": np.asarray(m).tolist(), "var": np.asarray(v).tolist()}
                for k, (m, v) in bn_stats.items()]}, indent=1))
        except OSError as e:
            raise OSError(e.errno, f"cannot write {side}: {e.strerror or e}") from e


def write_dense(path, arrays, bn_stats=None) -> Path:
    """Writes the dense weights (model-file order) and the BatchNorm statistics' side file
    together atomically (both or neither replaced), flushed to disk before the renames.

    Args:
        path: the model file.
        arrays: the trainable arrays in model-file order (written as float32).
        bn_stats: {BatchNorm layer name: (running mean, running variance)} or None.

    Returns:
        `Path(path)`.

    Raises:
        OSError: naming the file, with the OS's errno (ENOSPC on a full disk).

    Example:
        >>> import tempfile
        >>> p = Path(tempfile.mkdtemp()) / "ck_dense_0.model"
        >>> write_dense(p, [np.ones((2, 3)), np.zeros(3)]).stat().st_size
        36
    """
    files = dense_paths(path, bn_stats)
    with atomic_set(files, fsync=True) as tmps:
        write_dense_into(tmps, path, arrays, bn_stats)
    return Path(path)


def read_dense(path, shapes, layer_names=None):
    """Reads a dense model file into arrays of `shapes` (model-file order).

    Raises:
        DenseModelError: the file's size differs from what the shapes need (naming both).
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
        try:
            bn = {l["name"]: (np.asarray(l["mean"], np.float32), np.asarray(l["var"], np.float32))
                  for l in json.loads(side.read_bytes().decode("utf-8"))["layers"]}
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
            raise DenseModelError(f"model_file {path}: its BatchNorm statistics {side} are corrupt: "
                                  f"{type(e).__name__}: {e}") from e
    return out, bn
