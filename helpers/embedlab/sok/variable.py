"""Embedding tables sharded over the workers: `Variable` (fixed rows) and `DynamicVariable` (a
hash table that grows).

A shard is a plain per-process `tf.Variable` on the worker's own device, created outside any
strategy's variable creator (a per-worker shape cannot be mirrored: its broadcast fails). Its
gradient in `strategy.run` is a local `IndexedSlices`, never all-reduced; `OptimizerWrapper`
updates it locally. Keep shards out of Keras' weight lists (they are not `keras.Variable`s):
pass them to the tape and to `OptimizerWrapper` yourself.

A shard of 32 MiB and more on the CPU starts in a 2 MiB-aligned huge-page mapping of its own
(`embedlab._tables`), as EmbedLab's other tables do; the lookups and optimizers update it in place.
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from .. import tables as _tables
from ..plugin.placement import device_keys, distributed_owner
from . import _context

__all__ = ["Variable", "parse_mode", "is_sok_variable"]

_names = itertools.count()


def parse_mode(mode: str, world: int) -> tuple[str, int]:
    """("distributed", -1) or ("localized", rank) from a mode string, checked."""
    if not isinstance(mode, str):
        raise ValueError(f"embedlab.sok: mode must be a string, got {mode!r}")
    if mode == "distributed":
        return "distributed", -1
    m = re.fullmatch(r"localized:(\d+)", mode)
    if not m:
        raise ValueError(f"embedlab.sok: mode must be 'distributed' or 'localized:<rank>', got {mode!r}")
    r = int(m.group(1))
    if r >= world:
        raise ValueError(f"embedlab.sok: mode {mode!r} names rank {r} but there are {world} workers")
    return "localized", r


def shard_rows(global_rows: int, rank: int, world: int) -> int:
    """Rows of worker `rank`'s shard of a distributed table (row i lives on rank i % world): the
    size of `plugin.placement.device_keys(rank, global_rows, world, "distributed")`, without building it.

    Rows 0..global_rows-1 fill the ranks in whole rounds of `world` rows; row `global_rows` would
    be local row `rounds` of rank `next_owner`, so the ranks before that one hold one row more.
    """
    next_owner, rounds = distributed_owner(int(global_rows), int(world))
    return max(0, rounds + (1 if rank < next_owner else 0))


def _unique_name(name):
    return name or f"sok_var_{next(_names)}"


class _SokPlacementNames:
    """SOK's names for where a table lives, shared by `Variable` and `DynamicVariable` (both set
    `kind`, `target_rank` and `num_workers`)."""

    @property
    def target_gpu(self) -> int:
        """The rank that holds a localized table, -1 for a distributed one."""
        return self.target_rank if self.kind == "localized" else -1

    @property
    def num_gpus(self) -> int:
        """The number of workers."""
        return self.num_workers


class Variable(_SokPlacementNames, resource_variable_ops.ResourceVariable):
    """This worker's shard of an embedding table.

    Args:
        initial_value: the whole table `[rows, dim]` (array or tensor, the same on every worker),
            or an initializer (Keras initializer, or callable(shape, dtype)) together with `shape`.
        dtype: float32 (default).
        mode: "distributed" (row i on rank i % n: 17 rows on 2 workers give 9 and 8) or
            "localized:<rank>" (the whole table on one rank, `[0, dim]` elsewhere).
        shape: the global `[rows, dim]`, with an initializer.
        name: the table's name (in error messages and dump files).

    Attributes: `mode`, `target_rank` (localized) / -1, `global_shape`, `rank`, `num_workers`,
    and SOK's names `target_gpu`, `num_gpus`, `global_gpu_id`, `key_map(ids)`. Read as a
    `tf.Variable` (`tf.nn.embedding_lookup`, `numpy()`), it is this worker's shard by local row,
    as SOK's is; `sok.lookup_sparse` reads global row ids.

    Example:
        >>> import numpy as np, tensorflow as tf, embedlab.sok as sok
        >>> v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)   # [9, 3] on rank 0 of 2
    """

    def __init__(self, initial_value=None, dtype=None, mode: str = "distributed", shape=None, name=None,
                 trainable=True, **kwargs):
        ctx = _context.context()
        kind, target = parse_mode(mode, ctx.world_size)
        dtype = tf.as_dtype(dtype or tf.float32)
        name = _unique_name(name)
        if initial_value is None:
            raise ValueError("embedlab.sok.Variable: give initial_value (the whole table) or an initializer with shape")
        if callable(initial_value) and not isinstance(initial_value, (np.ndarray, tf.Tensor)):
            if shape is None or len(shape) != 2:
                raise ValueError(f"embedlab.sok.Variable {name!r}: an initializer needs shape=[rows, dim], got {shape}")
            global_shape = [int(shape[0]), int(shape[1])]
            local = self._local_rows(kind, target, global_shape[0], ctx)
            init = initial_value
            value = lambda: _tables.aligned(tf.cast(init([local, global_shape[1]], dtype=dtype), dtype))  # noqa: E731
        else:
            full = np.asarray(initial_value) if not isinstance(initial_value, tf.Tensor) else initial_value.numpy()
            if full.ndim != 2:
                raise ValueError(f"embedlab.sok.Variable {name!r}: the table must be [rows, dim], got shape {full.shape}")
            global_shape = [int(full.shape[0]), int(full.shape[1])]
            if kind == "distributed":
                part = full[device_keys(ctx.rank, global_shape[0], ctx.world_size, "distributed")]
            else:
                part = full if ctx.rank == target else full[:0]
            part = np.ascontiguousarray(part).astype(dtype.as_numpy_dtype)
            value = part
        self.mode = mode
        self.kind = kind
        self.target_rank = target
        self.global_shape = global_shape
        self.rank = ctx.rank
        self.num_workers = ctx.world_size
        self.table_name = name
        with tf.init_scope(), tf.device(ctx.device):
            if not callable(value):
                value = _tables.aligned(value)     # a copy on this worker's device (placed: see above)
            super().__init__(initial_value=value, dtype=dtype, name=name, trainable=trainable, **kwargs)

    @staticmethod
    def _local_rows(kind, target, rows, ctx):
        if kind == "distributed":
            return shard_rows(rows, ctx.rank, ctx.world_size)
        return rows if ctx.rank == target else 0

    @property
    def is_sok_variable(self) -> bool:
        return True

    # SOK's names for the same facts (DistributedVariable / LocalizedVariable); target_gpu and
    # num_gpus come from _SokPlacementNames.
    @property
    def global_gpu_id(self) -> int:
        """This worker's rank."""
        return self.rank

    def key_map(self, indices):
        """This shard's row of each global row id it owns (SOK's key_map): id // n for a
        distributed table, the id itself for a localized one."""
        return distributed_owner(indices, self.num_workers)[1] if self.kind == "distributed" else indices

    def global_rows_of_shard(self) -> np.ndarray:
        """The global row ids of this shard's rows, in order."""
        if self.kind == "distributed":
            return device_keys(self.rank, self.global_shape[0], self.num_workers, "distributed")
        return np.arange(self.shape[0], dtype=np.int64)

    def __repr__(self):
        return (f"<embedlab.sok.Variable '{self.table_name}' mode={self.mode} rank={self.rank}/{self.num_workers} "
                f"global_shape={self.global_shape} shard_shape={self.shape.as_list()}\n"
                f"{np.array2string(self.numpy(), threshold=60)}>")


def is_sok_variable(v) -> bool:
    return bool(getattr(v, "is_sok_variable", False))
