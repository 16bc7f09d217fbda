"""A concurrent int64 -> int64 hash table as a TensorFlow resource.

`HashTable` maps any int64 key to an int64 value (typically a row index into an embedding
table). `find_or_insert` gives each new key the next dense index, `size()` at its insertion,
keys taken in order of first occurrence (row-major), so the same sequence of calls gives the
same indices whatever the thread count. It is the table behind SOK's DynamicVariable, the HPS
hash_map tier and the Session's oversubscription working set (one C++ implementation,
`csrc/core/hash_table.h`; `embedlab.core().HashTable` is the same table for NumPy).

Works eagerly and inside `tf.function`; keys may have any shape (values come back shaped like
them). The table is saved by `tf.train.Checkpoint` (its exported keys and values) and can be
exported in a SavedModel. Every op runs on the CPU.

By default each `HashTable` owns its table (a ref-counting resource handle, like TensorFlow's
anonymous lookup tables): it is freed with the object, and a SavedModel loaded in the same
process gets its own table, restored from the saved contents. `shared_name="..."` instead
names the table in the resource manager: every `HashTable` (and graph) with that name shares
one table, which lives until the process ends (like `MutableHashTable(shared_name=...)`).

Example:
    >>> t = HashTable(initial_capacity=16)
    >>> t.find_or_insert(tf.constant([[7, -3], [7, 0]], tf.int64)).numpy().tolist()
    [[0, 1], [0, 2]]
    >>> t.find(tf.constant([0, 5], tf.int64)).numpy().tolist()
    [2, -1]
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from . import _native

__all__ = ["HashTable"]

# Loaded at import, so that a missing or mismatched library fails here with its fix.
_native.tf_ops()

_OPS = ("Handle", "AnonymousHandle", "Find", "FindOrInsert", "Insert", "Erase", "Size", "Export", "Clear")
for _op in _OPS:
    tf.no_gradient("EmbedLabHashTable" + _op)


_MAX_KEYS = 1 << 40  # HashTable::kMaxKeys


def _lib():
    return _native.tf_ops()


def _int64(x, what: str) -> tf.Tensor:
    """x as an int64 tensor; int32 is widened (lossless), anything else is refused."""
    if isinstance(x, (tf.SparseTensor, tf.RaggedTensor)):
        raise TypeError(f"{what} must be a dense int64 tensor, got {type(x).__name__}")
    t = x if isinstance(x, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(x)
    if t.dtype == tf.int64:
        return t
    if t.dtype == tf.int32:
        return tf.cast(t, tf.int64)
    raise TypeError(f"{what} must be int64 (or int32), got {t.dtype.name}")


class HashTable(tf.saved_model.experimental.TrackableResource):
    """Concurrent int64 -> int64 hash table (open addressing, linear probing), on the CPU.

    Args:
        initial_capacity: keys that fit before the first rehash (the table grows as needed).
        name: a name for the table, shown in error messages.
        shared_name: None (default) for a table owned by this object; a string to share one
            table by that name (container "") across objects and graphs of this process.

    Thread safety: finds run concurrently (a reader/writer lock); inserts, erases and clears
    take the lock exclusively. Each op is atomic. Values are int64; -1 means "absent" in
    `find`, so do not store -1 with `insert`.
    """

    def __init__(self, initial_capacity: int = 1024, name: str | None = None, shared_name: str | None = None):
        if (isinstance(initial_capacity, bool) or not isinstance(initial_capacity, int)
                or not 1 <= initial_capacity <= _MAX_KEYS):
            raise ValueError(f"HashTable: initial_capacity must be an int in [1, 2**40], got {initial_capacity!r}")
        self._initial_capacity = int(initial_capacity)
        if shared_name is not None and (not isinstance(shared_name, str) or not shared_name):
            raise ValueError(f"HashTable: shared_name must be a non-empty string or None, got {shared_name!r}")
        self._name = name or shared_name or f"hash_table_{tf_ops.uid()}"
        self._shared_name = shared_name
        super().__init__(device="/CPU:0")
        with tf.init_scope():
            self._resource_handle = self._create_resource()

    @property
    def name(self) -> str:
        return self._name

    @property
    def shared_name(self) -> str | None:
        return self._shared_name

    def _create_resource(self):
        if self._shared_name is None:
            return _lib().embed_lab_hash_table_anonymous_handle(
                initial_capacity=self._initial_capacity, debug_name=self._name)
        return _lib().embed_lab_hash_table_handle(
            shared_name=self._shared_name, initial_capacity=self._initial_capacity)

    # ---- lookups ---------------------------------------------------------------------------

    def find(self, keys) -> tf.Tensor:
        """Values of `keys` (int64, any shape), -1 where a key is absent; shaped like keys."""
        keys = _int64(keys, f"HashTable({self._name}).find: keys")
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_find(self.resource_handle, keys)

    def find_or_insert(self, keys, max_size=0) -> tf.Tensor:
        """Values of `keys`, inserting absent keys with dense values (size() at insertion).

        Args:
            keys: int64 (or int32) tensor of any shape; duplicates get one value.
            max_size: 0 for unlimited, else the most keys the table may hold. A batch that
                would pass it raises `tf.errors.InvalidArgumentError` naming the first key
                (row-major) that does not fit, the table and max_size; nothing is inserted.

        Returns:
            int64 tensor shaped like keys.
        """
        keys = _int64(keys, f"HashTable({self._name}).find_or_insert: keys")
        if isinstance(max_size, int) and max_size < 0:
            raise ValueError(f"HashTable({self._name}).find_or_insert: max_size must be >= 0, got {max_size}")
        max_size = _int64(max_size, f"HashTable({self._name}).find_or_insert: max_size")
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_find_or_insert(self.resource_handle, keys, max_size)

    # ---- updates ---------------------------------------------------------------------------

    def insert(self, keys, values):
        """table[keys[i]] = values[i] (row-major; a later duplicate wins). Returns the op."""
        where = f"HashTable({self._name}).insert"
        keys = _int64(keys, f"{where}: keys")
        values = _int64(values, f"{where}: values")
        if keys.shape.is_fully_defined() and values.shape.is_fully_defined() and keys.shape != values.shape:
            raise ValueError(f"{where}: keys has shape {keys.shape} but values has shape {values.shape}; "
                             "they must be the same")
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_insert(self.resource_handle, keys, values)

    def erase(self, keys) -> tf.Tensor:
        """Removes `keys`; returns how many were present (int64 scalar)."""
        keys = _int64(keys, f"HashTable({self._name}).erase: keys")
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_erase(self.resource_handle, keys)

    def clear(self):
        """Removes every key and frees the memory. Returns the op."""
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_clear(self.resource_handle)

    # ---- whole table -----------------------------------------------------------------------

    def size(self) -> tf.Tensor:
        """Number of keys (int64 scalar)."""
        with tf.device("/CPU:0"):
            return _lib().embed_lab_hash_table_size(self.resource_handle)

    def export(self):
        """(keys, values) int64 vectors of every entry, ascending value then key."""
        with tf.device("/CPU:0"):
            keys, values = _lib().embed_lab_hash_table_export(self.resource_handle)
        return keys, values

    # ---- checkpoints -----------------------------------------------------------------------

    def _serialize_to_tensors(self):
        keys, values = self.export()
        return {"keys": keys, "values": values}

    def _restore_from_tensors(self, restored_tensors):
        with tf.control_dependencies([self.clear()]):
            return self.insert(restored_tensors["keys"], restored_tensors["values"])
