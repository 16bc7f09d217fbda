"""SOK's getting-started guide as a module: its `DemoModel` (first-generation API), a learnable
toy task to train it on, and the new API's example. Notebook 04 shows and trains them, in one
process and in the worker script of its 2-worker job."""
from __future__ import annotations

import numpy as np

from .._tfstart import import_tensorflow

tf = import_tensorflow()

import embedlab.sok as sok  # noqa: E402  (after TensorFlow; the guide's `import sparse_operation_kit as sok`)


class DemoModel(tf.keras.models.Model):
    """SOK's getting-started DemoModel, unchanged apart from the import."""

    def __init__(self, max_vocabulary_size_per_gpu, slot_num, nnz_per_slot, embedding_vector_size,
                 num_of_dense_layers, **kwargs):
        super(DemoModel, self).__init__(**kwargs)
        self.max_vocabulary_size_per_gpu = max_vocabulary_size_per_gpu
        self.slot_num = slot_num              # the number of feature-fields per sample
        self.nnz_per_slot = nnz_per_slot      # the number of valid keys per feature-field
        self.embedding_vector_size = embedding_vector_size
        self.num_of_dense_layers = num_of_dense_layers

        # this embedding layer will concatenate each key's embedding vector
        self.embedding_layer = sok.All2AllDenseEmbedding(
            max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
            embedding_vec_size=self.embedding_vector_size,
            slot_num=self.slot_num,
            nnz_per_slot=self.nnz_per_slot)

        self.dense_layers = list()
        for _ in range(self.num_of_dense_layers):
            self.layer = tf.keras.layers.Dense(units=1024, activation="relu")
            self.dense_layers.append(self.layer)

        self.out_layer = tf.keras.layers.Dense(units=1, activation=None)

    def call(self, inputs, training=True):
        # its shape is [batchsize, slot_num, nnz_per_slot, embedding_vector_size]
        emb_vector = self.embedding_layer(inputs, training=training)

        # reshape this tensor, so that it can be processed by Dense layer
        emb_vector = tf.reshape(emb_vector, shape=[-1, self.slot_num * self.nnz_per_slot * self.embedding_vector_size])

        hidden = emb_vector
        for layer in self.dense_layers:
            hidden = layer(hidden)

        logit = self.out_layer(hidden)
        return logit


def guide_batches(global_batch_size, steps, slot_num=10, nnz_per_slot=5, vocabulary_size=800, seed=0):
    """The toy task the notebook trains DemoModel on: `steps` global batches of
    `(inputs [global_batch_size, slot_num, nnz_per_slot] int64, labels [global_batch_size, 1] float32)`.

    Keys are drawn from `vocabulary_size` random ids anywhere in [0, 2**40) (the hash-table
    layer takes any int64), and a sample's label is whether its first key (slot 0, position
    0) is even. Learnable: each id's embedding row can carry its label; the other 49 keys are
    noise the model learns to ignore. Every worker draws the same batches from `seed` and
    takes its own slice.

    Example:
        >>> [(x.shape, y.shape) for x, y in guide_batches(256, steps=2)]
        [((256, 10, 5), (256, 1)), ((256, 10, 5), (256, 1))]
    """
    rng = np.random.default_rng(seed)
    vocabulary = rng.integers(0, 2**40, size=vocabulary_size)
    for _ in range(steps):
        inputs = rng.choice(vocabulary, size=(global_batch_size, slot_num, nnz_per_slot))
        labels = (inputs[:, :1, 0] % 2 == 0).astype(np.float32)
        yield inputs, labels


def guide_example():
    """The new API's getting-started example (v1 = arange(17*3), v2 = arange(7*5), sum);
    returns this rank's gradient shapes [[rows, 3], [rows, 5]]."""
    v1 = sok.Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
    v2 = sok.Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)
    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=tf.constant([1, 1, 3, 4, 5], tf.int64), dense_shape=[2, 3])
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=tf.constant([1, 2, 3], tf.int64),
                               dense_shape=[2, 2])
    with tf.GradientTape() as tape:
        embeddings = sok.lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
        loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
    grads = tape.gradient(loss, [v1, v2])
    return [g.values.shape.as_list() for g in grads]


def localized_example():
    """A localized table (whole on the last rank) beside a distributed one, looked up from every
    rank in one `lookup_sparse` call and updated by SGD (learning rate 1); returns this rank's view.

    Both tables are `arange(rows * 2).reshape(rows, 2)`: the localized one has 6 rows, the
    distributed one 5 (+100). Every rank looks up keys [[0, 5], [3]] in the localized table and
    [[1], [2, 4]] in the distributed one (sum), and applies the gradient of the sum of the outputs.

    Returns:
        {"rank", "target_rank", "localized_rows" / "distributed_rows" (rows this rank holds),
        "localized_out" / "distributed_out" (the looked-up sums), "localized_after" (this
        rank's localized rows after the update)}.

    Example (one process, where the last rank is rank 0):
        >>> localized_example()["localized_out"]
        [[10.0, 12.0], [6.0, 7.0]]
    """
    n, rank = sok.num_workers(), sok.rank()
    loc = sok.Variable(np.arange(6 * 2).reshape(6, 2), dtype=tf.float32, mode=f"localized:{n - 1}",
                       name="localized_demo")
    dist = sok.Variable(np.arange(5 * 2).reshape(5, 2) + 100, dtype=tf.float32, name="distributed_demo")
    ids_loc = tf.ragged.constant([[0, 5], [3]], dtype=tf.int64)
    ids_dist = tf.ragged.constant([[1], [2, 4]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        out_loc, out_dist = sok.lookup_sparse([loc, dist], [ids_loc, ids_dist], combiners=["sum", "sum"])
        loss = tf.reduce_sum(out_loc) + tf.reduce_sum(out_dist)
    grads = tape.gradient(loss, [loc, dist])
    sok.OptimizerWrapper(tf.keras.optimizers.SGD(learning_rate=1.0)).apply_gradients(zip(grads, [loc, dist]))
    return {"rank": rank, "target_rank": loc.target_rank, "localized_rows": int(loc.shape[0]),
            "distributed_rows": int(dist.shape[0]), "localized_out": out_loc.numpy().tolist(),
            "distributed_out": out_dist.numpy().tolist(), "localized_after": loc.numpy().tolist()}
