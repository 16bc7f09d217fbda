"""A small timed training loop for comparing models step by step (loss curve + throughput)."""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

__all__ = ["train_steps"]


def train_steps(model, x: dict, y: np.ndarray, batch_size: int, steps: int, warmup: int = 2, seed: int = 0):
    """Trains a compiled Keras model for `steps` batches; returns per-step losses and timings.

    Batches are drawn in a fixed shuffled order (wrapping around), converted to tensors before
    the clock starts, and fed through `model.train_on_batch` (the compiled train function),
    which returns each batch's own loss (not a running mean). The first `warmup` steps
    (tracing) are excluded from the throughput.

    Args:
        model: a compiled `keras.Model` taking the dict `x`.
        x: dict of NumPy arrays, first dimension = examples.
        y: labels `[examples]`.
        batch_size, steps: batch size and number of optimizer steps.
        warmup: steps left out of the timing.
        seed: shuffling seed.

    Returns:
        dict with `loss` (list of floats, one per step), `seconds` (per step),
        `examples_per_second` (batch_size / median step time after warm-up).

    Example:
        >>> r = train_steps(model, x, y, batch_size=512, steps=40)        # doctest: +SKIP
        >>> r["examples_per_second"]
    """
    n = len(y)
    if n < batch_size:
        raise ValueError(f"train_steps: {n} examples < batch_size {batch_size}")
    order = np.random.default_rng(seed).permutation(n)
    per_epoch = n // batch_size
    batches = []
    for s in range(steps):
        idx = order[(s % per_epoch) * batch_size:(s % per_epoch + 1) * batch_size]
        batches.append(({k: tf.constant(v[idx]) for k, v in x.items()}, tf.constant(y[idx])))
    losses, secs = [], []
    for bx, by in batches:
        t0 = time.perf_counter()
        out = model.train_on_batch(bx, by, return_dict=True)
        secs.append(time.perf_counter() - t0)
        losses.append(float(out["loss"]))
    timed = secs[warmup:] or secs
    return {"loss": losses, "seconds": secs,
            "examples_per_second": batch_size / float(np.median(timed))}
