"""Notebook 01's Keras-RS section: a Keras-RS model definition trained with Keras-RS's own
`DistributedEmbedding` and with EmbedLab's (the one-line swap), on the same data.

The model is a DCN-like ranking model of Criteo's shape: `tables` categorical features (one id
per row each, its own `keras_rs.layers.TableConfig`), their activations concatenated with 13
dense features into a two-layer MLP, binary cross-entropy. Both layers get the same configs
(seeded initializers: the same starting tables), the same batches and the same SGD: Keras-RS
trains its tables with the model's optimizer (its CPU/GPU behaviour), EmbedLab with the
`TableConfig`'s optimizer fused into the lookup's backward. With SGD both apply the same update,
so the losses agree to float32 rounding. Each train step is a `tf.function`; `time_steps` times
the two models' steps interleaved, round by round, for `embedlab.timing.compare`.
"""
from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from .. import config as _config
from ..timing import interleaved_samples

__all__ = ["Size", "size_for", "feature_configs", "Trainer", "make_batches", "train_losses", "time_steps",
           "N_DENSE", "LEARNING_RATE"]

N_DENSE = 13
LEARNING_RATE = 0.05


@dataclass(frozen=True)
class Size:
    """Problem size: `tables` tables of `rows` x `dim`, batches of `batch` rows, `steps` training
    steps whose losses are compared, `repeats` timed rounds."""
    tables: int
    rows: int
    dim: int
    batch: int
    steps: int
    repeats: int


_SIZES = {
    "ci": Size(tables=26, rows=10_000, dim=16, batch=512, steps=5, repeats=9),
    "small": Size(tables=26, rows=100_000, dim=16, batch=2048, steps=8, repeats=15),
    "full": Size(tables=26, rows=1_000_000, dim=16, batch=4096, steps=10, repeats=30),
}


def size_for(scale: str | None = None) -> Size:
    """The problem size of an `EMBEDLAB_SCALE`.

    Args:
        scale: "ci", "small" or "full"; None: `embedlab.config.SCALE`'s.

    Returns:
        `Size`.

    Raises:
        ValueError: an unknown scale.

    Example:
        >>> size_for("ci").tables
        26
    """
    name = _config.SCALE.name if scale is None else scale
    if name not in _SIZES:
        raise ValueError(f"size_for: scale must be one of {sorted(_SIZES)}, got {name!r}")
    return _SIZES[name]


def _check_size(size):
    if not isinstance(size, Size):
        raise ValueError(f"size must be a keras_rs_swap.Size, got {type(size).__name__}")


def feature_configs(size: Size, seed: int = 0) -> dict:
    """The model's Keras-RS configs: feature "c<i>" -> `FeatureConfig` of its own `TableConfig`
    ("t<i>", `size.rows` x `size.dim`, sum, SGD at `LEARNING_RATE`, a seeded uniform initializer),
    one id per row.

    Args:
        size: `Size`. seed: initializer seed (the same seed, the same tables).

    Returns:
        dict feature name -> `keras_rs.layers.FeatureConfig`.

    Example:
        >>> fcs = feature_configs(Size(2, 10, 4, 8, 1, 1))
        >>> sorted(fcs), fcs["c1"].table.vocabulary_size
        (['c0', 'c1'], 10)
    """
    import keras_rs

    _check_size(size)
    tables = [keras_rs.layers.TableConfig(
        f"t{i}", size.rows, size.dim, combiner="sum",
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + i)) for i in range(size.tables)]
    return {f"c{i}": keras_rs.layers.FeatureConfig(f"c{i}", tables[i], (size.batch, 1), (size.batch, size.dim))
            for i in range(size.tables)}


class Trainer:
    """A DCN-like model around a `DistributedEmbedding` (Keras-RS's or EmbedLab's): `step(batch)`
    trains one step and returns the loss; the model's SGD trains the MLP and every trainable
    table (Keras-RS's tables; EmbedLab's are trained inside the lookup's backward).

    Args:
        embedding: the `DistributedEmbedding` layer over `feature_configs(size, ...)`.
        seed: the MLP's initializer seed.

    Example:
        >>> import keras_rs  # doctest: +SKIP
        >>> t = Trainer(keras_rs.layers.DistributedEmbedding(feature_configs(size)))  # doctest: +SKIP
    """

    def __init__(self, embedding, seed: int = 0):
        self.embedding = embedding
        glorot = keras.initializers.GlorotUniform
        self.mlp = [keras.layers.Dense(64, activation="relu", kernel_initializer=glorot(seed)),
                    keras.layers.Dense(1, kernel_initializer=glorot(seed + 1))]
        self.optimizer = keras.optimizers.SGD(learning_rate=LEARNING_RATE)
        self._step = tf.function(self._train_step)

    def _logits(self, cat, dense):
        out = self.embedding(cat)
        x = tf.concat([dense] + [out[k] for k in sorted(out, key=lambda k: int(k[1:]))], 1)
        for layer in self.mlp:
            x = layer(x)
        return x

    def _train_step(self, cat, dense, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.binary_crossentropy(labels, self._logits(cat, dense), from_logits=True))
        variables = self.embedding.trainable_variables + [v for layer in self.mlp for v in layer.trainable_variables]
        grads = tape.gradient(loss, variables)
        self.optimizer.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return loss

    def step(self, batch) -> tf.Tensor:
        """One training step on `batch` = (cat dict, dense, labels); returns the loss."""
        return self._step(*batch)

    def tables(self) -> dict:
        """Table name -> its current values (NumPy)."""
        return {k: keras.ops.convert_to_numpy(v) for k, v in self.embedding.get_embedding_tables().items()}


def make_batches(size: Size, n: int, seed: int = 0) -> list:
    """`n` batches of synthetic Criteo-shaped data: (cat {"c<i>": int32 [batch, 1]}, dense
    float32 [batch, 13], labels float32 [batch, 1]), ids skewed towards small ones (as click logs
    are) so that rows repeat within a batch.

    Example:
        >>> cat, dense, labels = make_batches(Size(2, 10, 4, 8, 1, 1), 1)[0]
        >>> cat["c0"].shape.as_list(), dense.shape.as_list()
        ([8, 1], [8, 13])
    """
    _check_size(size)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"make_batches: n must be an integer >= 1, got {n!r}")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        ids = np.minimum(rng.zipf(1.2, (size.tables, size.batch, 1)) - 1, size.rows - 1).astype(np.int32)
        cat = {f"c{i}": tf.constant(ids[i]) for i in range(size.tables)}
        dense = tf.constant(rng.normal(size=(size.batch, N_DENSE)).astype(np.float32))
        labels = tf.constant((rng.random((size.batch, 1)) < 0.25).astype(np.float32))
        out.append((cat, dense, labels))
    return out


def train_losses(trainer: Trainer, batches) -> np.ndarray:
    """The loss of each training step, one step per batch (in order).

    Example:
        >>> train_losses(trainer, batches)   # doctest: +SKIP
        array([0.69..., ...], dtype=float32)
    """
    return np.array([float(trainer.step(b)) for b in batches], np.float32)


def time_steps(trainers: dict, batch, repeats: int, warmup: int = 2) -> dict:
    """Milliseconds of each trainer's step on `batch`, interleaved round by round (both models
    keep training on that batch while timed).

    Args:
        trainers: name -> `Trainer`. batch: one batch of `make_batches`.
        repeats: timed rounds. warmup: untimed rounds first (tracing).

    Returns:
        {name: float64 array of `repeats` ms}, paired by round (for `embedlab.timing.compare`).

    Example:
        >>> t = time_steps({"keras-rs": a, "embedlab": b}, batches[0], repeats=5)   # doctest: +SKIP
    """
    return interleaved_samples({name: (lambda t=t: t.step(batch)) for name, t in trainers.items()},
                               repeats=repeats, warmup=warmup)
