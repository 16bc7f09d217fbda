"""A Criteo DeepFM trained with `sok.lookup_sparse`, on 1 or N workers (notebook 04's model).

    python -m embedlab.sok.launch -n 2 -m embedlab.tutorials.sok_demo ... (see notebook 04), or directly:
    python -m embedlab.tutorials.sok_demo --data rows.tsv --steps 40 --global-batch 512 --out run.json

26 categorical slots, each its own `sok.Variable` of `vocab` rows (key = hashed category mod
vocab), plus 13 dense features. DeepFM: a first-order term (a dim-1 table per slot and a linear
layer over the dense features), the factorization-machine interaction of the slots' vectors,
and an MLP over the vectors and dense features. Tables are initialised from one seed as whole
tables and sharded, and every worker trains on its slice of the same global batch, so 1 and N
workers follow the same loss curve; one worker with `splits=2` and two workers perform the same
float operations in the same order and train to the same bits (`train`, `assert_same_training`).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

SLOTS, DENSE = 26, 13
PROBE_FLOATS = 1 << 20      # the large link probe: 4 MiB per peer


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
    from ..sok import OptimizerWrapper, Variable, context
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


def _ids(tf, keys):
    """keys [b, 26] int64 -> one ragged [b, 1] id tensor per slot (built inside the step's graph:
    26 eager RaggedTensor constructions per step cost more than the step's dense part)."""
    splits = tf.range(tf.shape(keys, out_type=tf.int64)[0] + 1)
    return [tf.RaggedTensor.from_row_splits(keys[:, s], splits, validate=False) for s in range(SLOTS)]


def train(data, steps, global_batch, vocab=10_000, dim=8, seed=0, out=None, dump_dir=None, profile=False,
          splits=1, table_out=None):
    """Trains DeepFM; returns (and, on rank 0, writes to `out` as JSON) the per-step global losses
    and, with `profile`, a step-time breakdown (ms).

    Args:
        data: a Criteo TSV path, or the (cats, dense, labels) arrays of `load_criteo`.
        steps, global_batch: optimizer steps and the global batch (split evenly over workers).
        splits: the dense part of a step (FM, MLP, loss and their gradients) runs on this many
            equal slices of this worker's batch, and their gradients are added. One worker with
            `splits=2` adds the same two partial gradients, in the same order, that the
            all-reduce of a 2-worker job adds (a + b: two terms have one sum), and the lookups'
            gradients add every row's contributions in batch order either way; so it trains to
            the same bits as 2 workers (see `assert_same_training`). Past 2 workers the
            all-reduce adds in an order of its own, and the runs agree only up to rounding.
        out: JSON written by rank 0 (losses, step time, breakdown).
        dump_dir: `sok.dump` of the first two tables and their Adagrad state here, after training.
        table_out: rank 0 saves the whole first table after training here (`.npy`).

    Returns:
        {"workers", "global_batch", "steps", "splits", "losses", "step_ms" (median of the steps
        after the first two), "input_ms" (making a batch's tensors, outside the step)[,
        "breakdown_ms"], "table0", "table0_slots"}: table0 is the whole first table after
        training and table0_slots its Adagrad state ({slot name: array}), on every worker.
    """
    from .._tfstart import import_tensorflow
    tf = import_tensorflow()
    from ..sok import dump, exchange, gather, init, lookup_sparse
    from .. import ops

    ctx = init()
    n, rank = ctx.world_size, ctx.rank
    if global_batch % n:
        raise ValueError(f"embedlab.tutorials.sok_demo.train: global batch {global_batch} is not divisible by {n} workers")
    local = global_batch // n
    if splits < 1 or local % splits:
        raise ValueError(f"embedlab.tutorials.sok_demo.train: splits={splits} must be >= 1 and divide the local batch {local}")
    cats, dense, labels = data if isinstance(data, tuple) else load_criteo(data)
    if len(cats) < global_batch:
        raise ValueError(f"embedlab.tutorials.sok_demo.train: {len(cats)} rows are fewer than one global batch ({global_batch})")
    tables, linear, layers, dense_linear, dense_opt, emb_opt = build(vocab, dim, seed)
    sparse_vars = tables + linear
    dvars = [w for l in layers + [dense_linear] for w in l.trainable_variables]
    strategy = ctx.strategy

    def head_loss(embs, firsts, x_dense, y):
        """The dense part on this worker's batch, slice by slice: sum of the slices' losses
        (each already divided by the global batch)."""
        def cut(t):
            return tf.split(t, splits, axis=0) if splits > 1 else [t]
        e_s = list(zip(*[cut(e) for e in embs]))           # [slice][table]
        f_s = list(zip(*[cut(f) for f in firsts]))
        losses = []
        for e, f, x, yy in zip(e_s, f_s, cut(x_dense), cut(y)):
            v = tf.stack(e, 1)                                              # [b, 26, dim]
            fm = 0.5 * tf.reduce_sum(tf.square(tf.reduce_sum(v, 1)) - tf.reduce_sum(tf.square(v), 1), 1, keepdims=True)
            h = tf.concat([tf.reshape(v, [-1, SLOTS * dim]), x], 1)
            for l in layers:
                h = l(h)
            # The logit is one sum of 29 terms (MLP, FM, dense linear, 26 first-order weights) in
            # one reduction: a chain of `+` lets Grappler's arithmetic optimizer pick the order
            # of the additions per graph, and the 1- and 2-worker graphs got different orders.
            terms = tf.concat([h, fm, dense_linear(x)] + list(f), 1)       # [b, 29]
            logits = tf.reduce_sum(terms, 1, keepdims=True)
            ce = tf.nn.sigmoid_cross_entropy_with_logits(labels=yy, logits=logits)
            # scaled before the sum, not after: Grappler rewrites a/g + b/g into (a + b)/g
            losses.append(tf.reduce_sum(ce * (1.0 / global_batch)))
        return losses[0] if splits == 1 else tf.add_n(losses)

    @tf.autograph.experimental.do_not_convert      # plain Python loops only; no AutoGraph needed
    def replica_step(keys, x_dense, y):
        ids = _ids(tf, keys)
        with tf.GradientTape() as tape:
            embs = lookup_sparse(tables, ids, combiners="sum")
            firsts = lookup_sparse(linear, ids, combiners="sum")
            loss = head_loss(embs, firsts, x_dense, y)
        grads = tape.gradient(loss, sparse_vars + dvars)
        emb_opt.apply_gradients(zip(grads[:len(sparse_vars)], sparse_vars))
        dense_opt.apply_gradients(zip(grads[len(sparse_vars):], dvars))
        return loss

    @tf.function
    def step(keys, x_dense, y):
        per = strategy.run(replica_step, args=(keys, x_dense, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    def batch(i):
        lo = (i * global_batch) % (len(cats) - global_batch + 1) + rank * local
        return (tf.constant(cats[lo:lo + local] % vocab), tf.constant(dense[lo:lo + local]),
                tf.constant(labels[lo:lo + local]))

    losses, times, input_times = [], [], []
    for i in range(steps):
        t0 = time.perf_counter()
        b = batch(i)
        t1 = time.perf_counter()
        losses.append(float(step(*b)))
        times.append(time.perf_counter() - t1)
        input_times.append(t1 - t0)
    skip = 2 if steps > 4 else 0       # the first steps trace and warm up
    res = {"workers": n, "global_batch": global_batch, "steps": steps, "splits": splits, "losses": losses,
           "step_ms": 1e3 * float(np.median(times[skip:])), "input_ms": 1e3 * float(np.median(input_times[skip:])),
           "step_samples_ms": [1e3 * t for t in times[skip:]]}
    # the whole first table and its Adagrad state after training (collectives), for comparisons
    table0 = gather(tables[0])[1]
    slots0 = {name: gather(tables[0], var)[1] for name, var in sorted(emb_opt.slots(tables[0]).items())}
    if dump_dir:   # before profiling, whose update steps move the tables
        dump(dump_dir, tables[:2], emb_opt)
    if profile:
        parts = dict(lookup_sparse=lookup_sparse, fused_lookup=ops.fused_embedding_lookup, svars=sparse_vars,
                     tables=tables, linear=linear, dvars=dvars, head_loss=head_loss, emb_opt=emb_opt,
                     dense_opt=dense_opt, strategy=strategy, step=step, n=n, exchange=exchange)
        res["breakdown_ms"], res["breakdown_samples_ms"] = _breakdown(tf, [batch(i) for i in range(16)], **parts)
        res["probe_bytes"] = {"small": 4, "big": 4 * PROBE_FLOATS}
    if rank == 0 and out:
        Path(out).write_text(json.dumps(res))
    if rank == 0 and table_out:
        np.save(table_out, table0)
    res["table0"], res["table0_slots"] = table0, slots0
    return res


def assert_same_training(a, b, names=("1 worker", "2 workers")):
    """Asserts that two runs of `train` are the same to the bit: every step's loss and every
    element of the first table after training. Raises AssertionError naming the first step,
    or the row and column, that differ and by how much."""
    la, lb = np.asarray(a["losses"], np.float64), np.asarray(b["losses"], np.float64)
    if la.shape != lb.shape:
        raise AssertionError(f"{names[0]} has {la.size} losses, {names[1]} {lb.size}")
    bad = np.flatnonzero(la != lb)
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"losses differ at {bad.size} of {la.size} steps, first at step {i}: "
                             f"{names[0]} {la[i]!r}, {names[1]} {lb[i]!r}")
    ta, tb = np.asarray(a["table0"]), np.asarray(b["table0"])
    if ta.shape != tb.shape:
        raise AssertionError(f"first table: {names[0]} {ta.shape}, {names[1]} {tb.shape}")
    bad = np.argwhere(ta != tb)
    if bad.size:
        r, c = (int(x) for x in bad[0])
        raise AssertionError(f"first table differs in {len(bad)} of {ta.size} elements, first at row {r} column {c}: "
                             f"{names[0]} {ta[r, c]!r}, {names[1]} {tb[r, c]!r}")


def _breakdown(tf, batches, *, lookup_sparse, fused_lookup, svars, tables, linear, dvars, head_loss, emb_opt,
               dense_opt, strategy, step, n, exchange):
    """Times the parts of a step on their own and the whole step the same way (ms, medians over
    `batches` after a warm-up on the first; every part and the step run once per batch, in turn):

    lookup            the lookups' local kernels, forward and backward, on this worker's shards
                      (no communication);
    exchange          the same lookups with the collectives (counts all-gather, keys out, rows
                      back, gradients back), minus `lookup`;
    dense             FM, MLP and loss, forward and backward (to the dense variables and to the
                      looked-up vectors);
    embedding update  the Adagrad updates of the shards;
    dense update      the all-reduce of the dense gradients and Keras Adam;
    step overhead     a step that only returns its loss: the tf.function call, `strategy.run`
                      and the loss's all-reduce;
    step              the whole training step;
    probe small/big   all-to-alls of 1 and of PROBE_FLOATS float32 per peer (the link alone).

    Returns (medians {part: ms}, every timing {name: [ms per batch]}).
    """
    def sparse_grads(lookup):
        with tf.GradientTape() as tape:
            embs = lookup()
            loss = tf.add_n([tf.reduce_sum(e) for e in embs])
        return tape.gradient(loss, svars)

    @tf.function
    def with_exchange(keys):
        ids = _ids(tf, keys)
        return sparse_grads(lambda: lookup_sparse(tables, ids, combiners="sum") +
                            lookup_sparse(linear, ids, combiners="sum"))

    @tf.function
    def local_only(keys):
        local_ids = [tf.RaggedTensor.from_row_splits(x.values // n, x.row_splits, validate=False)
                     for x in _ids(tf, keys)]
        return sparse_grads(lambda: fused_lookup(svars, local_ids + local_ids, "sum"))

    @tf.function
    def dense_only(embs, firsts, x_dense, y):
        with tf.GradientTape() as tape:
            tape.watch(embs + firsts)
            loss = head_loss(embs, firsts, x_dense, y)
        return tape.gradient(loss, dvars + embs + firsts)

    def embedding_update(rows, values):
        grads = [tf.IndexedSlices(v, r, tf.shape(p, out_type=r.dtype)) for r, v, p in zip(rows, values, svars)]
        emb_opt.apply_gradients(zip(grads, svars))
        return tf.constant(0)

    @tf.function
    def dense_update(grads):
        def apply(g):    # identities inside the replica's device scope: the all-reduce needs placed inputs
            dense_opt.apply_gradients(zip([tf.identity(x) for x in g], dvars))
        strategy.run(apply, args=(list(grads),))
        return tf.constant(0)

    @tf.function
    def overhead(y):
        per = strategy.run(lambda: tf.reduce_sum(y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    # Two all-to-alls of 1 float and of PROBE_FLOATS floats per peer: the link's fixed cost per
    # call and its cost per byte, for notebook 04's cost model (`embedlab.tutorials.sok_cost`).
    small, big = tf.zeros([n, 1]), tf.zeros([n, PROBE_FLOATS])
    probe_small = tf.function(lambda: exchange.all_to_all(small))
    probe_big = tf.function(lambda: exchange.all_to_all(big))

    # inputs of every part, computed before any timing
    inputs = []
    for keys, x_dense, y in batches:
        ids = _ids(tf, keys)
        embs = [tf.constant(e) for e in lookup_sparse(tables, ids, combiners="sum")]
        firsts = [tf.constant(f) for f in lookup_sparse(linear, ids, combiners="sum")]
        sgrads = with_exchange(keys)
        dgrads = dense_only(embs, firsts, x_dense, y)[:len(dvars)]
        inputs.append(dict(keys=keys, x=x_dense, y=y, embs=embs, firsts=firsts, dgrads=dgrads,
                           rows=[g.indices for g in sgrads], values=[g.values for g in sgrads]))

    # the gradients' row counts differ from batch to batch: one trace for all of them
    g0 = inputs[0]
    embedding_update = tf.function(embedding_update, input_signature=(
        [tf.TensorSpec([None], r.dtype) for r in g0["rows"]],
        [tf.TensorSpec([None, int(v.shape[1])], v.dtype) for v in g0["values"]]))

    def once(fn, args):
        t0 = time.perf_counter()
        tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, fn(*args))
        return time.perf_counter() - t0

    timed = {  # name: (function, its arguments from one batch's inputs)
        "with exchange": (with_exchange, lambda a: (a["keys"],)),
        "lookup": (local_only, lambda a: (a["keys"],)),
        "dense": (dense_only, lambda a: (a["embs"], a["firsts"], a["x"], a["y"])),
        "embedding update": (embedding_update, lambda a: (a["rows"], a["values"])),
        "dense update": (dense_update, lambda a: (a["dgrads"],)),
        "step overhead": (overhead, lambda a: (a["y"],)),
        "step": (step, lambda a: (a["keys"], a["x"], a["y"])),
        "probe small": (probe_small, lambda a: ()),
        "probe big": (probe_big, lambda a: ()),
    }
    for fn, args in timed.values():     # traces and warms up
        once(fn, args(inputs[0]))
    # Interleaved, batch after batch, so that a slow spell of the machine hits every part alike.
    ts = {name: [] for name in timed}
    for a in inputs[1:]:
        for name, (fn, args) in timed.items():
            ts[name].append(once(fn, args(a)))
    samples = {name: [1e3 * x for x in t] for name, t in ts.items()}
    # the exchange of each batch: the lookups with collectives minus the same batch's local kernels
    samples["exchange"] = [max(0.0, a - b) for a, b in zip(samples["with exchange"], samples["lookup"])]
    ms = {name: float(np.median(t)) for name, t in samples.items()}
    res = {"lookup": ms["lookup"], "exchange": max(0.0, ms["with exchange"] - ms["lookup"])}
    res.update((k, ms[k]) for k in ("dense", "embedding update", "dense update", "step overhead", "step"))
    return res, samples


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
    ap.add_argument("--splits", type=int, default=1, help="slices of the local batch for the dense part (see train)")
    ap.add_argument("--table-out", help="rank 0 saves the whole first table after training here (.npy)")
    a = ap.parse_args()
    res = train(a.data, a.steps, a.global_batch, a.vocab, a.dim, out=a.out, dump_dir=a.dump, profile=a.profile,
                splits=a.splits, table_out=a.table_out)
    from ..sok import rank
    if rank() == 0:
        print(f"{res['workers']} worker(s): final loss {res['losses'][-1]:.4f}, step {res['step_ms']:.1f} ms")


if __name__ == "__main__":
    main()
