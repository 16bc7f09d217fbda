"""The lookup machinery shared by `embedlab.ops`, `embedlab.plugin` and `embedlab.keras_rs`.

An internal module (not public API): what the three need of a fused lookup of table
variables beyond the public `ops.fused_embedding_lookup`:

* `as_variable`: the `tf.Variable` behind a table (a `tf.Variable` or a Keras variable);
* `sparse_inputs`: one `SparseInput` per ids entry, weighted all or none;
* `watch`: tells tapes and variable watchers about the tables, as reading them would;
* `on_cpu`: whether tables live on the CPU (the fused backward + update op's kernel);
* `resource_forward`: the fused forward of variables, reading them in place, that also returns
  the CSR ids it read (what a backward needs);
* `training_lookup`: that forward with a backward that applies each table's
  `embedlab.optimizers` instance to the touched rows in place ("optimizer in backward"), or
  returns the `IndexedSlices` gradient for tables that have none.

The op library is loaded on first use, not at import (`embedlab.ops` loads it at import).
"""
from __future__ import annotations

import functools

import tensorflow as tf
from tensorflow.python import pywrap_tfe
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.eager import tape as tape_lib
from tensorflow.python.ops import resource_variable_ops

from . import _native
from .sparse_input import SparseInput, as_csr, is_dtype

__all__ = ["as_variable", "is_dtype", "sparse_inputs", "watch", "on_cpu", "resource_forward",
           "training_lookup"]


def _lib():
    return _native.tf_ops()


def as_variable(table):
    """The tf.Variable behind `table` (tf.Variable or Keras variable), else None.

    Example:
        >>> v = tf.Variable(tf.ones([2, 2]))
        >>> as_variable(v) is v, as_variable(tf.ones([2, 2]))
        (True, None)
    """
    if isinstance(table, tf.Variable):
        return table
    value = getattr(table, "value", None)  # keras.Variable on the TensorFlow backend
    if isinstance(value, tf.Variable) and hasattr(table, "handle"):
        return value
    return None


def sparse_inputs(ids, weights, where):
    """One SparseInput per ids entry, and whether they carry weights.

    Args:
        ids: list of ids, each as `SparseInput.from_any` takes them.
        weights: None, or one weights tensor per ids entry.
        where: the caller's name, for error messages.

    Returns:
        `(list of SparseInput, weighted: bool)`.

    Raises:
        ValueError: some ids carry weights and others do not.

    Example:
        >>> xs, weighted = sparse_inputs([tf.constant([[1, -1]], tf.int64)], None, "example")
        >>> len(xs), weighted
        (1, False)
    """
    out = [SparseInput.from_any(x, None if weights is None else weights[t], where=where) for t, x in enumerate(ids)]
    weighted = [x.has_weights for x in out]
    if any(weighted) and not all(weighted):
        raise ValueError(f"{where}: weights must be given for every table or for none; ids "
                         f"{[t for t, w in enumerate(weighted) if not w]} carry no weights")
    return out, weighted[0]


def watch(variables):
    """Lets a GradientTape (and any variable watcher) watch the trainable variables, as reading
    them does. Eagerly, one batched notification instead of a graph check per variable: part of
    keeping an eager call's own cost small.

    Args:
        variables: list of `tf.Variable`.

    Example:
        >>> v = tf.Variable(1.0)
        >>> with tf.GradientTape() as tape:
        ...     watch([v])
        >>> [w is v for w in tape.watched_variables()]
        [True]
    """
    if tf.executing_eagerly():
        _variables_accessed(variables)
        return
    for v in variables:
        resource_variable_ops.variable_accessed(v)


def _variables_accessed(variables):
    """tape.variables_accessed(variables), with the distribution strategy looked up once for all
    the variables instead of once per variable (TensorFlow's resolver,
    distribute_lib.get_local_results_or_value_container, looks it up on every call: 26 of them
    were a third of this function's time). Where another resolver is installed, TensorFlow's
    own function runs."""
    if tape_lib._variables_override is not distribute_lib.get_local_results_or_value_container:
        tape_lib.variables_accessed(variables)
        return
    strategy, context = distribute_lib.get_strategy_and_replica_context()
    for v in variables:
        if not v.trainable:
            continue
        resolved = [strategy.extended.value_container(v)] if context else strategy.experimental_local_results(v)
        for var in resolved:
            pywrap_tfe.TFE_Py_TapeVariableAccessed(var)
            pywrap_tfe.TFE_Py_VariableWatcherVariableAccessed(var)


@functools.lru_cache(maxsize=None)
def _gpu_visible():
    # Logical devices are fixed once TensorFlow has initialised them (the first op did).
    return bool(tf.config.list_logical_devices("GPU"))


def on_cpu(variables) -> bool:
    """True when every variable lives on the CPU (or no GPU is visible at all).

    Example:
        >>> on_cpu([tf.Variable(1.0)])   # on a machine without a GPU
        True
    """
    if not _gpu_visible():
        return True
    return all(tf.DeviceSpec.from_string(v.handle.device or "").device_type == "CPU" for v in variables)


def resource_forward(variables, ids, weights, combiners, where):
    """The fused forward of a lookup of variables, read in place.

    Args:
        variables: list of float32 `tf.Variable` tables.
        ids: list (one per table) of ids, as `sparse_inputs` takes them.
        weights: None, or one weights tensor per table.
        combiners: list of "sum" | "mean", one per table.
        where: the caller's name, for error messages.

    Returns:
        `forward(handles) -> (outputs, row_splits, keys, weights)`: the pooled rows, and the CSR
        ids they were computed from (what a backward reads; weights is [] when unweighted).

    Example:
        >>> v = tf.Variable(tf.ones([4, 2]))
        >>> fwd = resource_forward([v], [tf.constant([[1, 2]], tf.int64)], None, ["sum"], "example")
        >>> fwd([v.handle])[0][0].numpy().tolist()
        [[2.0, 2.0]]
    """
    inputs, weighted = sparse_inputs(ids, weights, where)
    if all(x.is_coo for x in inputs) and on_cpu(variables):
        # All COO (the usual input) and CPU tables: conversion and lookup in one op
        # (CPU kernel only), so that COO input costs the train step little more than CSR input.
        coo = [x.coo for x in inputs]
        sparse = ([c[0] for c in coo], [c[1] for c in coo], [c[2] for c in coo],
                  [c[3] for c in coo] if weighted else [])

        def forward(handles):
            r = _lib().embed_lab_fused_resource_sparse_lookup(list(handles), *sparse, combiners=combiners)
            return list(r.outputs), list(r.row_splits), list(r.keys), list(r.weights_out)
        return forward
    csr = as_csr(inputs)
    splits, keys = [c[0] for c in csr], [c[1] for c in csr]
    wts = [c[2] for c in csr] if weighted else []

    def forward(handles):
        outs = _lib().embed_lab_fused_resource_lookup(list(handles), splits, keys, wts, combiners=combiners)
        return outs, splits, keys, wts
    return forward


def training_lookup(tables, ids, weights, combiners, table_optimizers, trigger=None, where="embedlab lookup"):
    """A fused lookup whose backward trains the tables that have an optimizer.

    The backward applies each table's `embedlab.optimizers` instance to its touched rows in
    place (one compiled op per optimizer and device, then one step of that optimizer's
    counter) and returns None for those tables; for a table whose optimizer is None it returns
    the `IndexedSlices` gradient (duplicates summed), for the caller's optimizer. The tape
    watches the tables through their handles, which go in as the inputs of the custom gradient
    (captured inside it, a tf.function would read, i.e. copy, every whole table on each step);
    with a `trigger` (a trainable scalar whose zero gradient runs the update, for tables the
    tape does not watch), its value goes in first.

    Args:
        tables: list of float32 table variables (`tf.Variable` or Keras variables).
        ids: list of ids, one per table (as `sparse_inputs` takes them).
        weights: None, or one weights tensor per table.
        combiners: list of "sum" | "mean", one per table.
        table_optimizers: list, one per table, of an `embedlab.optimizers` instance or None;
            an optimizer not yet built is built on its tables.
        trigger: None, or a trainable scalar float32 variable.
        where: the caller's name, for error messages.

    Returns:
        list of `[batch_t, dim_t]` float32 tensors.

    Example:
        >>> from embedlab.optimizers import SGD
        >>> v = tf.Variable(tf.ones([4, 2]))
        >>> with tf.GradientTape() as tape:
        ...     out = training_lookup([v], [tf.constant([[1]], tf.int64)], None, ["sum"], [SGD(0.5)])
        ...     loss = tf.reduce_sum(out[0])
        >>> tape.gradient(loss, v) is None, v.numpy()[1].tolist()
        (True, [0.5, 0.5])
    """
    variables = [as_variable(t) for t in tables]
    if any(v is None for v in variables):
        raise ValueError(f"{where}: with an optimizer, every table must be a variable")
    groups = {}   # id(optimizer) or None -> (optimizer, table indices), in order of first use
    for t, opt in enumerate(table_optimizers):
        groups.setdefault(None if opt is None else id(opt), (opt, []))[1].append(t)
    forward = resource_forward(variables, ids, weights, combiners, where)   # checks the ids first
    for opt, ts in groups.values():
        if opt is not None and not opt.built:
            opt.build([tables[t] for t in ts])
    watch(variables)   # the trainable tables; a non-trainable one is not watched

    @tf.custom_gradient
    def lookup(*args):
        handles = args[1:] if trigger is not None else args
        outs, splits, keys, wts = forward(handles)

        def grad(*dys):
            dys = [tf.zeros_like(o) if d is None else d for o, d in zip(outs, dys)]
            table_grads = [None] * len(handles)
            for opt, ts in groups.values():
                sel = (lambda xs, ts=ts: [xs[t] for t in ts])
                if opt is None:
                    res = _lib().embed_lab_fused_lookup_grad(sel(dys), sel(splits), sel(keys),
                                                             sel(wts) if wts else [], combiners=sel(combiners))
                    for i, t in enumerate(ts):
                        shape = resource_variable_ops.variable_shape(handles[t], out_type=tf.int64)
                        table_grads[t] = tf.IndexedSlices(res.rows[i], res.unique_keys[i], shape)
                    continue
                by_device = {}
                for t in ts:
                    by_device.setdefault(variables[t].handle.device, []).append(t)
                for device, dts in by_device.items():  # one op per device: it cannot span devices
                    with tf.device(device or None):
                        opt.apply_lookup_gradients(
                            [dys[t] for t in dts], [splits[t] for t in dts], [keys[t] for t in dts],
                            [wts[t] for t in dts] if wts else None, [combiners[t] for t in dts],
                            [tables[t] for t in dts])
                opt.iterations.assign_add(1)
            return ([tf.zeros_like(args[0])] if trigger is not None else []) + table_grads

        return outs, grad

    handles = [v.handle for v in variables]
    if trigger is not None:
        v = as_variable(trigger)
        handles = [tf.convert_to_tensor(trigger if v is None else v)] + handles
    return lookup(*handles)
