"""Keras layers over the HPS: ``LookupLayer`` and ``SparseLookupLayer`` (HugeCTR's ``hps_tf`` API).

Both run the TensorFlow op ``EmbedLabHpsLookup`` (``csrc/tf/hps_ops.cc``). Its host kernel calls
back into this process's :class:`~embedlab.hps.ParameterServer` through a C function pointer that
this module registers with the op library at import (ctypes; the callback takes the GIL). Why a
callback rather than tiers in C++: the server (cache, hash map, Redis and RocksDB clients, fault
handling, statistics) exists once, in Python, and the layers, the Triton python backend and the
notebooks share it; the compiled cache and hash map it calls release the GIL. The op stores
``model_name``, ``table_id``, ``emb_vec_size``, ``ps_config_file`` and ``global_batch_size`` as
attributes, so a SavedModel that holds the layers, reloaded in a fresh process after
``import embedlab.hps``, starts its server from ``ps_config_file`` on first call (HugeCTR's
implicit initialisation).

On a CUDA build of the op library the op also has a GPU kernel (``csrc/tf/hps_kernels_gpu.cc``),
chosen when TensorFlow places the op on a GPU. It hands the keys' device pointer, the output's
device pointer, the CUDA device and TensorFlow's stream to a second callback registered here,
``embedlab.hps._tf_device._device_lookup_callback`` (no TensorFlow in that module, so it is
tested on the GPU machine): the server's GPU tier serves the table on TensorFlow's stream when
it holds it on that device; otherwise the kernel goes through the host callback (one copy of the
keys to the host, one of the rows back), logged once per model, table and device.

This is the only module of :mod:`embedlab.hps` that imports TensorFlow.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import tensorflow as tf

from .._native import _HERE, tf_ops
from ._registry import get_server
from ._tf_device import DEVICE_CALLBACK_TYPE, _device_lookup_callback, _write_err

__all__ = ["LookupLayer", "SparseLookupLayer", "hps_lookup"]

_CALLBACK_TYPE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_int64)
_lock = threading.Lock()
_registered: list = []   # keeps the ctypes callbacks alive for the life of the process


def _lookup_callback(config, model, table_id, global_batch_size, keys_ptr, n, out_ptr, dim, err_ptr, err_len):
    try:
        ps = get_server(config.decode() if config else "", global_batch_size=global_batch_size)
        keys = np.frombuffer((ctypes.c_int64 * n).from_address(keys_ptr), dtype=np.int64)
        rows = ps.lookup(model.decode(), int(table_id), keys)
        if rows.shape[1] != dim:
            raise ValueError(f"emb_vec_size is {dim} but table {table_id} of model {model.decode()!r} "
                             f"has vectors of {rows.shape[1]}")
        out = np.frombuffer((ctypes.c_float * (n * dim)).from_address(out_ptr), dtype=np.float32)
        out[:] = rows.reshape(-1)
        return 0
    except BaseException as e:  # never let an exception cross into C++
        _write_err(err_ptr, err_len, f"{type(e).__name__}: {e}")
        return 1


def _register() -> None:
    with _lock:
        if _registered:
            return
        tf_ops()  # loads (and checks) the op library, registering the op
        lib = ctypes.CDLL(str(_HERE / "_embedlab_ops.so"))
        cb = _CALLBACK_TYPE(_lookup_callback)
        lib.embedlab_hps_set_lookup_callback.argtypes = [_CALLBACK_TYPE]
        lib.embedlab_hps_set_lookup_callback.restype = None
        lib.embedlab_hps_set_lookup_callback(cb)
        _registered.extend([lib, cb])
        # The GPU kernel's callback. Every op library built from this source tree exports the
        # setter (hps_kernels.cc); one built before it has no GPU kernel of the op either.
        if hasattr(lib, "embedlab_hps_set_device_lookup_callback"):
            dcb = DEVICE_CALLBACK_TYPE(_device_lookup_callback)
            lib.embedlab_hps_set_device_lookup_callback.argtypes = [DEVICE_CALLBACK_TYPE]
            lib.embedlab_hps_set_device_lookup_callback.restype = None
            lib.embedlab_hps_set_device_lookup_callback(dcb)
            _registered.append(dcb)


_register()


def hps_lookup(ids, model_name: str, table_id: int, emb_vec_size: int, ps_config_file: str = "",
               global_batch_size: int = 1):
    """The raw op: ``ids`` (int32/int64, any shape) -> float32 ``ids.shape + [emb_vec_size]``."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int32, tf.int64):
        raise TypeError(f"hps lookup: ids must be int32 or int64, got {ids.dtype.name}")
    return tf_ops().embed_lab_hps_lookup(ids=ids, model_name=model_name, table_id=int(table_id),
                                         emb_vec_size=int(emb_vec_size), ps_config_file=str(ps_config_file),
                                         global_batch_size=int(global_batch_size), dtype=tf.float32)


def _check_args(model_name, table_id, emb_vec_size, emb_vec_dtype, global_batch_size):
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"hps layer: model_name must be a non-empty string, got {model_name!r}")
    if isinstance(table_id, bool) or not isinstance(table_id, int) or table_id < 0:
        raise ValueError(f"hps layer: table_id must be an int >= 0, got {table_id!r}")
    if isinstance(emb_vec_size, bool) or not isinstance(emb_vec_size, int) or emb_vec_size < 1:
        raise ValueError(f"hps layer: emb_vec_size must be an int >= 1, got {emb_vec_size!r}")
    if tf.as_dtype(emb_vec_dtype) != tf.float32:
        raise ValueError(f"hps layer: emb_vec_dtype must be tf.float32 (the sparse files hold float32), "
                         f"got {tf.as_dtype(emb_vec_dtype).name}")
    if isinstance(global_batch_size, bool) or not isinstance(global_batch_size, int) or global_batch_size < 1:
        raise ValueError(f"hps layer: global_batch_size must be an int >= 1, got {global_batch_size!r}")


def _clip(emb, max_norm):
    if max_norm is None:
        return emb
    return tf.clip_by_norm(emb, max_norm, axes=[-1])


class LookupLayer(tf.keras.layers.Layer):
    """HugeCTR's ``hps.LookupLayer``: like ``tf.nn.embedding_lookup`` on an HPS table.

    Args:
        model_name: the model's ``model`` in the HPS JSON.
        table_id: index into its ``sparse_files``.
        emb_vec_size: the table's vector size.
        emb_vec_dtype: tf.float32.
        ps_config_file: the HPS JSON; with it the layer starts the server on first call when none
            runs for that file (implicit init). Empty: the server of the last ``hps.Init``.
        global_batch_size: passed to the implicit ``hps.Init``.

    Call: ``layer(ids, max_norm=None)`` (HugeCTR's argument names; Keras passes ``ids``
    positionally) with int32/int64 ids of any shape returns float32 ``ids.shape + [emb_vec_size]``,
    each vector clipped to an l2-norm of ``max_norm`` as ``tf.nn.embedding_lookup`` clips.

    Example:
        >>> import json, numpy as np
        >>> from embedlab.sparse_model import write_sparse_model
        >>> _ = write_sparse_model("demo.model", np.arange(10), np.arange(20, dtype=np.float32).reshape(10, 2))
        >>> with open("hps.json", "w") as f:
        ...     json.dump({"models": [{"model": "demo", "sparse_files": ["demo.model"],
        ...                             "embedding_vecsize_per_table": [2]}]}, f)
        >>> import embedlab.hps as hps
        >>> emb = hps.LookupLayer("demo", 0, 2, ps_config_file="hps.json")(tf.constant([[1, 5]], tf.int64))
        >>> emb.numpy().tolist()
        [[[2.0, 3.0], [10.0, 11.0]]]
        >>> hps.shutdown("hps.json")
    """

    def __init__(self, model_name, table_id, emb_vec_size, emb_vec_dtype=tf.float32, ps_config_file="",
                 global_batch_size=1, **kwargs):
        _check_args(model_name, table_id, emb_vec_size, emb_vec_dtype, global_batch_size)
        super().__init__(trainable=False, **kwargs)
        self.model_name, self.table_id, self.emb_vec_size = model_name, table_id, emb_vec_size
        self.emb_vec_dtype = tf.float32
        # An existing relative path is stored absolute: a SavedModel may be loaded from another folder.
        ps_config_file = str(ps_config_file)
        if ps_config_file and not os.path.isabs(ps_config_file) and os.path.exists(ps_config_file):
            ps_config_file = os.path.abspath(ps_config_file)
        self.ps_config_file, self.global_batch_size = ps_config_file, global_batch_size

    def call(self, ids, max_norm=None):
        emb = hps_lookup(ids, self.model_name, self.table_id, self.emb_vec_size, self.ps_config_file,
                         self.global_batch_size)
        return _clip(emb, max_norm)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.emb_vec_size,)

    def get_config(self):
        c = super().get_config()
        c.update(model_name=self.model_name, table_id=self.table_id, emb_vec_size=self.emb_vec_size,
                 ps_config_file=self.ps_config_file, global_batch_size=self.global_batch_size)
        return c


class SparseLookupLayer(LookupLayer):
    """HugeCTR's ``hps.SparseLookupLayer``: ``tf.nn.embedding_lookup_sparse`` on an HPS table.

    Call: ``layer(sp_ids, sp_weights=None, name=None, combiner=None, max_norm=None)`` (HugeCTR's
    signature; ``combiner`` "mean" when None, or "sum" / "sqrtn") with a ``[batch, max_nnz]``
    ``tf.SparseTensor`` of ids returns float32 ``[batch, emb_vec_size]``.

    The result is bitwise equal to ``tf.nn.embedding_lookup_sparse`` over a table holding the
    same rows: the unique ids' rows come from the HPS, and TensorFlow's own segment reductions
    pool them in TensorFlow's order (``sparse_segment_sum/mean/sqrt_n`` without weights,
    ``segment_sum`` of weighted rows with them). Differences from it: rows without ids give
    zeros and the output always has ``dense_shape[0]`` rows (TensorFlow's stops at the last
    non-empty row); ids out of row order are pooled as their canonical (row-major) order
    would be, not refused. Unlike ``safe_embedding_lookup_sparse``, negative ids and
    non-positive weights are not pruned: every id is an HPS key.
    """

    def call(self, sp_ids, sp_weights=None, name=None, combiner=None, max_norm=None):
        if combiner is None:
            combiner = "mean"
        if combiner not in ("mean", "sum", "sqrtn"):
            raise ValueError(f"SparseLookupLayer: combiner must be 'mean', 'sum' or 'sqrtn', got {combiner!r}")
        if not isinstance(sp_ids, tf.SparseTensor):
            raise TypeError(f"SparseLookupLayer: sp_ids must be a tf.SparseTensor, got {type(sp_ids).__name__}")
        if sp_ids.shape.rank is not None and sp_ids.shape.rank != 2:
            raise ValueError(f"SparseLookupLayer: sp_ids must be [batch, max_nnz], got rank {sp_ids.shape.rank}")
        if sp_weights is not None and not isinstance(sp_weights, tf.SparseTensor):
            raise TypeError("SparseLookupLayer: sp_weights must be a tf.SparseTensor (or None)")
        batch = sp_ids.dense_shape[0]
        segment_ids = sp_ids.indices[:, 0]
        ids = sp_ids.values
        weights = None
        if sp_weights is not None:
            weights = tf.cast(sp_weights.values, tf.float32)
            tf.debugging.assert_equal(tf.shape(weights), tf.shape(ids),
                                      message="SparseLookupLayer: sp_weights and sp_ids differ in nnz")
        # TensorFlow's segment ops need the row ids sorted: the entries are put in row-major
        # order (the summation order of a canonical SparseTensor; the identity on one).
        order = tf.argsort(segment_ids * sp_ids.dense_shape[1] + sp_ids.indices[:, 1], stable=True)
        segment_ids, ids = tf.gather(segment_ids, order), tf.gather(ids, order)
        if weights is not None:
            weights = tf.gather(weights, order)
        unique_ids, idx = tf.unique(ids)
        emb = _clip(hps_lookup(unique_ids, self.model_name, self.table_id, self.emb_vec_size,
                               self.ps_config_file, self.global_batch_size), max_norm)
        if weights is None:
            # tf.nn.embedding_lookup_sparse without weights: one sparse segment reduction.
            reduce = {"sum": tf.sparse.segment_sum, "mean": tf.sparse.segment_mean,
                      "sqrtn": tf.sparse.segment_sqrt_n}[combiner]
            return reduce(emb, idx, segment_ids, num_segments=batch, name=name)
        # With weights: weighted rows, then sorted segment sums (the rows after the last
        # non-empty one are added as zeros).
        segment_ids = tf.cast(segment_ids, tf.int32)
        weights = tf.reshape(weights, [-1, 1])
        out = tf.math.segment_sum(tf.gather(emb, idx) * weights, segment_ids)
        if combiner == "mean":
            out = tf.math.divide_no_nan(out, tf.math.segment_sum(weights, segment_ids))
        elif combiner == "sqrtn":
            out = tf.math.divide_no_nan(out, tf.sqrt(tf.math.segment_sum(tf.pow(weights, 2), segment_ids)))
        return tf.pad(out, [[0, tf.cast(batch, tf.int32) - tf.shape(out)[0]], [0, 0]], name=name)
