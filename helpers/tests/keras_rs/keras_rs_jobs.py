"""Worker program of the multi-worker test of `DistributedEmbedding(sharding="row")`.

Run by the launcher: `python -m embedlab.sok.launch -n N keras_rs_jobs.py <outdir> <seed>`.
Every worker draws the same global data from the seed and takes its own slice of each global
batch (GLOBAL_BATCH rows, whatever N is), so 1 and 2 workers train on the same data. A small
Keras-RS model (three features, one table shared by two of them; Adagrad, FTRL and SGD fused
into the backward; a Dense head trained by the model's optimizer) runs STEPS steps under the
launcher's `MultiWorkerMirroredStrategy`. Rank 0 writes losses, gathered tables and the head to
<outdir>/keras_rs_w<N>.npz; with one worker, also those of the same model with unsharded tables
(sharding=None, no strategy) as `plain/...`.
"""
from __future__ import annotations

import os
import sys

import numpy as np

GLOBAL_BATCH = 8
STEPS = 3
LR = 0.1
# (table, rows, dim, combiner, optimizer); features: name -> table
TABLES = [("t_ab", 29, 4, "sum", "adagrad"), ("t_c", 17, 3, "mean", "ftrl"), ("t_d", 11, 2, "sqrtn", "sgd")]
FEATURES = {"a": "t_ab", "b": "t_ab", "c": "t_c", "d": "t_d"}


def data(seed):
    """Initial tables, head kernel, and STEPS global batches {feature: (lengths, keys)}, labels."""
    rng = np.random.default_rng(seed)
    init = {name: rng.normal(size=(rows, dim)).astype(np.float32) for name, rows, dim, _, _ in TABLES}
    width = sum(dim for name, _, dim, _, _ in TABLES for f in FEATURES if FEATURES[f] == name)
    kernel = (rng.normal(size=(width, 1)) * 0.5).astype(np.float32)
    rows = {name: r for name, r, _, _, _ in TABLES}
    batches = []
    for _ in range(STEPS):
        feats = {}
        for f, t in FEATURES.items():
            lens = rng.integers(0, 4, GLOBAL_BATCH)
            lens[rng.integers(0, GLOBAL_BATCH)] = 0                    # an empty row
            keys = rng.integers(0, rows[t], int(lens.sum()))
            if keys.size > 2:
                keys[1] = keys[0]                                       # a duplicate
            feats[f] = (lens, keys.astype(np.int64))
        labels = rng.normal(size=(GLOBAL_BATCH, 1)).astype(np.float32)
        batches.append((feats, labels))
    return init, kernel, batches


def model_parts(keras, keras_rs, DistributedEmbedding, init, kernel, sharding):
    tables = {name: keras_rs.layers.TableConfig(name, rows, dim, initializer=keras.initializers.Constant(init[name]),
                                                optimizer=keras.optimizers.get({"class_name": opt,
                                                                                "config": {"learning_rate": LR}}),
                                                combiner=comb)
              for name, rows, dim, comb, opt in TABLES}
    fcs = {f: keras_rs.layers.FeatureConfig(f, tables[t], (None, None), (None, tables[t].embedding_dim))
           for f, t in FEATURES.items()}
    emb = DistributedEmbedding(fcs, sharding=sharding)
    head = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(kernel))
    head.build((None, kernel.shape[0]))
    return emb, head


def train(tf, keras, emb, head, batches, rank, world, strategy=None):
    """STEPS steps; returns the losses (global mean squared error of each step)."""
    local = GLOBAL_BATCH // world
    with (strategy.scope() if strategy else _null()):
        dense_opt = keras.optimizers.SGD(learning_rate=LR)
    emb.build({f: (local, None) for f in FEATURES})

    def replica_step(inputs, labels):
        with tf.GradientTape() as tape:
            out = emb(inputs)
            pred = head(tf.concat([out[f] for f in FEATURES], 1))
            loss = tf.reduce_sum(tf.square(pred - labels)) / GLOBAL_BATCH
        variables = emb.trainable_variables + head.trainable_variables
        dense_opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function(reduce_retracing=True)
    def step(inputs, labels):
        if strategy is None:
            return replica_step(inputs, labels)
        per = strategy.run(replica_step, args=(inputs, labels))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per, axis=None)

    losses = []
    for feats, labels in batches:
        inputs = {}
        for f, (lens, keys) in feats.items():
            splits = np.concatenate([[0], np.cumsum(lens)])
            lo, hi = rank * local, (rank + 1) * local
            inputs[f] = tf.RaggedTensor.from_row_lengths(tf.constant(keys[splits[lo]:splits[hi]]),
                                                         tf.constant(lens[lo:hi], tf.int64))
        losses.append(float(step(inputs, tf.constant(labels[rank * local:(rank + 1) * local]))))
    return np.array(losses)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main():
    outdir, seed = sys.argv[1], int(sys.argv[2])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras
    import keras_rs
    import tensorflow as tf

    import embedlab.sok as sok
    from embedlab.keras_rs import DistributedEmbedding

    ctx = sok.init()
    world, rank = ctx.world_size, ctx.rank
    init, kernel, batches = data(seed)
    with ctx.strategy.scope():
        emb, head = model_parts(keras, keras_rs, DistributedEmbedding, init, kernel, "row")
    out = {"losses": train(tf, keras, emb, head, batches, rank, world, ctx.strategy)}
    for name, table in emb.get_embedding_tables().items():     # a collective: every rank gathers
        out[f"table/{name}"] = np.asarray(table)
    out["head"] = head.kernel.numpy()
    out["shard_rows"] = np.array([int(v.shape[0]) for v in emb.shards.values()])
    if world == 1:
        emb, head = model_parts(keras, keras_rs, DistributedEmbedding, init, kernel, None)
        out["plain/losses"] = train(tf, keras, emb, head, batches, 0, 1)
        for name, table in emb.get_embedding_tables().items():
            out[f"plain/table/{name}"] = keras.ops.convert_to_numpy(table)
        out["plain/head"] = head.kernel.numpy()
    if rank == 0:
        np.savez(os.path.join(outdir, f"keras_rs_w{world}.npz"), **out)
    print(f"rank {rank}: keras_rs job finished", flush=True)


if __name__ == "__main__":
    main()
