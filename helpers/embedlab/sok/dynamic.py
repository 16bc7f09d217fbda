"""`DynamicVariable`: a sharded embedding table indexed by a hash table that grows as keys arrive.

Every worker holds the keys k with k mod n == its rank, in two pieces: EmbedLab's concurrent
C++ hash table (`embedlab.hash_table.HashTable`, a TensorFlow resource: key -> dense row index,
new keys take the next index) and a `[capacity, dim]` float32 variable of rows (this object). A
lookup with training inserts unseen keys; when the rows run out the variable (and the
optimizer slots the wrapper registered) grows, at least doubling, new rows drawn from the
initializer. `max_capacity` bounds the keys a worker may hold: past it, an error names the
table and the key.

The first-generation layers' `use_hashtable=True` uses the same index (`_LocalHashIndex`) over
a table of fixed capacity.
"""
from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from . import _context

__all__ = ["DynamicVariable"]

_names = itertools.count()


def _hash_table_module():
    try:
        from .. import hash_table
    except ImportError as e:  # the package is older than the hash table
        raise ImportError(f"embedlab.sok: DynamicVariable and use_hashtable=True need embedlab.hash_table ({e})") from e
    return hash_table


class _LocalHashIndex:
    """This worker's key -> row index (a TF resource), bounded by `max_size` keys (0: none)."""

    def __init__(self, max_size: int, table_name: str, initial_capacity: int = 1024):
        ht = _hash_table_module()
        self.table_name = table_name
        self.max_size = int(max_size or 0)
        with tf.init_scope(), tf.device("/device:CPU:0"):
            self.table = ht.HashTable(initial_capacity=max(16, int(initial_capacity)), name=table_name)

    def lookup_index(self, keys, insert=True):
        """Row index of every key (int64); inserts unseen keys when `insert`, else -1 for them."""
        keys = tf.convert_to_tensor(keys, tf.int64)
        with tf.device("/device:CPU:0"):
            if insert:
                return self.table.find_or_insert(keys, max_size=self.max_size)
            return self.table.find(keys)

    def size(self):
        return self.table.size()

    def export(self):
        """(keys, row indices) as NumPy arrays, in insertion order."""
        k, v = self.table.export()
        k, v = np.asarray(k), np.asarray(v)
        order = np.argsort(v, kind="stable")
        return k[order], v[order]

    def assign(self, var, keys, values):
        idx = self.lookup_index(tf.constant(np.asarray(keys, np.int64)))
        var = var.value if isinstance(getattr(var, "value", None), tf.Variable) else var   # a keras.Variable
        var.scatter_update(tf.IndexedSlices(tf.constant(np.asarray(values, np.float32)), idx))


def _initializer_fn(initializer, dim):
    if isinstance(initializer, str):
        if initializer in ("random", "uniform"):
            return lambda rows: tf.random.uniform([rows, dim], -0.05, 0.05)
        if initializer == "normal":
            return lambda rows: tf.random.normal([rows, dim], stddev=0.05)
        if initializer == "zeros":
            return lambda rows: tf.zeros([rows, dim])
        try:
            value = float(initializer)
        except ValueError:
            raise ValueError(f"embedlab.sok.DynamicVariable: initializer must be 'random', 'normal', 'zeros' or a number "
                             f"as a string (e.g. '0.5'), got {initializer!r}") from None
        return lambda rows: tf.fill(tf.stack([tf.cast(rows, tf.int32), dim]), value)
    if callable(initializer):
        return lambda rows: tf.cast(initializer(tf.stack([rows, dim]), dtype=tf.float32), tf.float32)
    raise ValueError(f"embedlab.sok.DynamicVariable: bad initializer {initializer!r}")


class DynamicVariable(resource_variable_ops.ResourceVariable):
    """This worker's part of a hash-indexed embedding table that grows.

    Args:
        dimension: the embedding size.
        initializer: "random" (uniform +-0.05), "normal", "zeros", or a number as a string ("0.5").
        key_type: tf.int64 (any int64 key is valid); dtype: tf.float32.
        mode: "distributed" (key k on rank k mod n) or "localized:<rank>".
        init_capacity: rows allocated at first (grows by doubling).
        max_capacity: most keys one worker may hold (0 or None: unbounded).
        name: the table's name.

    `sok.export(var)` gives (keys, rows) of this worker; `sok.assign(var, keys, rows)` sets rows.
    """

    def __init__(self, dimension, initializer="random", key_type=tf.int64, dtype=tf.float32, mode="distributed",
                 init_capacity=1024, max_capacity=None, name=None, var_type=None, **kwargs):
        from .variable import parse_mode
        ctx = _context.context()
        if tf.as_dtype(key_type) not in (tf.int64, tf.int32):
            raise ValueError(f"embedlab.sok.DynamicVariable: key_type must be int64, got {key_type}")
        if tf.as_dtype(dtype) != tf.float32:
            raise ValueError(f"embedlab.sok.DynamicVariable: dtype must be float32, got {dtype}")
        kind, target = parse_mode(mode, ctx.world_size)
        self.dim = int(dimension)
        if self.dim < 1:
            raise ValueError(f"embedlab.sok.DynamicVariable: dimension must be >= 1, got {dimension}")
        self.mode, self.kind, self.target_rank = mode, kind, target
        self.rank, self.num_workers = ctx.rank, ctx.world_size
        self.table_name = name or f"sok_dynamic_{next(_names)}"
        self.is_dynamic = True
        self.max_capacity = int(max_capacity or 0)
        self.init_capacity = max(1, int(init_capacity))
        self._init_rows = _initializer_fn(initializer, self.dim)
        self.initializer_name = initializer
        self.hash_index = _LocalHashIndex(self.max_capacity, self.table_name, self.init_capacity)
        self._companions = []   # (slot variable, rows -> initial rows) that grow with the table
        with tf.init_scope(), tf.device(ctx.device):
            super().__init__(initial_value=self._init_rows(self.init_capacity), dtype=tf.float32,
                             shape=tf.TensorShape([None, self.dim]), name=self.table_name, trainable=True, **kwargs)

    @property
    def is_sok_variable(self) -> bool:
        return True

    @property
    def capacity(self) -> int:
        """Rows allocated now on this worker (eager)."""
        return int(resource_variable_ops.variable_shape(self.handle)[0])

    @property
    def global_shape(self):
        return [None, self.dim]

    def add_companion(self, var, init_rows):
        """Registers an optimizer slot `[capacity, dim]` that must grow with the table."""
        self._companions.append((var, init_rows))

    def sync_companions(self):
        """Grows any registered slot that is shorter than the table (a slot created while a
        traced step was growing the table); returns the ops (run them before updating)."""
        cap = resource_variable_ops.variable_shape(self.handle, out_type=tf.int64)[0]
        ops = []
        for var, init in self._companions:
            have = resource_variable_ops.variable_shape(var.handle, out_type=tf.int64)[0]

            def grow(var=var, init=init, have=have):
                with tf.control_dependencies([var.assign(tf.concat([var.read_value(), init(cap - have)], 0),
                                                         read_value=False)]):
                    return tf.constant(True)

            ops.append(tf.cond(have < cap, grow, lambda: tf.constant(False)))
        return ops

    def _grow_to(self, need):
        cap = resource_variable_ops.variable_shape(self.handle, out_type=tf.int64)[0]

        def grow():
            new_cap = tf.maximum(need, 2 * cap)
            extra = new_cap - cap
            ops = [self.assign(tf.concat([self.read_value(), self._init_rows(extra)], 0), read_value=False)]
            for var, init in self._companions:
                ops.append(var.assign(tf.concat([var.read_value(), init(extra)], 0), read_value=False))
            with tf.control_dependencies(ops):
                return tf.constant(True)

        return tf.cond(need > cap, grow, lambda: tf.constant(False))

    def prepare_rows(self, keys, insert=True):
        """Row indices of `keys` (inserted if new and `insert`), with the rows allocated."""
        idx = self.hash_index.lookup_index(keys, insert=insert)
        if not insert:
            return idx
        with tf.control_dependencies([idx]):
            size = self.hash_index.size()
        grown = self._grow_to(size)
        with tf.control_dependencies([grown]):
            return tf.identity(idx)

    def export(self):
        """(keys, rows) of this worker, as tensors."""
        keys, idx = self.hash_index.export()
        return tf.constant(keys), tf.gather(self.read_value(), tf.constant(idx))

    def slot_rows(self, slot):
        """A slot's rows in export() order."""
        _, idx = self.hash_index.export()
        return tf.gather(tf.convert_to_tensor(slot), tf.constant(idx))

    def assign_keys(self, keys, values):
        """Sets the rows of `keys` (inserting new ones); keys must belong to this worker."""
        keys = np.asarray(keys, np.int64)
        owner = self._owner(keys)
        if (owner != self.rank).any():
            k = int(keys[owner != self.rank][0])
            raise ValueError(f"embedlab.sok.assign: key {k} of table '{self.table_name}' lives on rank "
                             f"{int(self._owner(np.array([k]))[0])}, not on this rank {self.rank}")
        idx = self.prepare_rows(tf.constant(keys))
        self.scatter_update(tf.IndexedSlices(tf.constant(np.asarray(values, np.float32)), idx))

    def _owner(self, keys):
        if self.kind == "localized":
            return np.full(keys.shape, self.target_rank)
        return np.mod(keys, self.num_workers)

    def load_all(self, keys, rows, slots):
        """Keeps this worker's keys of a whole dumped table (and slots)."""
        keys = np.asarray(keys, np.int64)
        mine = self._owner(keys) == self.rank
        if mine.any():
            idx = self.prepare_rows(tf.constant(keys[mine]))
            self.scatter_update(tf.IndexedSlices(tf.constant(rows[mine]), idx))
            for svar, srows in slots:
                svar.scatter_update(tf.IndexedSlices(tf.constant(srows[mine]), idx))

    def __repr__(self):
        return (f"<embedlab.sok.DynamicVariable '{self.table_name}' dim={self.dim} mode={self.mode} "
                f"rank={self.rank}/{self.num_workers} capacity={self.capacity}>")
