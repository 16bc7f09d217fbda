"""Where EmbedLab's embedding tables live on the CPU: each large table in a memory mapping of its
own that starts on a 2 MiB boundary and is backed by 2 MiB huge pages.

Why: TensorFlow's CPU allocator starts every large buffer 64 bytes into a page, so a 256-byte row
(dim 64) straddles three 128-byte cache-line pairs instead of two, and every random row read
pays for the extra pair (the numbers are on the documentation's benchmarks page, *Tables placed
by EmbedLab*).

How a table gets there (the op library's csrc/tf/table_placement.h): `aligned(value)` (op
`EmbedLabAlignedTable`) copies an initial value into such a mapping, `zeros(shape)` (op
`EmbedLabZerosTable`) gives a fresh one, zero as mapped (no copy, no page touched until written),
and a `tf.Variable` (or a Keras variable) built from either keeps that buffer, since TensorFlow's
variables adopt their initial value's buffer. `assign(variable, value)` (op `EmbedLabAssignTable`)
gives a table a new value and keeps it there: in place when no one else holds the buffer, else in
a new mapping.

What is placed (created with `aligned`, `zeros` or `initializer`; a whole new value goes in with
`assign`):

- `EmbeddingLayer`'s and `FusedEmbedding`'s tables;
- the state `embedlab.optimizers` keeps for a table (Adam's moments, Adagrad's accumulator;
  written back on Keras loading);
- the Session's working tables and `TFOptimizer`'s state of a table (oversubscription's per-pass
  writes and model loading write them in place);
- `embedlab.sok`'s shards (`sok.Variable`), the first-generation layers' tables and
  `OptimizerWrapper`'s state of a static shard (`sok.load`, `Saver.restore_from_file`).

Not placed: `sok.DynamicVariable` (it grows by concatenation), the tutorials' plain TensorFlow
tables. The lookups read the tables where they are; the sparse optimizers update the rows in
place, so training keeps a table where it is, except the Session's Global MomentumSGD / Nesterov
update, whose dense rule gives the table TensorFlow's buffer at its first step.

What moves a table back into TensorFlow's allocator: TensorFlow's own `variable.assign(value)`
and `tf.train.Checkpoint.restore` (the variable takes the value's buffer). The lookup does not
move such a table back: a copy would free the old buffer into TensorFlow's CPU allocator, whose
pool (oneDNN's, on by default on x86) keeps it, so the process would hold the table twice.

Tables under 32 MiB stay where TensorFlow puts them (they sit in the caches). The environment
setting `EMBEDLAB_ALIGNED_TABLES=0` turns this off (tables stay in TensorFlow's buffers, 64 bytes
into a page; `EMBEDLAB_HUGE_PAGES=0` keeps them off huge pages).
"""
from __future__ import annotations

import functools
import os

import tensorflow as tf

from . import _native

__all__ = ["aligned", "zeros", "initializer", "assign", "address", "LARGE_TABLE_BYTES", "ALIGNMENT"]

LARGE_TABLE_BYTES = 32 << 20   # csrc/core/huge_pages.h kLargeTableBytes
ALIGNMENT = 2 << 20            # csrc/core/huge_pages.h kTableAlignment


@functools.lru_cache(maxsize=None)
def _enabled() -> bool:
    """EMBEDLAB_ALIGNED_TABLES, read once per process as the op library reads it (huge_pages_cpu.cc)."""
    return os.environ.get("EMBEDLAB_ALIGNED_TABLES", "") not in ("0", "off")


def _on_cpu(value) -> bool:
    device = getattr(value, "device", "") or ""
    return not device or tf.DeviceSpec.from_string(device).device_type in (None, "CPU")


def aligned(value):
    """`value` (a float32 table) in a 2 MiB-aligned huge-page mapping of its own.

    Args:
        value: float32 tensor (or anything `tf.convert_to_tensor` takes). Tensors on a GPU, of
            another dtype, or under 32 MiB are returned as they are.

    Returns:
        A tensor with the same values; build a `tf.Variable` (or return it from a Keras
        initializer) to give the variable that buffer. Costs one copy of the table.

    Example:
        >>> t = aligned(tf.zeros([1 << 20, 8]))
        >>> v = tf.Variable(t)
        >>> address(v) % ALIGNMENT
        0
    """
    value = tf.convert_to_tensor(value)
    if value.dtype != tf.float32 or not _on_cpu(value):
        return value
    if value.shape.is_fully_defined() and value.shape.num_elements() * 4 < LARGE_TABLE_BYTES:
        return value     # the op would return it as it is, too
    with tf.device(getattr(value, "device", "") or None):   # the same (logical) CPU device
        return _native.tf_ops().embed_lab_aligned_table(value)


def zeros(shape, dtype=tf.float32):
    """A `[rows, dim]` table of zeros, as `aligned(tf.zeros(shape))` gives, without its cost.

    Args:
        shape: `[rows, dim]`.
        dtype: float32 (other dtypes: `tf.zeros`, TensorFlow's buffer).

    Returns:
        A float32 tensor of zeros. Of 32 MiB and more on the CPU, a fresh aligned huge-page mapping
        (op `EmbedLabZerosTable`): zero as mapped, so nothing is copied and no page is touched
        until the table is first written, where `aligned(tf.zeros(...))` holds the table twice
        while it copies and faults in every page. Build a `tf.Variable` from it, as from `aligned`.

    Example:
        >>> v = tf.Variable(zeros([1 << 20, 8]))
        >>> address(v) % ALIGNMENT, float(tf.reduce_sum(v))
        (0, 0.0)
    """
    dims = [int(d) for d in shape]
    if len(dims) != 2 or min(dims) < 0:
        raise ValueError(f"embedlab.tables.zeros: shape must be [rows, dim], got {list(shape)}")
    if tf.as_dtype(dtype) != tf.float32:
        return tf.zeros(dims, dtype)
    # Placed only where `aligned(tf.zeros(shape))` would place it: where TensorFlow puts a zeros
    # tensor under the device scope in force (a GPU, where one is visible and no CPU scope is
    # set, keeps tf.zeros).
    probe = tf.zeros([])
    if not _on_cpu(probe) or dims[0] * dims[1] * 4 < LARGE_TABLE_BYTES:
        return tf.zeros(dims)
    with tf.device(getattr(probe, "device", "") or None):
        return _native.tf_ops().embed_lab_zeros_table(tf.constant(dims, tf.int64), T=tf.float32)


def initializer(init):
    """A Keras initializer whose value is put in a table mapping by `aligned` (`zeros` for Keras's
    zeros initializer): give it to `add_weight` for an embedding table. `init` is anything
    `keras.initializers.get` takes: a name ("zeros"), a config, or a callable
    `init(shape, dtype=None)`.

    Example:
        >>> import keras
        >>> init = initializer(keras.initializers.Constant(0.5))
        >>> float(init((4, 2), "float32")[0, 0])
        0.5
    """
    import keras
    init = keras.initializers.get(init)

    def build(shape, dtype=None, **kwargs):
        if (isinstance(init, keras.initializers.Zeros) and len(shape) == 2
                and tf.as_dtype(dtype or "float32") == tf.float32):
            return zeros(shape)
        return aligned(init(shape, dtype=dtype, **kwargs))
    return build


def _variable(variable, where):
    """The tf.Variable behind a tf.Variable or a Keras variable."""
    if isinstance(variable, tf.Variable):
        return variable
    inner = getattr(variable, "value", None)   # keras.Variable on the TensorFlow backend
    if isinstance(inner, tf.Variable):
        return inner
    raise ValueError(f"embedlab.tables.{where}: need a tf.Variable or a Keras variable, got {type(variable).__name__}")


def _large(value) -> bool:
    return (value.dtype == tf.float32 and _on_cpu(value) and value.shape.is_fully_defined()
            and value.shape.num_elements() * 4 >= LARGE_TABLE_BYTES)


def assign(variable, value) -> None:
    """`variable.assign(value)` that keeps a large CPU table in its aligned huge-page mapping.

    The values are copied into the variable's own mapping when no one else holds it (a read
    value, a DLPack view, another variable), else into a new mapping; whoever held the old buffer
    keeps the old values, as with `assign`. Other variables (under 32 MiB, on a GPU, not float32,
    mirrored by a `tf.distribute` strategy) and `EMBEDLAB_ALIGNED_TABLES=0` get TensorFlow's
    `assign`.

    Args:
        variable: a `tf.Variable` or Keras variable.
        value: the new value, of the variable's shape and dtype (anything `tf.convert_to_tensor`
            takes).

    Raises:
        ValueError: the value's shape differs from the variable's.

    Example:
        >>> v = tf.Variable(aligned(tf.zeros([1 << 20, 8])))
        >>> assign(v, tf.ones([1 << 20, 8]))
        >>> float(v[3, 0]), address(v) % ALIGNMENT
        (1.0, 0)
    """
    var = _variable(variable, "assign")
    if isinstance(var, tf.distribute.DistributedValues):
        # A variable of a tf.distribute strategy (one copy per replica): outside a replica its
        # handle is the first copy's alone, so the strategy's own assign writes every copy.
        var.assign(value)
        return
    # The value is made where the variable lives: where a GPU is visible, a NumPy value converted
    # with no device scope can land on it, and the table would then leave its mapping (or make a
    # round trip through the GPU) only because of where its new value was put.
    with tf.device(var.handle.device or None):
        value = tf.convert_to_tensor(value, dtype=var.dtype)
        if not var.shape.is_compatible_with(value.shape):
            raise ValueError(f"embedlab.tables.assign: value of shape {value.shape} for variable {var.name!r} "
                             f"of shape {var.shape}")
        if not (_large(value) and _on_cpu(var.handle) and _enabled()):
            var.assign(value)
            return
        _native.tf_ops().embed_lab_assign_table(var.handle, value)


def address(variable) -> int:
    """The address of a variable's buffer now (a `tf.Variable` or a Keras variable on the CPU).

    Example:
        >>> address(tf.Variable(aligned(tf.zeros([1 << 20, 8])))) % ALIGNMENT
        0
    """
    return int(_native.tf_ops().embed_lab_table_address(_variable(variable, "address").handle))
