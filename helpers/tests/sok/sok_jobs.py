"""Worker programs of the multi-process tests, and the data they share with the oracle.

Run by the launcher: `python -m embedlab.sok.launch -n N sok_jobs.py <job> <outdir> [seed]`.
Every worker draws the same global data from the seed and takes its own slice of each batch,
so the single-process TensorFlow reference in the tests sees exactly the same global batch.
Results (losses, gathered tables, messages) are written by rank 0 to <outdir>/<job>.npz.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

# Cases trained by the "train" job: (name, tables, combiners, weighted, optimizer).
# tables: (rows, dim, mode) with mode "distributed" or "localized:<rank % world>".
CASES = [
    ("dist_sum_sgd", [(37, 4, "distributed"), (11, 4, "distributed"), (23, 3, "distributed")], ["sum", "sum", "mean"],
     False, "sgd"),
    ("mixed_mean_weighted_adagrad", [(29, 4, "distributed"), (13, 4, "localized:1"), (7, 4, "localized:0")],
     ["mean", "sum", "mean"], True, "adagrad"),
    # rows None: a DynamicVariable (initializer "0.5", init_capacity 4) over keys from a wide int64 space
    ("dynamic_sgd", [(None, 4, "distributed"), (None, 4, "localized:1")], ["sum", "mean"], False, "sgd"),
    ("dist_mean_embedlab_adam", [(41, 8, "distributed"), (19, 8, "distributed")], ["mean", "sum"], False,
     "embedlab_adam"),
]
DYNAMIC_INIT = 0.5
STEPS = 4
LOCAL_BATCH = 6
LR = 0.1


def localized(mode, world):
    if mode.startswith("localized:"):
        return f"localized:{int(mode.split(':')[1]) % world}"
    return mode


def case_data(case, world, seed):
    """Initial tables, dense kernel, and STEPS global batches (keys, weights, row lengths, labels)."""
    name, tables, combiners, weighted, opt = case
    rng = np.random.default_rng(seed + sum(map(ord, name)))
    universe = rng.integers(-2**62, 2**62, size=40)
    init = [rng.normal(size=(r, d)).astype(np.float32) if r else None for r, d, _ in tables]
    kernel = rng.normal(size=(sum(d for _, d, _ in tables), 1)).astype(np.float32) * 0.5
    gb = LOCAL_BATCH * world
    batches = []
    for _ in range(STEPS):
        per_table = []
        for r, d, _ in tables:
            lens = rng.integers(0, 4, size=gb)           # empty rows included
            lens[rng.integers(0, gb)] = 0
            keys = rng.integers(0, r, size=int(lens.sum())) if r else rng.choice(universe, size=int(lens.sum()))
            if keys.size > 2:                             # duplicates in a row
                keys[1] = keys[0]
            w = rng.uniform(0.5, 2.0, size=keys.size).astype(np.float32) if weighted else None
            per_table.append((lens, keys.astype(np.int64), w))
        labels = rng.normal(size=(gb, 1)).astype(np.float32)
        batches.append((per_table, labels))
    return init, kernel, batches


def local_slice(lens, keys, w, rank, world):
    """Rows rank*B .. (rank+1)*B of a global batch in CSR form."""
    splits = np.concatenate([[0], np.cumsum(lens)])
    lo, hi = rank * LOCAL_BATCH, (rank + 1) * LOCAL_BATCH
    k = keys[splits[lo]:splits[hi]]
    ww = None if w is None else w[splits[lo]:splits[hi]]
    return lens[lo:hi], k, ww


def _ragged(tf, lens, vals):
    return tf.RaggedTensor.from_row_lengths(tf.constant(vals), tf.constant(lens, tf.int64))


def _sparse(tf, lens, vals, max_nnz=4):
    rows = np.repeat(np.arange(len(lens)), lens)
    cols = np.concatenate([np.arange(l) for l in lens]) if len(lens) else np.zeros(0, np.int64)
    idx = np.stack([rows, cols], 1).astype(np.int64).reshape(-1, 2)
    return tf.SparseTensor(idx, tf.constant(vals), [len(lens), max_nnz])


def run_case(tf, keras, sok, case, world, rank, seed, use_sparse):
    name, tables, combiners, weighted, opt_name = case
    strategy = sok.context().strategy
    init, kernel, batches = case_data(case, world, seed)
    vars_ = [sok.Variable(init[t], mode=localized(m, world), name=f"{name}_t{t}") if r else
             sok.DynamicVariable(d, initializer=str(DYNAMIC_INIT), mode=localized(m, world), init_capacity=4,
                                 name=f"{name}_t{t}")
             for t, (r, d, m) in enumerate(tables)]
    with strategy.scope():
        dense = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(kernel))
        dense.build((None, kernel.shape[0]))
        dense_opt = keras.optimizers.SGD(learning_rate=LR)
    if opt_name == "sgd":
        emb_opt = sok.OptimizerWrapper(keras.optimizers.SGD(learning_rate=LR))
    elif opt_name == "adagrad":
        emb_opt = sok.OptimizerWrapper(keras.optimizers.Adagrad(learning_rate=LR))
    else:
        import embedlab.optimizers as eo
        emb_opt = sok.OptimizerWrapper(eo.Adam(learning_rate=LR))
    gb = LOCAL_BATCH * world

    def replica_step(ids, ws, labels):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(vars_, ids, ws, combiners=combiners)
            pred = dense(tf.concat(embs, 1))
            loss = tf.reduce_sum(tf.square(pred - labels)) / gb
        grads = tape.gradient(loss, vars_ + dense.trainable_variables)
        emb_opt.apply_gradients(zip(grads[:len(vars_)], vars_))
        dense_opt.apply_gradients(zip(grads[len(vars_):], dense.trainable_variables))
        return loss

    @tf.function(reduce_retracing=True)
    def step(ids, ws, labels):
        per = strategy.run(replica_step, args=(ids, ws, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    losses = []
    for per_table, labels in batches:
        ids, ws = [], []
        for lens, keys, w in per_table:
            l, k, ww = local_slice(lens, keys, w, rank, world)
            ids.append(_sparse(tf, l, k) if use_sparse else _ragged(tf, l, k))
            if weighted:
                ws.append(_sparse(tf, l, ww) if use_sparse else _ragged(tf, l, ww))
        lab = labels[rank * LOCAL_BATCH:(rank + 1) * LOCAL_BATCH]
        losses.append(float(step(ids, ws if weighted else None, tf.constant(lab))))
    out = {f"{name}/losses": np.array(losses)}
    for t, v in enumerate(vars_):
        keys, rows = sok.gather(v)
        out[f"{name}/table{t}"] = rows
        out[f"{name}/keys{t}"] = keys
    out[f"{name}/kernel"] = dense.kernel.numpy()
    return out, vars_, emb_opt


def guide_example(tf, sok, world):
    """SOK's getting-started example: embeddings and per-rank gradient shapes."""
    v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32, name="guide_v1")
    v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32, name="guide_v2")
    i1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]], values=tf.constant([1, 1, 3, 4, 5], tf.int64),
                         dense_shape=[2, 3])
    i2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=tf.constant([1, 2, 3], tf.int64), dense_shape=[2, 2])
    with tf.GradientTape() as tape:
        embs = sok.lookup_sparse([v1, v2], [i1, i2], combiners=["sum", "sum"])
        loss = tf.add_n([tf.reduce_sum(e) for e in embs])
    grads = tape.gradient(loss, [v1, v2])
    shapes = np.array([g.values.shape.as_list() for g in grads], np.int64)
    all_shapes = sok.exchange.all_gather(tf.constant(shapes)).numpy()
    return {"guide/emb1": embs[0].numpy(), "guide/emb2": embs[1].numpy(), "guide/shard_rows":
            np.array([v1.shape[0], v2.shape[0]]), "guide/grad_shapes": all_shapes}


def main():
    job, outdir = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    import keras
    import embedlab.sok as sok
    import embedlab.sok.exchange  # noqa: F401

    ctx = sok.init()
    world, rank = ctx.world_size, ctx.rank
    out = {}
    if job == "train":
        out.update(guide_example(tf, sok, world))
        last = None
        for i, case in enumerate(CASES):
            res, vars_, opt = run_case(tf, keras, sok, case, world, rank, seed, use_sparse=(i % 2 == 0))
            out.update(res)
            last = (case, vars_, opt)
        dump_dir = os.path.join(outdir, f"dump_w{world}")
        case, vars_, opt = last
        sok.dump(dump_dir, vars_, opt)
        for v in vars_:
            for sname, svar in sorted(opt.slots(v).items()):
                out[f"slots/{v.table_name}/{sname}"] = sok.gather(v, svar)[1]
        # a key beyond a table's rows on one rank only: every rank must fail, naming table and key
        v = vars_[0]
        bad = 10_000 + v.global_shape[0]
        ids = tf.ragged.constant([[0, bad if rank == world - 1 else 1]], dtype=tf.int64)
        try:
            sok.lookup_sparse([v], [ids], combiners=["sum"])
            out["bad_key/message"] = np.array("no error")
        except tf.errors.InvalidArgumentError as e:
            out["bad_key/message"] = np.array(str(e.message))
        msg = out["bad_key/message"].item()
        named = int(f"table {v.table_name} " in msg and f"key {bad} " in msg and f"rank {world - 1}" in msg)
        out["bad_key/all_failed"] = sok.exchange.all_gather(tf.constant([named], tf.int64)).numpy()[:, 0]
    elif job == "load":
        src = sys.argv[4]
        case = CASES[-1]
        name, tables, combiners, weighted, opt_name = case
        init, kernel, _ = case_data(case, world, seed)
        vars_ = [sok.Variable(np.zeros_like(init[t]), mode=localized(m, world), name=f"{name}_t{t}")
                 for t, (_, _, m) in enumerate(tables)]
        import embedlab.optimizers as eo
        opt = sok.OptimizerWrapper(eo.Adam(learning_rate=LR))
        sok.load(src, vars_, opt)
        for t, v in enumerate(vars_):
            out[f"load/table{t}"] = sok.gather(v)[1]
            out[f"load/shard_rows{t}"] = np.array(v.shape[0])
            for sname, svar in sorted(opt.slots(v).items()):
                out[f"slots/{v.table_name}/{sname}"] = sok.gather(v, svar)[1]
        # a dump whose shapes differ: a clear error, nothing changed
        wrong = sok.Variable(np.zeros((init[0].shape[0] + 1, init[0].shape[1]), np.float32), name=f"{name}_t0")
        try:
            sok.load(src, [wrong])
            out["load/shape_error"] = np.array("no error")
        except ValueError as e:
            out["load/shape_error"] = np.array(str(e))
        out["load/wrong_untouched"] = np.array(float(np.abs(sok.gather(wrong)[1]).sum()))
    elif job == "kill":
        v = sok.Variable(np.ones((10, 2), np.float32), name="k")
        for step in range(100):
            if step == 3 and rank == world - 1:
                if os.environ.get("SOK_FAULT") == "hang":
                    import time
                    time.sleep(3600)
                os.kill(os.getpid(), 9)
            sok.lookup_sparse([v], [tf.ragged.constant([[1, 2]], dtype=tf.int64)], combiners=["sum"])
            print(f"step {step} done", flush=True)
    else:
        raise SystemExit(f"unknown job {job}")
    if rank == 0 and out:
        np.savez(os.path.join(outdir, f"{job}_w{world}.npz"), **out)
    print(f"rank {rank}: job {job} finished", flush=True)


if __name__ == "__main__":
    main()
