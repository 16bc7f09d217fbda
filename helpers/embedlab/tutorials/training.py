"""Notebook 01's timing helpers: a timed step-by-step training loop for comparing models (loss
curve + throughput) and the comparison of two models' step times worded from their spread, and
one optimizer step on an embedding table, built to be timed."""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

__all__ = ["sparse_update_ms", "sparse_update_step", "train_steps", "train_steps_interleaved", "step_time_report"]


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
        >>> import keras, numpy as np
        >>> inp = keras.Input((3,), name="f")
        >>> model = keras.Model({"f": inp}, keras.layers.Dense(1)(inp))
        >>> model.compile("sgd", "mse")
        >>> r = train_steps(model, {"f": np.ones((64, 3), np.float32)}, np.ones(64, np.float32),
        ...                 batch_size=16, steps=5)
        >>> len(r["loss"]), r["examples_per_second"] > 0
        (5, True)
    """
    return train_steps_interleaved({"model": model}, x, y, batch_size, steps, warmup, seed)["model"]


def _batches(x: dict, y: np.ndarray, batch_size: int, steps: int, seed: int, where: str) -> list:
    n = len(y)
    if n < batch_size:
        raise ValueError(f"{where}: {n} examples < batch_size {batch_size}")
    order = np.random.default_rng(seed).permutation(n)
    per_epoch = n // batch_size
    batches = []
    for s in range(steps):
        idx = order[(s % per_epoch) * batch_size:(s % per_epoch + 1) * batch_size]
        batches.append(({k: tf.constant(v[idx]) for k, v in x.items()}, tf.constant(y[idx])))
    return batches


def train_steps_interleaved(models: dict, x: dict, y: np.ndarray, batch_size: int, steps: int, warmup: int = 2,
                            seed: int = 0) -> dict:
    """Trains several compiled Keras models on the same batches, one step of each in turn.

    Step i of every model runs on the same batch, back to back, so a slow phase of a shared
    machine hits them alike and their step times are paired (compare them with
    `embedlab.timing.compare`, as `step_time_report` does). Each model's training is what
    `train_steps` would do alone: the models share nothing but the batches.

    Args:
        models: name -> compiled `keras.Model` taking the dict `x`.
        x, y, batch_size, steps, warmup, seed: as `train_steps`.

    Returns:
        {name: `train_steps`' dict (loss, seconds, examples_per_second)}.

    Example:
        >>> import keras, numpy as np
        >>> def make():
        ...     inp = keras.Input((3,), name="f")
        ...     m = keras.Model({"f": inp}, keras.layers.Dense(1)(inp)); m.compile("sgd", "mse"); return m
        >>> r = train_steps_interleaved({"a": make(), "b": make()}, {"f": np.ones((64, 3), np.float32)},
        ...                             np.ones(64, np.float32), batch_size=16, steps=4)
        >>> [len(v["seconds"]) for v in r.values()]
        [4, 4]
    """
    if not models:
        raise ValueError("train_steps_interleaved: models is empty")
    batches = _batches(x, y, batch_size, steps, seed, "train_steps_interleaved")
    losses = {name: [] for name in models}
    secs = {name: [] for name in models}
    for bx, by in batches:
        for name, model in models.items():
            t0 = time.perf_counter()
            out = model.train_on_batch(bx, by, return_dict=True)
            secs[name].append(time.perf_counter() - t0)
            losses[name].append(float(out["loss"]))
    result = {}
    for name in models:
        timed = secs[name][warmup:] or secs[name]
        result[name] = {"loss": losses[name], "seconds": secs[name],
                        "examples_per_second": batch_size / float(np.median(timed))}
    return result


def step_time_report(runs: dict, a: str, b: str, warmup: int = 2) -> tuple:
    """(markdown lines, comparisons): model `a` against model `b` on each dataset, from the step
    times `train_steps_interleaved` recorded, worded from their spread, and whether the ratio
    moved between the datasets beyond it.

    Step i of both models ran on the same batch, back to back, so the steps are paired: the spread
    is the middle half of the per-step ratios (`embedlab.timing.compare`).

    Args:
        runs: `{(dataset, model): train_steps result}`, holding `a` and `b` for every dataset.
        a, b: the two models' names. warmup: leading steps left out (tracing).

    Returns:
        (list of markdown lines, `{dataset: Comparison}` with `ratio` = b's step time / a's).

    Example:
        >>> r = {("d", "x"): {"seconds": [9, 9, 1.0, 1.1, 0.9]}, ("d", "y"): {"seconds": [9, 9, 2.0, 2.1, 1.9]}}
        >>> lines, c = step_time_report(r, "x", "y")
        >>> c["d"].faster
        'x'
    """
    from ..timing import compare
    datasets = list(dict.fromkeys(d for d, _ in runs))
    cmp = {}
    for d in datasets:
        for m in (a, b):
            if (d, m) not in runs:
                raise ValueError(f"step_time_report: runs lack ({d!r}, {m!r})")
        sa, sb = (np.asarray(runs[(d, m)]["seconds"][warmup:] or runs[(d, m)]["seconds"]) for m in (a, b))
        cmp[d] = compare(sa, sb, a, b)
    lines = [f"- {d}: {c.sentence()}." for d, c in cmp.items()]
    if len(datasets) >= 2:
        first, last = cmp[datasets[0]], cmp[datasets[-1]]
        moved = f"{b}'s step took {first.ratio:.2f}x the time of {a}'s on {datasets[0]} " \
                f"({first.low:.2f}-{first.high:.2f}x) and {last.ratio:.2f}x on {datasets[-1]} " \
                f"({last.low:.2f}-{last.high:.2f}x)"
        if first.high < last.low or last.high < first.low:
            lines.append(f"- Between the tables the ratio moved beyond its spread: {moved}.")
        else:
            lines.append(f"- Between the tables the ratio stayed within its spread: {moved}; the ranges overlap.")
    return lines, cmp


WARMUP_STEPS = 4


def sparse_update_step(make_optimizer, rows: int, dim: int, touched: int, seed: int = 0):
    """One optimizer step on a `[rows, dim]` table from a batch's gradient, as a callable to time.

    The gradient is an `IndexedSlices` of `touched` distinct random rows (what a lookup's backward
    gives); the step is `optimizer.apply_gradients` inside a `tf.function`, traced and run
    `WARMUP_STEPS` times here. An optimizer that treats the table as dense (Keras' Adam decays the moments of every
    row) costs time in proportion to `rows`; a sparse one (EmbedLab's lazy Adam) in proportion to
    `touched`. Each call applies one more step to the same table.

    Args:
        make_optimizer: a callable returning a fresh optimizer.
        rows, dim: table shape. touched: gradient rows per step (at most `rows`).

    Returns:
        A callable without arguments running one step; it returns the optimizer's step counter
        (a tensor: reading it waits for the step). Time several with `embedlab.timing.interleaved_ms`.
        Its `table` and `touched_rows` attributes are the variable and the gradient's rows.

    Example:
        >>> import keras
        >>> from embedlab.timing import interleaved_ms
        >>> step = sparse_update_step(lambda: keras.optimizers.Adam(1e-3), 1000, 16, 64)
        >>> interleaved_ms({"keras": step}, repeats=3)["keras"] > 0
        True
    """
    if not 0 < touched <= rows:
        raise ValueError(f"sparse_update_step: touched must be in [1, rows={rows}], got {touched}")
    rng = np.random.default_rng(seed)
    table = tf.Variable(rng.uniform(-0.05, 0.05, (rows, dim)).astype(np.float32))
    grad = tf.IndexedSlices(tf.constant(rng.standard_normal((touched, dim)).astype(np.float32)),
                            tf.constant(np.sort(rng.choice(rows, touched, replace=False)).astype(np.int64)),
                            tf.constant([rows, dim], tf.int64))
    opt = make_optimizer()
    opt.build([table])

    @tf.function
    def step():
        opt.apply_gradients([(grad, table)])
        # Not a read of the table: after a sparse update TensorFlow copies a variable whole on
        # every plain read, which would be timed too.
        return tf.identity(opt.iterations)

    # Warm-up: the first call traces; three more warm the caches, and keep TensorFlow's retracing
    # warning quiet when several steps are built in a row (each is a new tf.function of the same
    # Python code: it warns when 5 of the last 10 calls of that code traced).
    for _ in range(WARMUP_STEPS):
        step().numpy()
    step.table, step.touched_rows = table, grad.indices      # for inspection
    return step


def sparse_update_ms(make_optimizer, rows: int, dim: int, touched: int, repeats: int = 5, seed: int = 0) -> float:
    """Median milliseconds of one optimizer step on a `[rows, dim]` table (`sparse_update_step`),
    over `repeats` steps after the traced one. To compare optimizers or sizes, build their steps
    with `sparse_update_step` and time them in turn with `embedlab.timing.interleaved_ms`.

    Example:
        >>> import keras
        >>> sparse_update_ms(lambda: keras.optimizers.Adam(1e-3), 1000, 16, 64, repeats=3) > 0
        True
    """
    from ..timing import interleaved_ms
    return interleaved_ms({"step": sparse_update_step(make_optimizer, rows, dim, touched, seed)},
                          repeats=repeats, warmup=0)["step"]
