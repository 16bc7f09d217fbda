"""Worker program of test_sok_v1_module_paths.py: SOK's TFDistributedEmbedding in a real job.

    python -m embedlab.sok.launch -n 2 tfde_job.py <outdir> <seed>

Every worker builds the same initial table from the seed under a MultiWorkerMirroredStrategy
(HugeCTR's way: the strategy from TF_CONFIG), looks up its own keys, takes one step of a plain
Keras SGD (the strategy all-reduces the gradients), then worker 1 changes its own copy and
`broadcast_variables()` restores worker 0's. Each rank writes <outdir>/tfde_rank<r>.npz.
"""
from __future__ import annotations

import os
import sys

import numpy as np

VOCAB, DIM, LR = 11, 3, 0.5


def data(seed, rank):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    keys = [rng.integers(0, VOCAB, size=(2, 3)).astype(np.int64) for _ in range(2)]   # one [2, 3] batch per rank
    for k in keys:
        k[1, 2] = k[0, 0]                      # a duplicate key in every batch
    return table, keys[rank]


def main(outdir, seed):
    import embedlab
    tf = embedlab.import_tensorflow()
    import keras
    from embedlab.sok.compat.embeddings.tf_distributed_embedding import TFDistributedEmbedding

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = strategy.cluster_resolver.task_id
    table, keys = data(seed, rank)
    with strategy.scope():
        layer = TFDistributedEmbedding(vocabulary_size=VOCAB, embedding_vec_size=DIM, initializer=table)
        opt = keras.optimizers.SGD(learning_rate=LR)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            out = layer(inputs=ids, training=True)        # as HugeCTR's TfDenseDemo calls it
            loss = tf.reduce_sum(out * out)
        grads = tape.gradient(loss, [layer.embedding_weights])
        opt.apply_gradients(zip(grads, [layer.embedding_weights]))
        return out

    out = strategy.run(step, args=(tf.constant(keys),))
    trained = np.array(layer.embedding_weights.numpy())
    local = layer.embedding_weights.value.values[0]     # this worker's own copy
    if rank == 1:
        local.assign(tf.fill([VOCAB, DIM], 7.0))
    changed = np.array(local.numpy())
    strategy.run(tf.function(layer.broadcast_variables))
    np.savez(os.path.join(outdir, f"tfde_rank{rank}.npz"), keys=keys, out=np.asarray(out), trained=trained,
             changed=changed, after=np.array(layer.embedding_weights.value.values[0].numpy()))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
