"""A Criteo DeepFM trained with `sok.lookup_sparse`, on 1 or N workers (notebook 04's model).

    python -m embedlab.sok.launch -n 2 -m ... (see notebook 04), or directly:
    python -m embedlab.sok.demo --data rows.tsv --steps 40 --global-batch 512 --out run.json

26 categorical slots, each its own `sok.Variable` of `vocab` rows (key = hashed category mod
vocab), plus 13 dense features. DeepFM: a first-order term (a dim-1 table per slot and a linear
layer over the dense features), the factorization-machine interaction of the slots' vectors,
and an MLP over the vectors and dense features. Tables are initialised from one seed as whole
tables and sharded, and every worker trains on its slice of the same global batch, so 1 and N
workers follow the same loss curve (up to float rounding).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np

SLOTS, DENSE = 26, 13


def load_criteo(path, max_rows=None):
    """(cats uint32 [n, 26] with missing -> 0, dense float32 [n, 13] log-scaled, labels [n, 1])."""
    from ..data import criteo
    cats, ints, imiss, labels = [], [], [], []
    for _, block in criteo.read_chunks(path):
        cats.append(np.where(block.cat_missing, 0, block.cats))
        ints.append(block.ints); imiss.append(block.int_missing); labels.append(block.label)
    cats = np.concatenate(cats).astype(np.int64)
    ints = np.concatenate(ints).astype(np.float64)
    ints[np.concatenate(imiss)] = 0
    dense = np.log1p(np.maximum(ints, 0)).astype(np.float32)
    labels = np.concatenate(labels).astype(np.float32)[:, None]
    if max_rows:
        cats, dense, labels = cats[:max_rows], dense[:max_rows], labels[:max_rows]
    return cats, dense, labels


def build(vocab, dim, seed, hidden=(64, 32)):
    """(tables, first-order tables, dense layers, optimizers) for this worker."""
    import keras
    import tensorflow as tf
    from . import OptimizerWrapper, Variable, context
    import embedlab.optimizers as eo
    rng = np.random.default_rng(seed)
    tables = [Variable(rng.uniform(-0.05, 0.05, size=(vocab, dim)).astype(np.float32), name=f"slot{s}")
              for s in range(SLOTS)]
    linear = [Variable(np.zeros((vocab, 1), np.float32), name=f"slot{s}_w") for s in range(SLOTS)]
    strategy = context().strategy
    with strategy.scope():
        layers = [keras.layers.Dense(h, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed + i))
                  for i, h in enumerate(hidden)]
        layers.append(keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 99)))
        dense_linear = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")
        width = SLOTS * dim + DENSE
        for l in layers:
            l.build((None, width))
            width = l.units
        dense_linear.build((None, DENSE))
        dense_opt = keras.optimizers.Adam(learning_rate=1e-3)
    emb_opt = OptimizerWrapper(eo.Adagrad(learning_rate=0.05))
    return tables, linear, layers, dense_linear, dense_opt, emb_opt


def _ids(tf, cats_slice, vocab):
    keys = tf.constant(cats_slice % vocab)
    return [tf.RaggedTensor.from_tensor(keys[:, s:s + 1]) for s in range(SLOTS)]


def train(data, steps, global_batch, vocab=10_000, dim=8, seed=0, out=None, dump_dir=None, profile=False):
    """Trains DeepFM; returns (and, on rank 0, writes to `out` as JSON) the per-step global losses
    and, with `profile`, a step-time breakdown (ms): lookup kernels, exchange, dense, update."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from . import dump, init, lookup_sparse
    from .. import ops

    ctx = init()
    n, rank = ctx.world_size, ctx.rank
    if global_batch % n:
        raise ValueError(f"global batch {global_batch} is not divisible by {n} workers")
    local = global_batch // n
    cats, dense, labels = data if isinstance(data, tuple) else load_criteo(data)
    tables, linear, layers, dense_linear, dense_opt, emb_opt = build(vocab, dim, seed)
    sparse_vars = tables + linear
    strategy = ctx.strategy

    def forward(ids, x_dense):
        embs = lookup_sparse(tables, ids, combiners="sum")
        firsts = lookup_sparse(linear, ids, combiners="sum")
        v = tf.stack(embs, 1)                                            # [B, 26, dim]
        fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(v, 1)) - tf.reduce_sum(tf.square(v), 1), 1, keepdims=True)
        h = tf.concat([tf.reshape(v, [-1, SLOTS * dim]), x_dense], 1)
        for l in layers:
            h = l(h)
        return h + fm + tf.add_n(firsts) + dense_linear(x_dense)

    def replica_step(ids, x_dense, y):
        with tf.GradientTape() as tape:
            logits = forward(ids, x_dense)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)) / global_batch
        dvars = [w for l in layers + [dense_linear] for w in l.trainable_variables]
        grads = tape.gradient(loss, sparse_vars + dvars)
        emb_opt.apply_gradients(zip(grads[:len(sparse_vars)], sparse_vars))
        dense_opt.apply_gradients(zip(grads[len(sparse_vars):], dvars))
        return loss

    @tf.function
    def step(ids, x_dense, y):
        per = strategy.run(replica_step, args=(ids, x_dense, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    def batch(i):
        lo = (i * global_batch) % (len(cats) - global_batch + 1) + rank * local
        return (_ids(tf, cats[lo:lo + local], vocab), tf.constant(dense[lo:lo + local]), tf.constant(labels[lo:lo + local]))

    losses, times = [], []
    for i in range(steps):
        b = batch(i)
        t0 = time.perf_counter()
        losses.append(float(step(*b)))
        times.append(time.perf_counter() - t0)
    res = {"workers": n, "global_batch": global_batch, "steps": steps, "losses": losses,
           "step_ms": 1e3 * float(np.median(times[2:] if steps > 4 else times))}
    from . import gather
    table0 = gather(tables[0])[1]      # the whole first table after training (collective), for comparisons
    if dump_dir:   # before profiling, whose update step moves the tables
        dump(dump_dir, tables[:2], emb_opt)
    if profile:
        res["breakdown_ms"] = _breakdown(tf, ops, lookup_sparse, tables + linear, layers, dense_linear, emb_opt, batch,
                                         global_batch, n, dim)
    if rank == 0 and out:
        Path(out).write_text(json.dumps(res))
    res["table0"] = table0
    return res


def _breakdown(tf, ops, lookup_sparse, svars, layers, dense_linear, emb_opt, batch, global_batch, n, dim, reps=5):
    """Times the parts of a step on their own (ms, medians): the lookup's local kernels (forward
    and backward on this worker's shards, no communication), the exchange (the same with the
    collectives, minus that), the dense part (forward and backward), and the update."""
    ids, x_dense, y = batch(0)
    r = [tf.ones([int(x_dense.shape[0]), int(v.shape[1])]) for v in svars]
    all_ids = ids + ids

    @tf.function
    def with_exchange():
        with tf.GradientTape() as tape:
            embs = lookup_sparse(svars, all_ids, combiners="sum")
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        return tape.gradient(loss, svars)

    local_ids = [tf.RaggedTensor.from_row_splits(x.values // n, x.row_splits) for x in all_ids]

    @tf.function
    def local_only():
        with tf.GradientTape() as tape:
            embs = ops.fused_embedding_lookup(svars, local_ids, "sum")
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        return tape.gradient(loss, svars)

    h0 = tf.random.normal([int(x_dense.shape[0]), SLOTS * dim])
    dvars = [w for l in layers + [dense_linear] for w in l.trainable_variables]

    @tf.function
    def dense_only():
        with tf.GradientTape() as tape:
            h = tf.concat([h0, x_dense], 1)
            for l in layers:
                h = l(h)
            loss = tf.reduce_sum(h + dense_linear(x_dense))
        return tape.gradient(loss, dvars)

    grads = with_exchange()

    @tf.function
    def update():
        emb_opt.apply_gradients(zip(grads, svars))
        return tf.constant(0)

    def med(fn):
        fn()
        ts = []
        for _ in range(reps):
            t0 = time.perf_counter()
            tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn())
            ts.append(time.perf_counter() - t0)
        return 1e3 * float(np.median(ts))

    t_x, t_l, t_d, t_u = med(with_exchange), med(local_only), med(dense_only), med(update)
    return {"lookup": t_l, "exchange": max(0.0, t_x - t_l), "dense": t_d, "update": t_u}


def main():
    ap = argparse.ArgumentParser(description="DeepFM with embedlab.sok on 1 or N workers")
    ap.add_argument("--data", required=True, help="Criteo TSV file (embedlab.data.criteo.generate)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=8)
    ap.add_argument("--out", help="JSON written by rank 0")
    ap.add_argument("--dump", help="dump the first two tables (and optimizer state) here")
    ap.add_argument("--profile", action="store_true", help="also time the parts of a step")
    a = ap.parse_args()
    res = train(a.data, a.steps, a.global_batch, a.vocab, a.dim, out=a.out, dump_dir=a.dump, profile=a.profile)
    from . import rank
    if rank() == 0:
        print(f"{res['workers']} worker(s): final loss {res['losses'][-1]:.4f}, step {res['step_ms']:.1f} ms")


if __name__ == "__main__":
    main()
