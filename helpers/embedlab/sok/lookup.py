"""`lookup_sparse` and `all2all_dense_embedding`: model-parallel lookups of sharded tables.

Pipeline of one call (per group of tables with the same dim), on every worker:

1. ids -> CSR (`embedlab.SparseInput`); `EmbedLabRouteCount` counts the keys each owner gets
   per table and finds the first bad key;
2. `exchange.all_gather` of the counts (and the bad key): every worker now knows who sends
   whom how many keys, and every worker fails with the same message if any key was bad;
3. `EmbedLabRouteScatter` buckets the keys by owner (local row = key // n for distributed
   tables) into an `[n, P]` buffer, P = the largest bucket (at least 1), and keeps each key's
   position there (the inverse permutation);
4. all-to-all of the keys; each owner looks its rows up with EmbedLab's fused lookup (whose
   gradient is the shard's `IndexedSlices`), and all-to-all of the rows back;
5. the rows that came back are pooled per sample by EmbedLab's fused lookup over them, with
   the inverse positions as keys: combiner, weights and empty rows (zeros) as in
   `tf.nn.safe_embedding_lookup_sparse`.

The backward runs the same way in reverse: the pooled gradient is spread over the rows that
came back, sent to their owners by the all-to-all's gradient, and summed into each shard's
`IndexedSlices`. Nothing is all-reduced. With one worker, steps 2-5 collapse into one fused
lookup of the shards.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from .. import ops as _ops
from .. import _native
from ..sparse_input import SparseInput, as_csr
from . import _context, exchange
from .variable import is_sok_variable

__all__ = ["lookup_sparse", "all2all_dense_embedding", "sparse_read_and_evict", "incremental_model_dump"]

_COMBINERS = ("sum", "mean")
_WHERE = "embedlab.sok.lookup_sparse"


def _lib():
    return _native.tf_ops()


def _hashed(p) -> bool:
    """A table indexed by a hash table (DynamicVariable, or a first-generation layer with
    use_hashtable=True): any int64 key, mapped to a row by its owner."""
    return getattr(p, "hash_index", None) is not None


def _rows_for(p, keys):
    """Row indices of `keys` (no -1 among them) in the owner's table p."""
    if hasattr(p, "prepare_rows"):
        return p.prepare_rows(keys)
    return p.hash_index.lookup_index(keys)


def _rows_of(p):
    """What the fused lookup reads by row index: a DynamicVariable's `storage` (the variable
    itself is read by key), else the shard."""
    return p.storage if getattr(p, "is_dynamic", False) else p


def _route_attrs(params, n):
    modes, rows, ranks = [], [], []
    for v in params:
        if _hashed(v):
            if v.kind == "localized":
                modes.append(1); rows.append(-1); ranks.append(v.target_rank)
            else:
                modes.append(2); rows.append(-1); ranks.append(0)
        elif v.kind == "distributed":
            modes.append(0); rows.append(v.global_shape[0]); ranks.append(0)
        else:
            modes.append(1); rows.append(v.global_shape[0]); ranks.append(v.target_rank)
    return dict(num_workers=n, modes=modes, rows=rows, ranks=ranks)


def _bad_key_check(bad_all, names, where):
    """Fails (on every worker: bad_all [n, 3] is the same everywhere) if any worker had a bad key."""
    ok = tf.reduce_all(bad_all[:, 0] < 0)
    if tf.executing_eagerly():
        if bool(ok):
            return []
        import numpy as np
        b = bad_all.numpy()
        r = int(np.argmax(b[:, 0] >= 0))
        t, pos, key = (int(x) for x in b[r])
        raise tf.errors.InvalidArgumentError(
            None, None, f"{where}: key {key} of table {names[t]} (ids[{t}] position {pos}, on rank {r}) is outside "
                        f"the rows of the table; every worker stops here")
    r = tf.argmax(tf.cast(bad_all[:, 0] >= 0, tf.int32), output_type=tf.int64)
    row = bad_all[r]
    name = tf.gather(tf.constant(names), tf.maximum(row[0], 0))
    s = tf.strings.as_string
    msg = tf.strings.join([where, ": key ", s(row[2]), " of table ", name, " (ids[", s(row[0]), "] position ", s(row[1]),
                           ", on rank ", s(r), ") is outside the rows of the table; every worker stops here"])
    return [tf.debugging.Assert(ok, [msg], name="sok_bad_key")]


def _as_csr_list(sp_ids, sp_weights, where):
    """CSR (row_splits, keys, weights or None) of every ids, weighted all or none."""
    inputs = []
    for t, x in enumerate(sp_ids):
        if not isinstance(x, (tf.SparseTensor, tf.RaggedTensor, SparseInput)):
            raise ValueError(f"{where}: sp_ids[{t}] must be a tf.SparseTensor, tf.RaggedTensor or "
                             f"embedlab.SparseInput, got {type(x).__name__}")
        inputs.append(SparseInput.from_any(x, None if sp_weights is None else sp_weights[t], where=where))
    weighted = [x.has_weights for x in inputs]
    if any(weighted) and not all(weighted):
        raise ValueError(f"{where}: weights must be given for every table or for none; sp_ids "
                         f"{[t for t, w in enumerate(weighted) if not w]} carry no weights")
    return as_csr(inputs)


def _local_lookup(shards, csr, combiners):
    """One worker: the fused lookup of the shards themselves (keys are the local rows, or
    looked up in the table's hash index)."""
    ids = []
    for p, (s, k, w) in zip(shards, csr):
        if _hashed(p):
            valid = tf.not_equal(k, -1)
            pos = tf.where(valid)
            rows = _rows_for(p, tf.boolean_mask(k, valid))
            k = tf.tensor_scatter_nd_update(tf.fill(tf.shape(k, out_type=tf.int64), tf.constant(-1, tf.int64)), pos, rows)
        ids.append(SparseInput.from_row_splits(s, k, w))
    return _ops.fused_embedding_lookup([_rows_of(p) for p in shards], ids, combiners)


def _owner_lookup(params, recv, mine, n, P, dim):
    """Rows for the keys this worker received: recv [n, P] local rows (tables in order within
    each source's row, counts mine [n, T]), -1 padding. Returns [n * P, dim]."""
    T = len(params)
    cum = tf.cumsum(mine, axis=1)                                      # [n, T]
    pos = tf.tile(tf.range(P, dtype=tf.int64)[None], [n, 1])           # [n, P]
    tid = tf.reshape(tf.searchsorted(cum, pos, side="right", out_type=tf.int32), [-1])   # T = unused slot
    flat = tf.reshape(recv, [-1])
    keys_t = tf.dynamic_partition(flat, tid, T + 1)
    idx_t = tf.dynamic_partition(tf.range(n * P, dtype=tf.int32), tid, T + 1)
    local = [(_rows_for(p, keys_t[t]) if _hashed(p) else keys_t[t])[:, None] for t, p in enumerate(params)]
    rows = _ops.fused_embedding_lookup([_rows_of(p) for p in params], local, "sum")
    pad = tf.zeros([tf.shape(idx_t[T])[0], dim], tf.float32)
    return tf.dynamic_stitch(idx_t[:T] + [idx_t[T]], rows + [pad])


def _group_lookup(params, csr, combiners, names):
    ctx = _context.context()
    n, T = ctx.world_size, len(params)
    dim = int(params[0].shape[1])
    attrs = _route_attrs(params, n)
    keys = [k for _, k, _ in csr]
    counts, bad = _lib().embed_lab_route_count(keys, **attrs)
    base = _context.draw_keys()
    gathered = exchange.all_gather(tf.concat([tf.reshape(counts, [-1]), bad], 0), base)   # [n, n*T + 3]
    checks = _bad_key_check(gathered[:, n * T:], names, _WHERE)
    with tf.control_dependencies(checks):
        C = tf.reshape(gathered[:, :n * T], [n, n, T])                 # [src, owner, table]
        P = tf.maximum(tf.reduce_max(tf.reduce_sum(C, axis=2)), 1)
        send, inverse = _lib().embed_lab_route_scatter(keys, counts, P, **attrs)
    recv = exchange.all_to_all(tf.reshape(send, [n, P]), base + 1)
    rows = _owner_lookup(params, recv, C[:, ctx.rank, :], n, P, dim)
    back = exchange.all_to_all(tf.reshape(rows, [n, P, dim]), base + 2, grad_key=base + 3)
    received = tf.reshape(back, [n * P, dim])
    ids = [SparseInput.from_row_splits(csr[t][0], inverse[t], csr[t][2]) for t in range(T)]
    return _ops.fused_embedding_lookup([received] * T, ids, combiners)


def _check_params(params, where):
    for t, p in enumerate(params):
        if not is_sok_variable(p):
            raise ValueError(f"{where}: params[{t}] must be an embedlab.sok.Variable or DynamicVariable, got "
                             f"{type(p).__name__}")
        if tf.as_dtype(p.dtype) != tf.float32:
            raise ValueError(f"{where}: params[{t}] ('{p.table_name}') must be float32, got {tf.as_dtype(p.dtype).name}")


def lookup_sparse(params, sp_ids, sp_weights=None, combiners=None, hotness=None, use_low_frequency_filter=False,
                  name=None):
    """Pooled lookups of several sharded tables in one fused, model-parallel operation.

    Args:
        params: a list of `sok.Variable` / `sok.DynamicVariable` (or one).
        sp_ids: a list (same length) of `tf.SparseTensor [batch, max_hotness]`,
            `tf.RaggedTensor [batch, None]` or `embedlab.SparseInput` (which carries its own
            weights) int64 keys (global row ids), this worker's batch.
        sp_weights: None, or per-key float32 weights shaped like each ids.
        combiners: "sum" / "mean" or a list, one per table (default "mean").
        hotness: accepted for SOK v4.0's signature `lookup_sparse(params, sp_ids, hotness,
            combiners)`; not needed (ids carry their own lengths).

    Returns:
        a list of `[batch, dim]` float32 tensors (one tensor if params was one variable).
        Empty rows give zeros. The gradient of each table is this worker's shard's
        `IndexedSlices` (unique local rows, every worker's contributions summed).

    Raises:
        ValueError: lists of different lengths, an unknown combiner, wrong types.
        tf.errors.InvalidArgumentError: on every worker, when any worker has a key outside a
            table's rows (naming the table, the key and the rank).

    Every worker must call it with the same tables in the same order (it is a collective).

    Example:
        >>> import numpy as np, tensorflow as tf, embedlab.sok as sok
        >>> v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
        >>> v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)
        >>> ids1 = tf.ragged.constant([[1, 1], [3, 4, 5]], dtype=tf.int64)
        >>> ids2 = tf.ragged.constant([[1], [2, 3]], dtype=tf.int64)
        >>> emb1, emb2 = sok.lookup_sparse([v1, v2], [ids1, ids2], combiners=["sum", "mean"])
        >>> emb1.numpy().tolist(), emb2.numpy()[1].tolist()
        ([[6.0, 8.0, 10.0], [36.0, 39.0, 42.0]], [12.5, 13.5, 14.5, 15.5, 16.5])
    """
    single = not isinstance(params, (list, tuple))
    if single:
        params = [params]
        sp_ids = [sp_ids] if not isinstance(sp_ids, (list, tuple)) else sp_ids
        if sp_weights is not None and not isinstance(sp_weights, (list, tuple)):
            sp_weights = [sp_weights]
    params, sp_ids = list(params), list(sp_ids)
    # SOK v4.0/4.1: lookup_sparse(params, sp_ids, hotness, combiners)
    if sp_weights is not None and all(isinstance(h, int) for h in (sp_weights if isinstance(sp_weights, (list, tuple)) else [None])):
        hotness, sp_weights = sp_weights, None
    T = len(params)
    if T == 0:
        raise ValueError(f"{_WHERE}: params is empty")
    if len(sp_ids) != T:
        raise ValueError(f"{_WHERE}: got {T} params but {len(sp_ids)} sp_ids; they must have the same length")
    if sp_weights is not None:
        sp_weights = list(sp_weights)
        if len(sp_weights) != T or any(w is None for w in sp_weights):
            raise ValueError(f"{_WHERE}: got {T} params but {len(sp_weights)} sp_weights (None entries are not allowed)")
    if combiners is None:
        combiners = ["mean"] * T
    elif isinstance(combiners, str):
        combiners = [combiners] * T
    combiners = list(combiners)
    if len(combiners) != T:
        raise ValueError(f"{_WHERE}: got {T} params but {len(combiners)} combiners")
    for t, c in enumerate(combiners):
        if c not in _COMBINERS:
            raise ValueError(f"{_WHERE}: combiners[{t}] must be 'sum' or 'mean', got {c!r}")
    _check_params(params, _WHERE)
    ctx = _context.context()
    with tf.name_scope(name or "sok_lookup_sparse"):
        csr = _as_csr_list(sp_ids, sp_weights, _WHERE)
        out = [None] * T
        groups = {}
        if ctx.world_size == 1:
            groups[None] = list(range(T))       # one fused lookup, whatever the dims
        else:
            for t, p in enumerate(params):
                groups.setdefault(int(p.shape[1]), []).append(t)
        names = [p.table_name for p in params]
        for _, ts in groups.items():
            gp = [params[t] for t in ts]
            gc = [csr[t] for t in ts]
            gcomb = [combiners[t] for t in ts]
            if ctx.world_size == 1:
                attrs = _route_attrs(gp, 1)
                _, bad = _lib().embed_lab_route_count([c[1] for c in gc], **attrs)
                with tf.control_dependencies(_bad_key_check(bad[None], [names[t] for t in ts], _WHERE)):
                    gc = [(tf.identity(s), k, w) for s, k, w in gc]
                res = _local_lookup(gp, gc, gcomb)
            else:
                res = _group_lookup(gp, gc, gcomb, [names[t] for t in ts])
            for t, r in zip(ts, res):
                out[t] = r
    return out[0] if single else out


def all2all_dense_embedding(param, ids, name=None):
    """The lookup without a combiner: one vector per key.

    Args:
        param: a `sok.Variable` or `sok.DynamicVariable`.
        ids: int64 keys of any shape (dense tensor; -1 gives a zero vector).

    Returns:
        `[*ids.shape, dim]` float32, differentiable in the shard (IndexedSlices).
    """
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int64, tf.int32):
        raise ValueError(f"embedlab.sok.all2all_dense_embedding: ids must be int64, got {ids.dtype.name}")
    ids = tf.cast(ids, tf.int64)
    flat = tf.reshape(ids, [-1, 1])
    ragged = tf.RaggedTensor.from_tensor(flat)
    emb = lookup_sparse([param], [ragged], combiners=["sum"], name=name or "sok_all2all_dense_embedding")[0]
    dim = int(param.shape[1])
    return tf.reshape(emb, tf.concat([tf.shape(ids), [dim]], 0))


# SOK's APIs of its "hybrid" backend (HierarchicalKV, a GPU hash table that evicts rows when
# full): a DynamicVariable here never evicts (past max_capacity a lookup raises, naming the key).
_HKV_ONLY = ("embedlab.sok.{}: SOK's HierarchicalKV ('hybrid') backend, a GPU hash table that evicts rows when "
             "full, is not provided: a DynamicVariable here never evicts (it grows up to max_capacity, then a "
             "lookup raises naming the key). {}")


def sparse_read_and_evict(var, indices, name=None):
    """Not provided: needs SOK's HierarchicalKV backend (raises NotImplementedError)."""
    raise NotImplementedError(_HKV_ONLY.format("sparse_read_and_evict", "Read rows with lookup_sparse."))


def incremental_model_dump(*args, **kwargs):
    """Not provided: needs SOK's HierarchicalKV backend (raises NotImplementedError)."""
    raise NotImplementedError(_HKV_ONLY.format("incremental_model_dump", "Write whole tables with sok.dump."))
