"""`DynamicVariable`: a sharded embedding table indexed by a hash table that grows as keys arrive.

Every worker holds the keys k with k mod n == its rank, in two pieces: EmbedLab's concurrent
C++ hash table (`embedlab.hash_table.HashTable`, a TensorFlow resource: key -> dense row index,
new keys take the next index) and a `[capacity, dim]` float32 variable of rows (this object). A
lookup with training inserts unseen keys; when the rows run out the variable (and the
optimizer slots the wrapper registered) grows, at least doubling, new rows drawn from the
initializer. `max_capacity` bounds the keys a worker may hold: past it, an error names the
table and the key.

The first-generation layers' `use_hashtable=True` uses the same index (`LocalHashIndex`) over
a table of fixed capacity.
"""
from __future__ import annotations

import itertools

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops

from . import _context
from .variable import _SokPlacementNames

__all__ = ["DynamicVariable"]

_names = itertools.count()


def _hash_table_module():
    try:
        from .. import hash_table
    except ImportError as e:  # the package is older than the hash table
        raise ImportError(f"embedlab.sok: DynamicVariable and use_hashtable=True need embedlab.hash_table ({e})") from e
    return hash_table


class LocalHashIndex:
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
        """(keys, row indices) as NumPy arrays, in ascending key order (SOK's export order)."""
        k, v = self.table.export()
        k, v = np.asarray(k), np.asarray(v)
        order = np.argsort(k, kind="stable")
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


_SOK_OPTIONS = ("init_capacity", "max_capacity")
# SOK's HKV ("hybrid") tuning options: where vectors sit in GPU or host memory and how its GPU
# hash table is laid out. This table is in host memory whatever they say; they are accepted,
# kept in config_dict, and change nothing.
_PLACEMENT_OPTIONS = ("max_hbm_for_vectors", "max_bucket_size", "max_load_factor", "block_size", "device_id",
                      "io_by_cpu", "reserved_key_start_bit", "num_of_buckets_per_alloc")
_USE_INSTEAD = ("read it by key with tf.nn.embedding_lookup(v, keys) (or tf.gather / v.sparse_read), see all of "
                "this worker's keys and rows with sok.export(v), write rows by key with sok.assign(v, keys, values) "
                "or v.scatter_update(tf.IndexedSlices(values, keys))")


class _UnreadableHandle:
    """Stands in for a DynamicVariable's `_handle`. TensorFlow's eager C fast path reads any
    ResourceVariable through its `_handle` attribute, bypassing the Python methods, so
    `tf.reduce_sum(v)` would read the rows by position; it only does so when `_handle` is an
    EagerTensor, and otherwise falls back to `tf.convert_to_tensor`, which raises here. Every
    other use of `_handle` sees the real handle's attributes."""

    __slots__ = ("_tensor",)

    def __init__(self, tensor):
        object.__setattr__(self, "_tensor", tensor)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_tensor"), name)


class DynamicVariable(_SokPlacementNames, resource_variable_ops.ResourceVariable):
    """This worker's part of a hash-indexed embedding table that grows; read and written by key.

    The arguments are SOK's, in SOK's order.

    Args:
        dimension: the embedding size.
        initializer: "random" (uniform +-0.05, the default; None means it too), "normal",
            "zeros", a number as a string ("13"), or a callable(shape, dtype) such as a Keras
            initializer. Unseen keys read this value.
        var_type: "hbm" (SOK's DET backend, the default) or "hybrid" (SOK's HKV). Both are the
            same CPU hash table here; `backend_type` reports the name given.
        name: the table's name.
        constraint: must be None (SOK's optimizers never apply one).
        trainable: True.
        key_type: tf.int64 (default) or tf.int32; any key of that type is valid, including 0,
            -1 and 2**63-1.
        dtype: tf.float32.
        mode: "distributed" (default; key k on rank k mod n) or "localized:<rank>".
        init_capacity: rows allocated at first (grows by doubling).
        max_capacity: most keys one worker may hold (0 or None: unbounded).
        **kwargs: SOK's HKV placement options (max_hbm_for_vectors, ...), accepted; they change
            nothing (host memory).

    Reading and writing, as in SOK, by key: `tf.nn.embedding_lookup(v, keys)`, `tf.gather(v, keys)`,
    `tf.nn.embedding_lookup_sparse(v, sp_ids, sp_weights)` and `v.sparse_read(keys)` return the
    rows of those keys (an unseen key is inserted with the initializer's value); `v.scatter_add /
    scatter_sub / scatter_update(tf.IndexedSlices(values, keys))` write them; `sok.export(v)` gives
    (keys, rows) of this worker in ascending key order, `sok.assign(v, keys, values)` sets rows;
    `tf.train.Checkpoint` saves and restores the table by key. Keys must belong to this worker
    (k mod n == rank for a distributed table). Every path that would need the table as one dense
    tensor (`read_value`, `value`, `numpy`, `tf.convert_to_tensor`, operators, indexing,
    `assign*`, `scatter_nd_*`, SavedModel, ...) raises NotImplementedError saying what to use.

    The gradient of a read is an `IndexedSlices` over this worker's storage rows (not keys):
    give it to `sok.OptimizerWrapper`, which applies it to `v.storage`. The scatter methods
    refuse an IndexedSlices with a dense_shape (as gradients have), so a plain Keras optimizer
    cannot apply a gradient to the wrong keys.

    Example:
        >>> import tensorflow as tf, embedlab.sok as sok
        >>> v = sok.DynamicVariable(dimension=3, initializer="13")
        >>> tf.nn.embedding_lookup(v, tf.constant([0, 1, 2**40], tf.int64)).numpy()[:, 0].tolist()
        [13.0, 13.0, 13.0]
        >>> v.size.numpy().tolist()
        [3, 3]
    """

    def __init__(self, dimension, initializer=None, var_type=None, name=None, constraint=None, trainable=True,
                 key_type=None, dtype=None, mode=None, **kwargs):
        from .variable import parse_mode
        ctx = _context.context()
        where = "embedlab.sok.DynamicVariable"
        key_type = tf.as_dtype(key_type if key_type is not None else tf.int64)
        if key_type not in (tf.int64, tf.int32):
            raise ValueError(f"{where}: key_type must be tf.int64 or tf.int32, got {key_type.name}")
        dtype = tf.as_dtype(dtype if dtype is not None else tf.float32)
        if dtype != tf.float32:
            raise ValueError(f"{where}: dtype must be float32, got {dtype.name}")
        var_type = "hbm" if var_type is None else var_type
        if var_type not in ("hbm", "hybrid"):
            raise ValueError(f"{where}: var_type must be 'hbm' or 'hybrid' (SOK's DET and HKV backends), got {var_type!r}")
        if constraint is not None:
            raise NotImplementedError(f"{where}: constraint is not supported (a constraint would be applied to the "
                                      "whole table by position); apply it to the rows you read instead")
        for k in kwargs:
            if k not in _SOK_OPTIONS + _PLACEMENT_OPTIONS:
                raise TypeError(f"{where}: unknown option {k!r} (SOK's options here: "
                                f"{', '.join(_SOK_OPTIONS + _PLACEMENT_OPTIONS)})")
        mode = "distributed" if mode is None else mode
        kind, target = parse_mode(mode, ctx.world_size)
        self.dim = int(dimension)
        if self.dim < 1:
            raise ValueError(f"{where}: dimension must be >= 1, got {dimension}")
        initializer = "random" if initializer is None or initializer == "" else initializer
        self.mode, self.kind, self.target_rank = mode, kind, target
        self.rank, self.num_workers = ctx.rank, ctx.world_size
        self.table_name = name or f"sok_dynamic_{next(_names)}"
        self.is_dynamic = True
        self._key_type, self._var_type, self._config_dict = key_type, var_type, dict(kwargs)
        self.max_capacity = int(kwargs.get("max_capacity") or 0)
        self.init_capacity = max(1, int(kwargs.get("init_capacity") or 1024))
        self._init_rows = _initializer_fn(initializer, self.dim)
        self.initializer_name = initializer
        self.hash_index = LocalHashIndex(self.max_capacity, self.table_name, self.init_capacity)
        self._companions = []   # (slot variable, rows -> initial rows) that grow with the table
        self._storage = None
        with tf.init_scope(), tf.device(ctx.device):
            super().__init__(initial_value=self._init_rows(self.init_capacity), dtype=tf.float32,
                             shape=tf.TensorShape([None, self.dim]), name=self.table_name, trainable=trainable)
        self._rows_handle = self._handle
        self._handle = _UnreadableHandle(self._rows_handle)

    @property
    def handle(self):
        """The resource handle of this worker's rows, by position (see `storage`)."""
        return self._rows_handle

    # ---- SOK's public attributes ----------------------------------------------------------

    @property
    def is_sok_variable(self) -> bool:
        return True

    @property
    def size(self) -> tf.Tensor:
        """int32 `[keys held by this worker, dimension]`, as SOK's `DynamicVariable.size`."""
        n = tf.cast(self.hash_index.size(), tf.int32)
        return tf.stack([n, tf.constant(self.dim, tf.int32)])

    @property
    def dimension(self) -> int:
        return self.dim

    @property
    def key_type(self):
        return self._key_type

    @property
    def handle_dtype(self):
        return tf.float32

    @property
    def backend_type(self) -> str:
        """The var_type given ("hbm" or "hybrid"); both are the same CPU hash table here."""
        return self._var_type

    @property
    def config_dict(self) -> dict:
        """SOK's backend options as given (init_capacity, max_capacity, ...)."""
        return dict(self._config_dict)

    @property
    def initializer_str(self):
        return self.initializer_name

    @property
    def indices(self):
        """SOK's keys of a static-mode table; always None (this table has no static mode)."""
        return None

    def key_map(self, indices):
        return indices

    def is_static(self) -> bool:
        return False

    def to_static(self, indices):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': to_static() is not supported "
                                  "(SOK's static mode reads rows by position); read the rows of your keys with "
                                  "tf.nn.embedding_lookup(v, keys) into a tf.Variable, and write them back with "
                                  "sok.assign(v, keys, values)")

    def to_dynamic(self):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': to_dynamic() is not supported "
                                  "(there is no static mode to leave; see to_static)")

    @property
    def capacity(self) -> int:
        """Rows allocated now on this worker (eager)."""
        return int(resource_variable_ops.variable_shape(self.handle)[0])

    @property
    def global_shape(self):
        return [None, self.dim]

    @property
    def storage(self):
        """This worker's rows BY POSITION as a plain `tf.Variable` sharing the table's memory, which
        `sok.OptimizerWrapper` updates (a read's gradient indexes these rows). Row i holds the key
        that the hash index maps to i; read the table by key instead."""
        if self._storage is None:
            with tf.init_scope():
                view = resource_variable_ops.ResourceVariable(trainable=self.trainable, shape=self.shape,
                                                              dtype=tf.float32, handle=self.handle)
            view._unique_id = self._unique_id   # Keras optimizers key their slots by it
            self._storage = view
        return self._storage

    # ---- reads and writes by key ------------------------------------------------------------

    def _keys(self, keys, where):
        keys = tf.convert_to_tensor(keys)
        if keys.dtype not in (tf.int64, tf.int32):
            raise ValueError(f"embedlab.sok.DynamicVariable '{self.table_name}'.{where}: keys must be int64 (or "
                             f"int32), got {keys.dtype.name}")
        return tf.cast(keys, tf.int64)

    def _owner_checks(self, flat, where):
        """Control dependencies that fail when a key belongs to another worker (more than one worker)."""
        if self.num_workers == 1:
            return []
        mine = (tf.fill(tf.shape(flat), tf.constant(self.target_rank, tf.int64)) if self.kind == "localized"
                else tf.math.floormod(flat, self.num_workers))
        ok = tf.reduce_all(tf.equal(mine, self.rank))
        msg = (f"embedlab.sok.DynamicVariable '{self.table_name}'.{where}: a key belongs to another worker (key k "
               f"lives on rank {'k mod ' + str(self.num_workers) if self.kind == 'distributed' else self.target_rank}, "
               f"this is rank {self.rank}); read other workers' keys with sok.lookup_sparse")
        if tf.executing_eagerly():
            if not bool(ok):
                bad = int(tf.boolean_mask(flat, tf.not_equal(mine, self.rank))[0])
                raise ValueError(f"{msg} (first: key {bad})")
            return []
        return [tf.debugging.Assert(ok, [msg], name="sok_dynamic_owner")]

    def sparse_read(self, indices, name=None):
        """Rows of `indices` (keys, any shape): `[*indices.shape, dimension]`; unseen keys are
        inserted with the initializer's value. What tf.gather and tf.nn.embedding_lookup call."""
        keys = self._keys(indices, "sparse_read")
        with tf.name_scope(name or "sok_dynamic_sparse_read"):
            flat = tf.reshape(keys, [-1])
            with tf.control_dependencies(self._owner_checks(flat, "sparse_read")):
                rows = self.prepare_rows(flat)
            resource_variable_ops.variable_accessed(self)   # lets GradientTape watch it
            out = gen_resource_variable_ops.resource_gather(self.handle, rows, dtype=tf.float32)
            return tf.reshape(out, tf.concat([tf.shape(keys), [self.dim]], 0))

    def _scatter(self, sparse_delta, op, where):
        if not isinstance(sparse_delta, tf.IndexedSlices):
            raise TypeError(f"embedlab.sok.DynamicVariable '{self.table_name}'.{where}: sparse_delta must be "
                            f"tf.IndexedSlices(values, keys), got {type(sparse_delta).__name__}")
        if sparse_delta.dense_shape is not None:
            # Gradients carry a dense_shape (the storage's [capacity, dim]) and index storage rows,
            # not keys: applying one here would move the rows of other keys.
            raise ValueError(f"embedlab.sok.DynamicVariable '{self.table_name}'.{where}: sparse_delta has a "
                             "dense_shape, as a gradient does; a gradient of a DynamicVariable indexes its storage "
                             "rows, not keys: apply it with sok.OptimizerWrapper (or to v.storage). For a write by "
                             "key, give tf.IndexedSlices(values, keys) without dense_shape")
        keys = self._keys(sparse_delta.indices, where)
        values = tf.convert_to_tensor(sparse_delta.values, tf.float32)
        if values.shape.rank is not None and keys.shape.rank is not None and (
                values.shape.rank != keys.shape.rank + 1 or values.shape[-1] not in (None, self.dim)
                or not values.shape[:-1].is_compatible_with(keys.shape)):
            raise ValueError(f"embedlab.sok.DynamicVariable '{self.table_name}'.{where}: values of shape "
                             f"{values.shape} do not match keys of shape {keys.shape} and dimension {self.dim}")
        flat = tf.reshape(keys, [-1])
        with tf.control_dependencies(self._owner_checks(flat, where)):
            rows = self.prepare_rows(flat)
        return op(self.handle, rows, tf.reshape(values, [-1, self.dim]))

    def scatter_add(self, sparse_delta, use_locking=False, name=None):
        """Adds `sparse_delta.values` to the rows of the keys `sparse_delta.indices` (unseen keys
        start from the initializer's value; duplicate keys add up)."""
        return self._scatter(sparse_delta, gen_resource_variable_ops.resource_scatter_add, "scatter_add")

    def scatter_sub(self, sparse_delta, use_locking=False, name=None):
        """Subtracts `sparse_delta.values` from the rows of the keys `sparse_delta.indices`."""
        return self._scatter(sparse_delta, gen_resource_variable_ops.resource_scatter_sub, "scatter_sub")

    def scatter_update(self, sparse_delta, use_locking=False, name=None):
        """Sets the rows of the keys `sparse_delta.indices` (inserted if new)."""
        return self._scatter(sparse_delta, gen_resource_variable_ops.resource_scatter_update, "scatter_update")

    # ---- paths that would read or write the table by position ---------------------------

    def _positional(self, path):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': {path} is not supported: the "
                                  f"table is a hash table read by key, it has no dense value by position; "
                                  f"{_USE_INSTEAD}")

    def value(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("value()")

    def read_value(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("read_value()")

    def read_value_no_copy(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("read_value_no_copy()")

    def _read_variable_op(self, no_copy=False):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("reading the whole table (read_value)")

    def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("tf.convert_to_tensor (and every op or operator that takes the table as a tensor)")

    def numpy(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("numpy()")

    def __array__(self, dtype=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("np.asarray / __array__")

    def eval(self, session=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("eval()")

    @property
    def initial_value(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("initial_value")

    def initialized_value(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("initialized_value()")

    def __getitem__(self, slice_spec):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("indexing (v[...])")

    def gather_nd(self, indices, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("gather_nd()")

    def assign(self, value, use_locking=None, name=None, read_value=True):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("assign() of a dense value")

    def assign_add(self, delta, use_locking=None, name=None, read_value=True):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("assign_add() of a dense value (use scatter_add by key)")

    def assign_sub(self, delta, use_locking=None, name=None, read_value=True):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("assign_sub() of a dense value (use scatter_sub by key)")

    def scatter_max(self, sparse_delta, use_locking=False, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_max()")

    def scatter_min(self, sparse_delta, use_locking=False, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_min()")

    def scatter_mul(self, sparse_delta, use_locking=False, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_mul()")

    def scatter_div(self, sparse_delta, use_locking=False, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_div()")

    def batch_scatter_update(self, sparse_delta, use_locking=False, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("batch_scatter_update()")

    def scatter_nd_sub(self, indices, updates, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_nd_sub()")

    def scatter_nd_add(self, indices, updates, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_nd_add()")

    def scatter_nd_update(self, indices, updates, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_nd_update()")

    def scatter_nd_max(self, indices, updates, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_nd_max()")

    def scatter_nd_min(self, indices, updates, name=None):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("scatter_nd_min()")

    def _strided_slice_assign(self, *args, **kwargs):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("sliced assignment (v[...].assign)")

    def count_up_to(self, limit):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("count_up_to()")

    def __int__(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("int()")

    def __float__(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("float()")

    def __bool__(self):
        """Not supported, as the table is read and written by key; raises NotImplementedError."""
        self._positional("bool()")

    def __deepcopy__(self, memo):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': deepcopy is not supported "
                                  "(copy its keys and rows with sok.export / sok.assign)")

    def __reduce__(self):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': pickling is not supported "
                                  "(save it with sok.dump or tf.train.Checkpoint)")

    def to_proto(self, export_scope=None):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': to_proto() is not supported")

    @staticmethod
    def from_proto(variable_def, import_scope=None):
        raise NotImplementedError("embedlab.sok.DynamicVariable: from_proto() is not supported")

    def set_shape(self, shape):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': set_shape() is not supported")

    # ---- checkpoints: by key ----------------------------------------------------------------

    def _serialize_to_tensors(self):
        """tf.train.Checkpoint saves the key -> row index and the rows it points to (this worker's)."""
        keys, rows = self.hash_index.table.export()
        with tf.device("/device:CPU:0"):
            values = tf.identity(self._read_storage())
        return {"keys": keys, "row_index": rows, "rows": values}

    def _restore_from_tensors(self, restored_tensors):
        """Replaces the table with the checkpoint's keys and rows, by key. Optimizer slots restored
        with it (the same tf.train.Checkpoint) stay aligned with the rows."""
        keys, index = restored_tensors["keys"], restored_tensors["row_index"]
        values = tf.convert_to_tensor(restored_tensors["rows"], tf.float32)
        if values.shape.rank is not None and values.shape[-1] not in (None, self.dim):
            raise ValueError(f"embedlab.sok.DynamicVariable '{self.table_name}': the checkpoint holds rows of "
                             f"dimension {values.shape[-1]}, the table has dimension {self.dim}")
        with tf.control_dependencies(self._owner_checks(keys, "checkpoint restore")):
            cleared = self.hash_index.table.clear()
        with tf.control_dependencies([cleared]):
            inserted = self.hash_index.table.insert(keys, index)
        with tf.control_dependencies([inserted]):
            return gen_resource_variable_ops.assign_variable_op(self.handle, values)

    def _export_to_saved_model_graph(self, object_map=None, tensor_map=None, options=None, **kwargs):
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': SavedModel export is not "
                                  "supported (a loaded SavedModel would read the rows by position); save the table "
                                  "with sok.dump (or tf.train.Checkpoint) and serve it through embedlab.hps")

    def _copy_trackable_to_cpu(self, object_map):
        # The base copy is a plain variable: it would save the rows without their keys.
        raise NotImplementedError(f"embedlab.sok.DynamicVariable '{self.table_name}': copying the table for an "
                                  "asynchronous checkpoint of a device variable is not supported; use a synchronous "
                                  "tf.train.Checkpoint, or sok.dump")

    # ---- this worker's rows by position (the machinery behind the by-key paths) -------------

    def _read_storage(self):
        return gen_resource_variable_ops.read_variable_op(self.handle, tf.float32)

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
            ops = [gen_resource_variable_ops.assign_variable_op(
                self.handle, tf.concat([self._read_storage(), self._init_rows(extra)], 0))]
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
        """(keys, rows) of this worker, as tensors, in ascending key order."""
        keys, idx = self.hash_index.export()
        return tf.constant(keys), tf.gather(self._read_storage(), tf.constant(idx))

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
        gen_resource_variable_ops.resource_scatter_update(self.handle, idx, tf.constant(np.asarray(values, np.float32)))

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
            gen_resource_variable_ops.resource_scatter_update(self.handle, idx, tf.constant(rows[mine]))
            for svar, srows in slots:
                svar.scatter_update(tf.IndexedSlices(tf.constant(srows[mine]), idx))

    def __repr__(self):
        return (f"<embedlab.sok.DynamicVariable '{self.table_name}' shape={self.shape} dtype=float32 "
                f"mode={self.mode} rank={self.rank}/{self.num_workers} capacity={self.capacity}>")
