"""`EmbeddingLayer`, HugeCTR's TensorFlow embedding plugin as a Keras 3 layer, and the per-key
initial values it starts from (`embedlab.plugin`'s docstring describes the workflow)."""
from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from .. import _lookup, ops, optimizers  # noqa: F401  (optimizers: registers them with Keras for loading saved models)
from .. import tables as _tables
from .._hashing import splitmix64
from ..sparse_input import SparseInput
from . import checkpoint, placement
from .placement import _canonical, current

__all__ = ["EmbeddingLayer", "initial_values"]

_COMBINERS = ("sum", "mean")
_TYPES = ("distributed", "localized")
_INIT_SCALE = 0.05           # "random" initializer: uniform(-0.05, 0.05), Keras Embedding's default


# --------------------------------------------------------------------------------------------
# Per-key initial values
# --------------------------------------------------------------------------------------------

def initial_values(keys, dim: int, seed: int = 0, initializer="random") -> np.ndarray:
    """The initial rows of `keys`: a function of (seed, key) only.

    Args:
        keys: int64 array of keys (>= 0).
        dim: embedding width.
        seed: the seed given to `init`.
        initializer: "random" (uniform in [-0.05, 0.05), 24-bit resolution), a float (every
            value), or a 2-D array whose row i is key i.

    Returns:
        float32 `[len(keys), dim]`.

    Example:
        >>> initial_values(np.array([0, 5]), 2, seed=0).shape
        (2, 2)
    """
    keys = np.asarray(keys, dtype=np.int64)
    if isinstance(initializer, str):
        if initializer != "random":
            raise ValueError(f"initializer must be 'random', a float or a 2-D array, got {initializer!r}")
        out = np.empty((len(keys), dim), dtype=np.float32)
        with np.errstate(over="ignore"):
            base = splitmix64(np.uint64(seed) * np.uint64(0xD1B54A32D192ED03) + np.uint64(dim))  # wraps mod 2^64
        cols = np.arange(dim, dtype=np.uint64)
        step = max(1, (1 << 22) // max(dim, 1))        # bounded temporaries for big tables
        for s in range(0, len(keys), step):
            k = keys[s:s + step].astype(np.uint64)[:, None]
            with np.errstate(over="ignore"):
                h = splitmix64(base ^ (k * np.uint64(0x100000001B3) + cols[None, :]))
            u = (h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24))
            out[s:s + step] = (u * np.float32(2 * _INIT_SCALE) - np.float32(_INIT_SCALE))
        return out
    if isinstance(initializer, (int, float, np.floating, np.integer)) and not isinstance(initializer, bool):
        return np.full((len(keys), dim), float(initializer), dtype=np.float32)
    arr = np.asarray(initializer, dtype=np.float32)
    return arr[keys]


# --------------------------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="embedlab")
class EmbeddingLayer(keras.layers.Layer):
    """HugeCTR-plugin-style sparse embedding: `[batch, slot_num, max_nnz]` keys -> `[batch, slot_num, vec]`.

    Args:
        vocabulary_size: number of keys; keys lie in [0, vocabulary_size) (or are -1).
        embedding_vec_size: width of each row.
        slot_num: number of slots (feature fields) per sample.
        max_nnz: most keys per slot (the last dimension of dense input).
        combiner: "sum" or "mean" over a slot's keys.
        embedding_type: "distributed" (rows sharded by key % n) or "localized" (slots
            assigned to devices, slot s -> device s % n).
        optimizer: None (the model's optimizer trains the tables through IndexedSlices
            gradients) or an `embedlab.optimizers` instance the layer applies itself.
        initializer: "random", a float, or a 2-D array `[vocabulary_size, vec]` whose row i
            is key i.
        slot_size_array: per-slot key counts (localized mode: keys of slot s lie in its own
            range; memory is their sum). Must sum to vocabulary_size. Optional.
        devices, seed: override `init`'s devices / seed for this layer.
        name: layer name (also names its variables and error messages).

    Input: see `embedlab.plugin`'s docstring (dense, COO SparseTensor, `(row_offsets, values)`,
    or an `embedlab.SparseInput` of batch * slot_num rows).

    Saving: the layer is Keras-serializable (`model.save("m.keras")` / `keras.saving.load_model`,
    `model.export(...)` for serving). The `.keras` file holds the table in key order, so it
    loads into a process with another device count (the layer then shards over `init`'s
    devices there), and the config holds the layer's own optimizer with its hyperparameters;
    that optimizer's slot state (Adam moments, Adagrad accumulators) starts afresh after
    loading, as with `save` / `restore`.

    Returns (when called):
        float32 `[batch, slot_num, embedding_vec_size]`.

    Example:
        >>> emb = EmbeddingLayer(8, 4, slot_num=3, max_nnz=2, initializer=1.0)
        >>> emb(tf.constant([[[0, 1], [-1, -1], [7, -1]]], tf.int64)).numpy()[0, :, 0].tolist()
        [2.0, 0.0, 1.0]
    """

    def __init__(self, vocabulary_size: int, embedding_vec_size: int, slot_num: int, max_nnz: int,
                 combiner: str = "sum", embedding_type: str = "distributed", optimizer=None,
                 initializer="random", slot_size_array=None, devices=None, seed=None, name=None,
                 **kwargs):
        super().__init__(name=name, **kwargs)
        # Keras takes only tensors positionally unless told: the layer also takes a SparseInput.
        self._allow_non_tensor_positional_args = True
        lname = f"EmbeddingLayer {self.name!r}"
        for arg, v in (("vocabulary_size", vocabulary_size), ("embedding_vec_size", embedding_vec_size),
                       ("slot_num", slot_num), ("max_nnz", max_nnz)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{lname}: {arg} must be a positive int, got {v!r}")
        if combiner not in _COMBINERS:
            raise ValueError(f"{lname}: combiner must be 'sum' or 'mean', got {combiner!r}")
        if embedding_type not in _TYPES:
            raise ValueError(f"{lname}: embedding_type must be 'distributed' or 'localized', got {embedding_type!r}")
        if optimizer is not None and not hasattr(optimizer, "apply_sparse"):
            raise ValueError(f"{lname}: optimizer must be None or an embedlab.optimizers instance "
                             f"(SGD, Adagrad, Adam), got {type(optimizer).__name__}")
        self.vocabulary_size = int(vocabulary_size)
        self.embedding_vec_size = int(embedding_vec_size)
        self.slot_num = int(slot_num)
        self.max_nnz = int(max_nnz)
        self.combiner = combiner
        self.embedding_type = embedding_type
        V, D, S = self.vocabulary_size, self.embedding_vec_size, self.slot_num

        if slot_size_array is not None:
            ssa = np.asarray(slot_size_array, dtype=np.int64)
            if ssa.shape != (S,) or (ssa < 1).any() or int(ssa.sum()) != V:
                raise ValueError(f"{lname}: slot_size_array must hold {S} positive sizes summing to "
                                 f"vocabulary_size {V}, got {list(map(int, ssa))[:8]}"
                                 f"{'...' if ssa.size > 8 else ''} (sum {int(ssa.sum())})")
            self.slot_size_array = [int(x) for x in ssa]
            self._slot_offsets = placement.slot_offsets(ssa)
        else:
            self.slot_size_array = None
            self._slot_offsets = None

        if isinstance(initializer, str):
            if initializer != "random":
                raise ValueError(f"{lname}: initializer must be 'random', a float or a 2-D array, got {initializer!r}")
        elif not isinstance(initializer, (int, float, np.floating, np.integer)) or isinstance(initializer, bool):
            arr = np.asarray(initializer, dtype=np.float32)
            if arr.shape != (V, D):
                raise ValueError(f"{lname}: initializer array must be [vocabulary_size, embedding_vec_size] = "
                                 f"[{V}, {D}], got shape {list(arr.shape)}")
            initializer = arr
        self._initializer = initializer

        cfg = current()
        self.devices = tuple(_canonical(d) for d in devices) if devices is not None else cfg.devices
        self.seed = int(cfg.seed if seed is None else seed)
        n = len(self.devices)

        # The plan: for each device, which global keys its table holds, in local-row order.
        self._shard_keys = placement.shard_keys(V, n, embedding_type, self.slot_size_array)
        self.optimizer = optimizer
        own = optimizer is not None
        self._tables = []
        for i, (dev, keys) in enumerate(zip(self.devices, self._shard_keys)):
            values = initial_values(keys, D, self.seed, self._initializer)
            with tf.device(dev):
                w = self.add_weight(name=f"table_{i}", shape=(len(keys), D), dtype="float32",
                                    initializer=lambda shape, dtype=None, v=values: _tables.aligned(tf.constant(v)),
                                    trainable=not own)
            self._tables.append(w)
        if own:
            # HugeCTR's bp_trigger: a trainable scalar whose (zero) gradient runs the layer's update.
            self.bp_trigger = self.add_weight(name="bp_trigger", shape=(), dtype="float32",
                                              initializer="zeros", trainable=True)
            self.optimizer.build(self._tables)
        self._localized_full = embedding_type == "localized" and self.slot_size_array is None and n > 1
        self.built = True

    # ---- placement ------------------------------------------------------------------------

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def tables(self) -> list:
        """The per-device table variables (local rows; see `embedlab.plugin.placement`)."""
        return list(self._tables)

    # ---- input ----------------------------------------------------------------------------

    def _where(self, arg: str) -> str:
        return f"EmbeddingLayer {self.name!r}: argument {arg}"

    def _keys(self, values, arg):
        if not isinstance(values, (tf.Tensor, tf.Variable)) and not hasattr(values, "dtype"):
            values = np.asarray(values)
        dt = tf.as_dtype(values.dtype)
        if dt not in (tf.int64, tf.int32):
            raise ValueError(f"{self._where(arg)}: keys must be int64 (or int32), got dtype {dt.name}")
        return tf.cast(values, tf.int64)

    def _to_input(self, inputs):
        """(SparseInput of B*S rows, batch, graph-mode check ops) from any accepted input form.

        A SparseTensor stays COO: the one-device lookup hands it to the fused op that sorts and
        looks up in one pass; dense and (row_offsets, values) input are CSR already."""
        S, M = self.slot_num, self.max_nnz
        if isinstance(inputs, SparseInput):
            # batch * slot_num rows: checked below as the COO or CSR form it holds.
            if inputs.has_weights:
                raise ValueError(f"{self._where('inputs')}: the layer pools without weights; got a SparseInput "
                                 "with weights")
            if inputs.is_coo:
                indices, values, shape, _ = inputs.coo
                inputs = tf.SparseTensor(indices, values, shape)
            else:
                inputs = (inputs.row_splits, inputs.keys)
        if isinstance(inputs, (tuple, list)) and not isinstance(inputs, tf.SparseTensor):
            if len(inputs) != 2:
                raise ValueError(f"{self._where('inputs')}: CSR input must be (row_offsets, values), "
                                 f"got a {type(inputs).__name__} of {len(inputs)}")
            offsets = self._keys(inputs[0], "row_offsets")
            keys = self._keys(inputs[1], "values")
            if offsets.shape.rank != 1 or keys.shape.rank != 1:
                raise ValueError(f"{self._where('inputs')}: row_offsets and values must be 1-D, got shapes "
                                 f"{offsets.shape} and {keys.shape}")
            n_off = offsets.shape[0]
            if n_off is not None and (n_off < 1 or (n_off - 1) % S):
                raise ValueError(f"{self._where('row_offsets')}: length - 1 must be batch * slot_num "
                                 f"(slot_num {S}); got length {n_off}")
            rows = tf.shape(offsets, out_type=tf.int64)[0] - 1
            nnz = tf.shape(keys, out_type=tf.int64)[0]
            d = offsets[1:] - offsets[:-1]
            dmin = tf.reduce_min(tf.concat([d, [0]], 0))
            dmax = tf.reduce_max(tf.concat([d, [0]], 0))
            first = tf.concat([offsets[:1], [0]], 0)[0]
            checks = [(tf.equal(rows % S, 0), f"length - 1 must be batch * slot_num (slot_num {S})", rows),
                      (tf.logical_and(tf.equal(first, 0), tf.equal(offsets[-1], nnz)),
                       "must start at 0 and end at len(values)", tf.stack([first, offsets[-1], nnz])),
                      (dmin >= 0, "must be non-decreasing", dmin),
                      (dmax <= M, f"rows must hold at most max_nnz={M} keys", dmax)]
            if tf.executing_eagerly():
                for cond, what, value in checks:
                    self._assert(cond, "row_offsets", what, value)
                return SparseInput.from_row_splits(offsets, keys), rows // S, []
            # One Assert for all (each graph Assert with data costs a conditional per step).
            ok = tf.reduce_all(tf.stack([c for c, _, _ in checks]))
            return SparseInput.from_row_splits(offsets, keys), rows // S, [tf.debugging.Assert(ok, [
                f"{self._where('row_offsets')}: must have length batch * slot_num + 1 (slot_num {S}), start at 0, "
                f"end at len(values), be non-decreasing, with at most max_nnz={M} keys per row; got "
                "length - 1, first, last, len(values), smallest and largest row:",
                rows, first, offsets[-1], nnz, dmin, dmax], summarize=8)]
        if isinstance(inputs, tf.SparseTensor):
            keys = self._keys(inputs.values, "inputs.values")
            shape = inputs.dense_shape
            rank = inputs.shape.rank
            if rank == 3:
                check = self._assert(tf.logical_and(tf.equal(shape[1], S), shape[2] <= M),
                                     "inputs.dense_shape", f"must be [batch, {S}, <= {M}]", shape)
                idx = inputs.indices
                sp = tf.SparseTensor(tf.stack([idx[:, 0] * S + idx[:, 1], idx[:, 2]], 1), keys,
                                     tf.stack([shape[0] * S, shape[2]]))
            elif rank == 2:
                check = self._assert(tf.logical_and(tf.equal(shape[0] % S, 0), shape[1] <= M),
                                     "inputs.dense_shape", f"must be [batch * {S}, <= {M}]", shape)
                sp = tf.SparseTensor(inputs.indices, keys, shape)
            else:
                raise ValueError(f"{self._where('inputs')}: SparseTensor must have rank 2 "
                                 f"[batch*slot_num, max_nnz] or 3 [batch, slot_num, max_nnz], got rank {rank}")
            x = SparseInput.from_sparse(sp, where=f"EmbeddingLayer {self.name!r}")
            return x, sp.dense_shape[0] // S, [check] if check is not None else []
        if isinstance(inputs, tf.RaggedTensor):
            raise ValueError(f"{self._where('inputs')}: pass dense [batch, slot_num, max_nnz] keys, a SparseTensor "
                             "or (row_offsets, values); got a RaggedTensor")
        keys = self._keys(inputs, "inputs")
        if keys.shape.rank != 3:
            raise ValueError(f"{self._where('inputs')}: dense keys must be [batch, slot_num={S}, max_nnz={M}], "
                             f"got shape {keys.shape}")
        if keys.shape[1] is not None and keys.shape[1] != S:
            raise ValueError(f"{self._where('inputs')}: slot count {keys.shape[1]} != slot_num {S} "
                             f"(shape {keys.shape})")
        if keys.shape[2] is not None and keys.shape[2] > M:
            raise ValueError(f"{self._where('inputs')}: {keys.shape[2]} keys per slot > max_nnz {M} "
                             f"(shape {keys.shape})")
        shp = tf.shape(keys, out_type=tf.int64)
        batch, m = shp[0], shp[2]
        splits = tf.range(batch * S + 1, dtype=tf.int64) * m
        return SparseInput.from_row_splits(splits, tf.reshape(keys, [-1])), batch, []

    def _assert(self, cond, arg, what, value):
        """Raise ValueError (eager) or InvalidArgumentError (graph) naming layer, argument and value."""
        msg = f"{self._where(arg)} {what}; got"
        if tf.executing_eagerly():
            if not bool(cond):
                v = value.numpy() if hasattr(value, "numpy") else value
                raise ValueError(f"{msg} {np.asarray(v).tolist()}")
            return None
        return tf.debugging.Assert(cond, [msg, value], summarize=8)

    def _bad_keys(self, keys, slot):
        """Mask of the keys outside [0, V) other than -1, or outside their slot's range."""
        bad = tf.logical_or(keys < -1, keys >= self.vocabulary_size)
        if self.slot_size_array is not None:
            lo = tf.gather(tf.constant(self._slot_offsets), slot)
            hi = lo + tf.gather(tf.constant(self.slot_size_array, tf.int64), slot)
            bad = tf.logical_or(bad, tf.logical_and(keys >= 0, tf.logical_or(keys < lo, keys >= hi)))
        return bad

    def _check_keys(self, x):
        """Keys must be -1 or in [0, V) (and in their slot's range with slot_size_array).

        Eager: raises ValueError naming the first bad key and its position (in the CSR order of
        the flattened keys). In a graph: returns an Assert op (InvalidArgumentError when it
        fails) to run before the lookup. COO input is checked as it is, unconverted.
        """
        V = self.vocabulary_size
        eager = tf.executing_eagerly()
        if not eager and self.slot_size_array is None:
            # Two reductions instead of a mask pass (this runs every step); one of the
            # extremes is the bad key, and the message names both.
            keys = x.values
            lo, hi = tf.reduce_min(keys), tf.reduce_max(keys)  # empty: +max / -max, both pass
            return tf.debugging.Assert(
                tf.logical_and(lo >= -1, hi < V),
                [f"{self._where('inputs')}: keys must be -1 or in [0, vocabulary_size={V}); smallest key:", lo,
                 "largest key:", hi])
        if x.is_coo:
            indices, keys = x.coo[0], x.coo[1]
            slot = indices[:, 0] % self.slot_num if self.slot_size_array is not None else None
        else:
            keys = x.keys
            slot = self._slots_of(x.row_splits, keys) if self.slot_size_array is not None else None
        bad = self._bad_keys(keys, slot)
        if not eager:
            first = tf.gather(keys, tf.reshape(tf.where(bad), [-1])[:1])
            return tf.debugging.Assert(
                tf.logical_not(tf.reduce_any(bad)),
                [f"{self._where('inputs')}: keys must be -1 or in [0, vocabulary_size={V}) and inside "
                 "their slot's slot_size_array range; first bad key:", first])
        if bool(tf.reduce_any(bad)):
            splits, keys = x.row_splits, x.keys        # the position is reported in CSR order
            slot = self._slots_of(splits, keys) if self.slot_size_array is not None else None
            i = int(tf.where(self._bad_keys(keys, slot))[0, 0])
            k = int(keys[i])
            if -1 <= k < V:
                s = int(slot[i])
                lo_s = int(self._slot_offsets[s])
                raise ValueError(f"{self._where('inputs')}: key {k} (value {i} of the flattened keys) is "
                                 f"outside slot {s}'s range [{lo_s}, {lo_s + self.slot_size_array[s]}) "
                                 "given by slot_size_array")
            raise ValueError(f"{self._where('inputs')}: key {k} (value {i} of the flattened keys) is outside "
                             f"[0, vocabulary_size={V}) and is not the padding -1")
        return None

    def _slots_of(self, splits, keys):
        rows = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
        return rows % self.slot_num

    # ---- forward --------------------------------------------------------------------------

    def _local_keys(self, i: int, splits, keys):
        """Shard i's local row for each key, -1 where shard i doesn't own the key."""
        slot = None if self.embedding_type == "distributed" else self._slots_of(splits, keys)
        return placement.local_rows(i, self.num_devices, keys, self.embedding_type, slot, self.slot_size_array)

    def _lookup(self, x):
        if self.num_devices == 1:
            return ops.embedding_lookup(self._tables[0], x, self.combiner)
        splits, keys = x.row_splits, x.keys
        gathered = []
        for i, dev in enumerate(self.devices):
            with tf.device(dev):
                local = self._local_keys(i, splits, keys)
                # One key per row: the rows themselves (exact zeros where the shard doesn't own the key).
                gathered.append(ops.embedding_lookup(self._tables[i], local[:, None], "sum"))
        rows = tf.add_n(gathered)
        pos = tf.where(keys >= 0, tf.range(tf.shape(keys, out_type=tf.int64)[0]), tf.constant(-1, tf.int64))
        return ops.embedding_lookup(rows, SparseInput.from_row_splits(splits, pos), self.combiner)

    def _lookup_own_optimizer(self, x):
        if self.num_devices == 1:
            # One table: the backward and the update in one op (the shared optimizer-in-backward lookup),
            # the same bits as the gradient + apply_sparse path below; the trigger's gradient
            # runs it, since the tape does not watch the non-trainable table.
            return _lookup.training_lookup([self._tables[0]], [x], None, [self.combiner], [self.optimizer],
                                           self.bp_trigger, self._where("inputs"))[0]
        tables = [_lookup.as_variable(t) for t in self._tables]
        layer = self

        @tf.custom_gradient
        def fwd(trigger):
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                for t in tables:
                    inner.watch(t)
                out = layer._lookup(x)

            def grad(dy, variables=None):
                layer._apply_own(inner.gradient(out, tables, output_gradients=dy))
                z = tf.zeros_like(trigger)
                return (z, [None] * len(variables)) if variables else z

            return out, grad

        return fwd(self.bp_trigger.value)

    def _apply_own(self, grads):
        # One compiled sparse update per device (apply_sparse groups by device: a fused op
        # cannot take variables living on different devices), then one step of the optimizer's
        # counter, as apply_gradients would do. The same path for any device count, so the
        # bits do not depend on it. (Gradient clipping / loss scaling are not applied here.)
        opt = self.optimizer
        pairs = [(g, v) for g, v in zip(grads, self._tables) if g is not None]
        if pairs:
            opt.apply_sparse([g for g, _ in pairs], [v for _, v in pairs])
        opt.iterations.assign_add(1)

    def call(self, inputs):
        x, batch, deps = self._to_input(inputs)
        check = self._check_keys(x)
        deps = deps + ([check] if check is not None else [])
        if deps:   # the lookup reads keys that passed the checks
            x = _after(x, deps)
        out = (self._lookup_own_optimizer(x) if self.optimizer is not None
               else self._lookup(x))
        return tf.reshape(out, tf.stack([batch, self.slot_num, self.embedding_vec_size]))

    def compute_output_shape(self, input_shape):
        b = input_shape[0] if isinstance(input_shape, (tuple, list)) and input_shape and \
            not isinstance(input_shape[0], (tuple, list)) else None
        return (b, self.slot_num, self.embedding_vec_size)

    # ---- tables in key order ----------------------------------------------------------------

    def get_table(self) -> np.ndarray:
        """The whole table in key order, `[vocabulary_size, vec]` float32 (independent of devices).

        Example:
            >>> EmbeddingLayer(4, 2, 1, 1, initializer=0.5).get_table().tolist()
            [[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]
        """
        V, D = self.vocabulary_size, self.embedding_vec_size
        if not self._localized_full:
            out = np.empty((V, D), np.float32)
            for keys, t in zip(self._shard_keys, self._tables):
                if keys.size:
                    out[keys] = t.numpy()
            return out
        # Full copies per device: the row of key k is the copy that moved from its initial value.
        init = initial_values(np.arange(V), D, self.seed, self._initializer)
        out = init.copy()
        owner = np.full(V, -1, np.int64)
        for j, t in enumerate(self._tables):
            tv = t.numpy()
            moved = np.any(tv.view(np.uint32) != init.view(np.uint32), axis=1)
            both = np.flatnonzero(moved & (owner >= 0))
            if both.size:
                raise ValueError(f"EmbeddingLayer {self.name!r}: key {int(both[0])} was trained on devices "
                                 f"{int(owner[both[0]])} and {j} (localized mode without slot_size_array "
                                 "needs each key used by the slots of one device); pass slot_size_array")
            out[moved] = tv[moved]
            owner[moved] = j
        return out

    def set_table(self, values) -> None:
        """Sets the whole table from a `[vocabulary_size, vec]` array in key order."""
        arr = np.asarray(values, dtype=np.float32)
        if arr.shape != (self.vocabulary_size, self.embedding_vec_size):
            raise ValueError(f"EmbeddingLayer {self.name!r}: set_table needs shape "
                             f"[{self.vocabulary_size}, {self.embedding_vec_size}], got {list(arr.shape)}")
        parts = [arr[keys] for keys in self._shard_keys]     # all slices first, then assign
        for t, p in zip(self._tables, parts):
            _tables.assign(t, p)     # a large table stays in its aligned huge-page mapping

    # ---- save / restore ---------------------------------------------------------------------

    def save(self, path) -> Path:
        """Writes the table in key order to `path`, atomically (temp file, fsync, rename).

        The format is `embedlab.plugin.checkpoint`'s: a checked header, then the float32 rows.
        Device count and embedding_type are not part of the file, so it restores into a layer
        sharded differently. Optimizer state is not saved.

        Args:
            path: file path (parents are created).

        Returns:
            The path written.

        Example:
            >>> emb = EmbeddingLayer(4, 2, 1, 1, initializer=0.5)
            >>> emb.save("emb.bin"); emb.restore("emb.bin")
            PosixPath('emb.bin')
        """
        return checkpoint.write_table(path, self.get_table(), self.name)

    def restore(self, path) -> None:
        """Loads a table written by `save` (any device count / embedding_type) into this layer.

        Everything is checked before any variable changes: magic, version, header CRC, sizes,
        payload length and CRC32. On any mismatch a `CheckpointError` (a ValueError) names the
        file and the problem, and the layer is unchanged.

        Args:
            path: file written by `save`.
        """
        self.set_table(checkpoint.read_table(path, self.vocabulary_size, self.embedding_vec_size,
                                             f"EmbeddingLayer {self.name!r}"))

    # ---- Keras serialization ----------------------------------------------------------------

    def get_config(self):
        cfg = super().get_config()
        init = self._initializer
        # An initializer array is not config: the saved weights carry the values.
        init = init if isinstance(init, str) else float(init) if np.ndim(init) == 0 else "random"
        cfg.update(vocabulary_size=self.vocabulary_size, embedding_vec_size=self.embedding_vec_size,
                   slot_num=self.slot_num, max_nnz=self.max_nnz, combiner=self.combiner,
                   embedding_type=self.embedding_type, slot_size_array=self.slot_size_array,
                   seed=self.seed, initializer=init,
                   optimizer=None if self.optimizer is None else keras.optimizers.serialize(self.optimizer))
        return cfg

    @classmethod
    def from_config(cls, config):
        """The layer from `get_config()`'s dict (the optimizer deserialized)."""
        config = dict(config)
        opt = config.pop("optimizer", None)
        if isinstance(opt, dict):
            opt = keras.optimizers.deserialize(opt)
        return cls(optimizer=opt, **config)

    @property
    def variables(self):
        """The layer's variables and its own optimizer's (which are not weights)."""
        # The layer's own optimizer is part of its state: its variables (iteration counter,
        # slots) are captured by the backward that applies it, so whatever collects a model's
        # state through `variables` (`model.export`'s SavedModel) must find them here. They are
        # not weights (`weights`, `get_weights` and the .keras file leave them out).
        vs = super().variables
        if self.optimizer is not None:
            seen = {id(v) for v in vs}
            vs = vs + [v for v in self.optimizer.variables if id(v) not in seen]
        return vs

    def save_own_variables(self, store):
        # The table in key order, not per device: it loads into any device count.
        store["table"] = self.get_table()
        if self.optimizer is not None:
            store["bp_trigger"] = np.asarray(self.bp_trigger.numpy())

    def load_own_variables(self, store):
        if "table" not in store:
            raise ValueError(f"EmbeddingLayer {self.name!r}: the saved weights hold no 'table' "
                             f"(found {sorted(store.keys())})")
        self.set_table(np.asarray(store["table"]))
        if self.optimizer is not None and "bp_trigger" in store:
            self.bp_trigger.assign(np.asarray(store["bp_trigger"]))


def _after(x: SparseInput, deps) -> SparseInput:
    """x, with its keys read only after the ops `deps` ran (graph-mode checks)."""
    with tf.control_dependencies(deps):
        if x.is_coo:
            indices, keys, shape, weights = x.coo
            w = None if weights is None else tf.SparseTensor(indices, weights, shape)
            return SparseInput.from_sparse(tf.SparseTensor(indices, tf.identity(keys), shape), w)
        return SparseInput.from_row_splits(x.row_splits, tf.identity(x.keys), x.weights)
