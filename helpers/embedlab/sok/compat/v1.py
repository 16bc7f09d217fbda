"""SOK's first-generation API (its getting-started guide), on the same machinery.

The guide's training step::

    with strategy.scope():
        sok.Init(global_batch_size=65536)
        model = DemoModel(...)        # layers: sok.All2AllDenseEmbedding / sok.DistributedEmbedding
        emb_opt = tf.keras.optimizers.Adam(learning_rate=0.1)
        dense_opt = tf.keras.optimizers.Adam(learning_rate=0.1)

    @tf.function
    def _train_step(inputs, labels):
        with tf.GradientTape() as tape:
            logits = model(inputs, training=True)
            loss = _replica_loss(labels, logits)
        emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
        grads, emb_grads = tape.gradient(loss, [other_var, emb_var])
        with sok.OptimizerScope(emb_var):
            emb_opt.apply_gradients(zip(emb_grads, emb_var), experimental_aggregate_gradients=False)
        dense_opt.apply_gradients(zip(grads, other_var))
        return loss

Each embedding layer owns one table of `max_vocabulary_size_per_gpu` rows on every worker.
With `use_hashtable=False` keys are row ids: key k lives on worker k % n, row k // n (keys must be
below max_vocabulary_size_per_gpu * n). With `use_hashtable=True` (the default) any int64 key
is accepted: worker k mod n maps it to a row of its table through a hash table, and an error
names the key when a worker's table is full. The table is a Keras weight of the layer (so it
appears in `model.trainable_variables`), created per worker outside the strategy: its gradient
is a local IndexedSlices and `OptimizerScope` makes the optimizer update it locally.
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from ... import tables as _tables
from ...plugin.placement import distributed_owner
from .. import _context
from ..lookup import all2all_dense_embedding, lookup_sparse
from ..optimizer import OptimizerWrapper, local_variable_scope

__all__ = ["Init", "DistributedEmbedding", "All2AllDenseEmbedding", "split_embedding_variable_from_others",
           "OptimizerScope", "Saver", "get_embedding"]

_global_batch_size = None


def Init(global_batch_size=None, seed=None, **kwargs):
    """Initialises SOK for this process (call it under `strategy.scope()` or before building the
    model). Returns None; `global_batch_size` is kept for reference (losses are scaled by the
    caller, e.g. `tf.nn.compute_average_loss`)."""
    global _global_batch_size
    _global_batch_size = global_batch_size
    _context.init()
    if seed is not None:
        tf.random.set_seed(seed)


def _default_initializer():
    return keras.initializers.RandomUniform(-0.05, 0.05)


class _EmbeddingBase(keras.layers.Layer):
    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, **kwargs):
        super().__init__(**kwargs)
        if int(max_vocabulary_size_per_gpu) < 1 or int(embedding_vec_size) < 1:
            raise ValueError(f"{type(self).__name__}: max_vocabulary_size_per_gpu and embedding_vec_size must be >= 1")
        # SOK's default (None) means int64, as in its EmbeddingVariable (`key_dtype or dtypes.int64`).
        key_dtype = tf.int64 if key_dtype is None else key_dtype
        try:
            ok = tf.as_dtype(key_dtype) in (tf.int64, tf.int32, tf.uint32)
        except TypeError:
            ok = False
        if not ok:
            raise ValueError(f"{type(self).__name__}: key_dtype must be int64, int32, uint32 or None (int64), "
                             f"got {key_dtype!r}")
        self.max_vocabulary_size_per_gpu = int(max_vocabulary_size_per_gpu)
        self.embedding_vec_size = int(embedding_vec_size)
        self.use_hashtable = bool(use_hashtable)
        self.key_dtype = tf.as_dtype(key_dtype)
        self.embedding_initializer = embedding_initializer or _default_initializer()
        ctx = _context.context()
        with local_variable_scope():
            self.embedding_variable = self.add_weight(
                shape=(self.max_vocabulary_size_per_gpu, self.embedding_vec_size),
                initializer=_tables.initializer(self.embedding_initializer),
                trainable=True, name="EmbeddingVariable",
                autocast=False)   # as SOK: the table stays in the policy's variable dtype
        v = self.embedding_variable
        v.is_sok_variable = True
        v.mode, v.kind, v.target_rank = "distributed", "distributed", -1
        v.rank, v.num_workers = ctx.rank, ctx.world_size
        v.table_name = self.name
        v.global_shape = [self.max_vocabulary_size_per_gpu * ctx.world_size, self.embedding_vec_size]
        # SOK's embedding variable is a DistributedVariable whose `values` are its per-GPU
        # EmbeddingVariables, each naming its Saver files `<m_var_name>_keys.file` /
        # `_values.file` (HugeCTR's demo-model tests read `values[0].m_var_name` to find them).
        # A worker here holds one table: `values` is this variable alone, and `m_var_name` the
        # name `Saver` gives its files.
        v.values = (v,)
        v.m_var_name = _file_name(v)
        self._hash = None
        if self.use_hashtable:
            from ..dynamic import LocalHashIndex
            self._hash = LocalHashIndex(self.max_vocabulary_size_per_gpu, self.name)
            v.is_dynamic_index = True
            v.hash_index = self._hash
        self.built = True

    def _lookup(self, sp_ids, combiner):
        return self._to_compute_dtype(lookup_sparse([self.embedding_variable], [sp_ids], combiners=[combiner])[0])

    def _to_compute_dtype(self, out):
        # SOK returns the vectors in the layer's compute dtype (float16 under `mixed_float16`).
        return tf.cast(out, self.compute_dtype) if out.dtype != self.compute_dtype else out


class DistributedEmbedding(_EmbeddingBase):
    """Pooled embedding of `slot_num` slots per sample.

    Input: `tf.SparseTensor` with dense_shape `[batch * slot_num, max_nnz]` (row b * slot_num + s
    holds sample b's keys of slot s). Output: `[batch, slot_num, embedding_vec_size]`.
    """

    def __init__(self, combiner, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, max_nnz,
                 max_feature_num=1, use_hashtable=True, key_dtype=None, embedding_initializer=None, **kwargs):
        if combiner not in ("sum", "mean"):
            raise ValueError(f"DistributedEmbedding: combiner must be 'sum' or 'mean', got {combiner!r}")
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable, key_dtype,
                         embedding_initializer, **kwargs)
        self.combiner, self.slot_num, self.max_nnz = combiner, int(slot_num), int(max_nnz)
        self.max_feature_num = max_feature_num

    def call(self, inputs, training=True):
        if not isinstance(inputs, tf.SparseTensor):
            raise ValueError(f"DistributedEmbedding: input must be a tf.SparseTensor [batch * slot_num, max_nnz], "
                             f"got {type(inputs).__name__}")
        sp = tf.SparseTensor(inputs.indices, tf.cast(inputs.values, tf.int64), inputs.dense_shape)
        emb = self._lookup(sp, self.combiner)
        return tf.reshape(emb, [-1, self.slot_num, self.embedding_vec_size])


class All2AllDenseEmbedding(_EmbeddingBase):
    """One vector per key: input `[batch, slot_num, nnz_per_slot]` int keys, output
    `[batch, slot_num, nnz_per_slot, embedding_vec_size]` (`dynamic_input=True`: any shape, e.g.
    `[None]`, output `[..., embedding_vec_size]`)."""

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot, dynamic_input=False,
                 use_hashtable=True, key_dtype=None, embedding_initializer=None, **kwargs):
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable, key_dtype,
                         embedding_initializer, **kwargs)
        self.slot_num, self.nnz_per_slot, self.dynamic_input = int(slot_num), int(nnz_per_slot), bool(dynamic_input)

    def call(self, inputs, training=True):
        ids = tf.cast(inputs, tf.int64)
        if not self.dynamic_input and ids.shape.rank is not None and ids.shape.rank != 3:
            raise ValueError(f"All2AllDenseEmbedding: input must be [batch, slot_num, nnz_per_slot], got {ids.shape}")
        out = self._to_compute_dtype(all2all_dense_embedding(self.embedding_variable, ids))
        if not self.dynamic_input:
            out = tf.reshape(out, [-1, self.slot_num, self.nnz_per_slot, self.embedding_vec_size])
        return out

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.embedding_vec_size,)


_embedding_store = threading.local()


def get_embedding(name, constructor=None, **kwargs):
    """The embedding layer called `name`, created with `constructor(**kwargs)` on first use (SOK's
    `sok.get_embedding`: one store per thread). Later calls with the same name return the same
    layer and ignore `constructor` and `kwargs`.

    Example:
        >>> import embedlab.sok as sok
        >>> emb = sok.get_embedding("Emb", sok.All2AllDenseEmbedding, max_vocabulary_size_per_gpu=1024,
        ...                         embedding_vec_size=16, slot_num=10, nnz_per_slot=1)
        >>> sok.get_embedding("Emb") is emb
        True
    """
    store = getattr(_embedding_store, "layers", None)
    if store is None:
        store = _embedding_store.layers = {}
    layer = store.get(name)
    if layer is None:
        if constructor is None:
            raise ValueError(f"embedlab.sok.get_embedding: no embedding layer '{name}' yet, and no constructor to "
                             f"create it")
        layer = store[name] = constructor(**kwargs)
    return layer


def split_embedding_variable_from_others(variables):
    """(embedding variables, other variables) of a list such as `model.trainable_variables`."""
    emb, other = [], []
    for v in variables:
        (emb if getattr(v, "is_sok_variable", False) else other).append(v)
    return emb, other


_scope_state = threading.local()
_wrappers = {}
_patch_lock = threading.Lock()


class OptimizerScope(contextlib.ContextDecorator):
    """Within it, `optimizer.apply_gradients(zip(grads, emb_vars), experimental_aggregate_gradients=False)`
    of any Keras optimizer updates these embedding variables locally (through an
    `OptimizerWrapper` kept per optimizer), without the strategy's all-reduce."""

    def __init__(self, trainable_variables):
        self._ids = {id(v) for v in trainable_variables}

    def __enter__(self):
        stack = getattr(_scope_state, "stack", None)
        if stack is None:
            stack = _scope_state.stack = []
        stack.append(self._ids)
        _install_patch()
        return self

    def __exit__(self, *exc):
        _scope_state.stack.pop()
        return False


def _in_scope(v):
    return any(id(v) in ids for ids in getattr(_scope_state, "stack", []) or [])


def _install_patch():
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    with _patch_lock:
        if getattr(BaseOptimizer.apply_gradients, "_sok_patched", False):
            return
        original = BaseOptimizer.apply_gradients

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            kwargs.pop("experimental_aggregate_gradients", None)
            pairs = list(grads_and_vars)
            if pairs and all(_in_scope(v) for _, v in pairs):
                w = _wrappers.get(id(self))
                if w is None:
                    w = _wrappers[id(self)] = OptimizerWrapper(self)
                return w.apply_gradients(pairs)
            if any(_in_scope(v) for _, v in pairs):
                raise ValueError("sok.OptimizerScope: apply embedding variables and other variables in separate "
                                 "apply_gradients calls (see split_embedding_variable_from_others)")
            return original(self, pairs, *args, **kwargs)

        apply_gradients._sok_patched = True
        BaseOptimizer.apply_gradients = apply_gradients


class Saver:
    """`dump_to_file(var, dir)` / `restore_from_file(var, dir)`: a table's keys and values as raw
    binary files `<name>_keys.file` (int64) and `<name>_values.file` (float32 rows), written by
    rank 0 (collective: every worker calls it)."""

    def dump_to_file(self, embedding_variable, filepath):
        from ..checkpoint import gather, barrier_status
        from ..._io import atomic_file
        keys, rows = _gather_legacy(embedding_variable)
        name = _file_name(embedding_variable)
        ok, err = True, None
        if _context.rank() == 0:
            try:
                Path(filepath).mkdir(parents=True, exist_ok=True)
                with atomic_file(Path(filepath) / f"{name}_keys.file", fsync=True) as tmp:
                    keys.astype(np.int64).tofile(tmp)
                with atomic_file(Path(filepath) / f"{name}_values.file", fsync=True) as tmp:
                    rows.astype(np.float32).tofile(tmp)
            except Exception as e:
                ok, err = False, e
        barrier_status(ok, f"Saver.dump_to_file to {filepath}", err)
        if err is not None:
            raise err

    def restore_from_file(self, embedding_variable, filepath):
        name = _file_name(embedding_variable)
        kf, vf = Path(filepath) / f"{name}_keys.file", Path(filepath) / f"{name}_values.file"
        for f in (kf, vf):
            if not f.exists():
                raise FileNotFoundError(f"Saver.restore_from_file: {f} is missing")
        keys = np.fromfile(kf, np.int64)
        dim = int(embedding_variable.shape[1])
        vals = np.fromfile(vf, np.float32)
        if vals.size != keys.size * dim:
            raise ValueError(f"Saver.restore_from_file: {vf} holds {vals.size} floats, expected {keys.size} keys x {dim}")
        self.load_embedding_values(embedding_variable, tf.constant(vals.reshape(-1, dim)), keys)

    def load_embedding_values(self, embedding_variable, tensors, keys=None):
        """Sets the whole table: `tensors` `[rows, dim]` are the values of keys 0..rows-1 (or of `keys`)."""
        vals = np.asarray(tf.concat(tensors, 0) if isinstance(tensors, (list, tuple)) else tensors, np.float32)
        keys = np.arange(vals.shape[0], dtype=np.int64) if keys is None else np.asarray(keys, np.int64)
        v = embedding_variable
        n, r = v.num_workers, v.rank
        owner, local = distributed_owner(keys, n)
        mine = owner == r
        if getattr(v, "is_dynamic_index", False):
            v.hash_index.assign(v, keys[mine], vals[mine])
            return
        rows = local[mine]
        if rows.size and rows.max() >= v.shape[0]:
            raise ValueError(f"Saver: key {int(keys[mine][rows.argmax()])} does not fit a table of "
                             f"{v.shape[0]} rows per worker")
        full = np.array(v.numpy())
        full[rows] = vals[mine]
        _tables.assign(v, full)          # a placed table stays in its mapping


def _file_name(v):
    return (getattr(v, "table_name", None) or v.name).replace("/", "_").replace(":", "_")


def _gather_legacy(v):
    from .. import exchange
    if getattr(v, "is_dynamic_index", False):
        k, idx = v.hash_index.export()
        rows = tf.gather(tf.convert_to_tensor(v), idx)
        keys = tf.constant(k)
    else:
        keys = tf.constant(np.arange(v.shape[0], dtype=np.int64) * v.num_workers + v.rank)
        rows = tf.convert_to_tensor(v)
    ks = exchange.all_gather_varying(keys)
    vs = exchange.all_gather_varying(rows)
    keys = np.concatenate([k.numpy() for k in ks])
    vals = np.concatenate([x.numpy() for x in vs]).reshape(-1, int(v.shape[1]))
    order = np.argsort(keys, kind="stable")
    return keys[order], vals[order]
