"""Request checks shared by the python-backend models (NumPy only: runs inside Triton's stub).

Each check returns None when the request is good, or a message naming the input and the
problem; the model turns a message into a Triton error response for that request alone, so the
other requests of a dynamic batch, and the server, carry on.
"""
from __future__ import annotations

import numpy as np


def check_keys(keys, numkeys, keys_per_sample: int, max_batch_size: int,
               keys_name: str = "KEYS", numkeys_name: str = "NUMKEYS") -> str | None:
    """Checks one request of the embedding model.

    Args:
        keys: the request's KEYS array, expected int64 [batch, keys_per_sample].
        numkeys: the request's NUMKEYS array, expected int32 [batch, 1], every entry equal to
            the number of keys per sample (HugeCTR's NUMKEYS, one count per sample).
    """
    if keys is None:
        return f"input {keys_name} is missing"
    if numkeys is None:
        return f"input {numkeys_name} is missing"
    if keys.dtype != np.int64:
        return f"input {keys_name} has dtype {keys.dtype}, expected int64 (TYPE_INT64)"
    if numkeys.dtype != np.int32:
        return f"input {numkeys_name} has dtype {numkeys.dtype}, expected int32 (TYPE_INT32)"
    if keys.ndim != 2 or keys.shape[1] != keys_per_sample:
        return (f"input {keys_name} has shape {list(keys.shape)}, expected [batch, {keys_per_sample}] "
                f"({keys_per_sample} keys per sample)")
    batch = keys.shape[0]
    if batch > max_batch_size:
        return f"input {keys_name} has batch {batch}, above max_batch_size {max_batch_size}"
    if numkeys.shape != (batch, 1):
        return (f"input {numkeys_name} has shape {list(numkeys.shape)}, expected [{batch}, 1] "
                f"(one count per sample of {keys_name})")
    bad = np.flatnonzero(numkeys[:, 0] != keys_per_sample)
    if bad.size:
        i = int(bad[0])
        return (f"input {numkeys_name}[{i}] = {int(numkeys[i, 0])} disagrees with {keys_name}, "
                f"which holds {keys_per_sample} keys per sample")
    neg = np.argwhere(keys < 0)
    if neg.size:
        i, j = (int(v) for v in neg[0])
        return (f"input {keys_name}[{i}, {j}] = {int(keys[i, j])} is a negative key "
                f"({len(neg)} negative in this request); keys must be >= 0")
    return None


def check_vectors(vectors, expected_tail: tuple, max_batch_size: int,
                  name: str = "LOOKUP_VECTORS") -> str | None:
    """Checks one request of the dense model: float32 [batch, *expected_tail], finite."""
    if vectors is None:
        return f"input {name} is missing"
    if vectors.dtype != np.float32:
        return f"input {name} has dtype {vectors.dtype}, expected float32 (TYPE_FP32)"
    if vectors.ndim != 1 + len(expected_tail) or tuple(vectors.shape[1:]) != tuple(expected_tail):
        return f"input {name} has shape {list(vectors.shape)}, expected [batch, {', '.join(map(str, expected_tail))}]"
    if vectors.shape[0] > max_batch_size:
        return f"input {name} has batch {vectors.shape[0]}, above max_batch_size {max_batch_size}"
    if not np.isfinite(vectors).all():
        return f"input {name} holds non-finite values (NaN or inf)"
    return None
