"""The getting-started guide's DemoModel (first-generation API) and its new-API example, as a
module, for the worker scripts of notebook 04 (the notebook shows the same code inline)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from . import All2AllDenseEmbedding, Variable, lookup_sparse


class DemoModel(tf.keras.models.Model):
    """SOK's getting-started DemoModel, unchanged apart from the import."""

    def __init__(self, max_vocabulary_size_per_gpu, slot_num, nnz_per_slot, embedding_vector_size,
                 num_of_dense_layers, **kwargs):
        super(DemoModel, self).__init__(**kwargs)
        self.max_vocabulary_size_per_gpu = max_vocabulary_size_per_gpu
        self.slot_num = slot_num
        self.nnz_per_slot = nnz_per_slot
        self.embedding_vector_size = embedding_vector_size
        self.num_of_dense_layers = num_of_dense_layers
        self.embedding_layer = All2AllDenseEmbedding(
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
        emb_vector = self.embedding_layer(inputs, training=training)
        emb_vector = tf.reshape(emb_vector, shape=[-1, self.slot_num * self.nnz_per_slot * self.embedding_vector_size])
        hidden = emb_vector
        for layer in self.dense_layers:
            hidden = layer(hidden)
        return self.out_layer(hidden)


def guide_example():
    """The new API's getting-started example (v1 = arange(17*3), v2 = arange(7*5), sum);
    returns this rank's gradient shapes [[rows, 3], [rows, 5]]."""
    v1 = Variable(np.arange(17 * 3).reshape(17, 3), dtype=tf.float32)
    v2 = Variable(np.arange(7 * 5).reshape(7, 5), dtype=tf.float32)
    indices1 = tf.SparseTensor(indices=[[0, 0], [0, 1], [1, 0], [1, 1], [1, 2]],
                               values=tf.constant([1, 1, 3, 4, 5], tf.int64), dense_shape=[2, 3])
    indices2 = tf.SparseTensor(indices=[[0, 0], [1, 0], [1, 1]], values=tf.constant([1, 2, 3], tf.int64),
                               dense_shape=[2, 2])
    with tf.GradientTape() as tape:
        embeddings = lookup_sparse([v1, v2], [indices1, indices2], combiners=["sum", "sum"])
        loss = tf.add_n([tf.reduce_sum(e) for e in embeddings])
    grads = tape.gradient(loss, [v1, v2])
    return [g.values.shape.as_list() for g in grads]
