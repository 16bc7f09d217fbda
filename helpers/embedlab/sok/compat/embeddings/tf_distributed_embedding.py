"""SOK's `TFDistributedEmbedding` (`sparse_operation_kit.embeddings.tf_distributed_embedding`,
HugeCTR v23.09.00): SOK's TensorFlow-only reference layer, used by HugeCTR's DenseDemo and DLRM
models to check SOK's layers against plain TensorFlow::

    strategy = tf.distribute.MultiWorkerMirroredStrategy()   # or any tf.distribute strategy
    with strategy.scope():
        layer = TFDistributedEmbedding(vocabulary_size, embedding_vec_size, initializer)

    @tf.function
    def step(ids):                       # inside strategy.run
        return layer(ids)                # [*ids.shape, embedding_vec_size]

The table is one `[vocabulary_size, embedding_vec_size]` float32 variable created under the
strategy's scope, so every worker holds the whole table (a mirrored variable, as in SOK) and a
plain Keras optimizer under the strategy trains it (its gradients are all-reduced). SOK has
each replica look up the keys `k % num_replicas == replica_id` of all replicas and all-gathers
the vectors back; since every replica holds the same table, that gives the vectors and, after
the optimizer's all-reduce, the gradients of a lookup in the worker's own copy, which is what
this layer does (`tf.nn.embedding_lookup`). Keys must lie in `[0, vocabulary_size)`.
"""
from __future__ import annotations

from ...._tfstart import import_tensorflow

tf = import_tensorflow()                 # TensorFlow without its start-up banner

import keras  # noqa: E402
import numpy as np  # noqa: E402

from ... import exchange  # noqa: E402

__all__ = ["TFDistributedEmbedding"]


class TFDistributedEmbedding(keras.layers.Layer):
    """SOK's TensorFlow-only embedding layer (see the module doc).

    Args:
        vocabulary_size: rows of the table.
        embedding_vec_size: columns of the table.
        initializer: a Keras initializer name (default "GlorotNormal") or an array of shape
            `[vocabulary_size, embedding_vec_size]`, the initial table.
        comm_options: SOK's `tf.distribute.experimental.CommunicationOptions` for its
            all-gathers; kept, unused (a lookup here exchanges nothing).

    Must be created under a `tf.distribute.Strategy` scope (a `RuntimeError` otherwise, as in
    SOK) and called in a replica context (inside `strategy.run`).
    """

    def __init__(self, vocabulary_size, embedding_vec_size, initializer="GlorotNormal", comm_options=None,
                 **kwargs):
        super().__init__(**kwargs)
        if int(vocabulary_size) < 1 or int(embedding_vec_size) < 1:
            raise ValueError(f"TFDistributedEmbedding: vocabulary_size and embedding_vec_size must be >= 1, got "
                             f"{vocabulary_size} and {embedding_vec_size}")
        self._vocabulary_size = int(vocabulary_size)
        self._embedding_vec_size = int(embedding_vec_size)
        shape = (self._vocabulary_size, self._embedding_vec_size)
        if isinstance(initializer, str):
            init = keras.initializers.get(initializer)
        else:
            if tuple(initializer.shape) != shape:
                raise ValueError("The shape of initializer must be [vocabulary_size, embedding_vec_size.]")
            value = np.asarray(initializer, np.float32)
            init = lambda shape, dtype=None: tf.constant(value)  # noqa: E731
        self._comm_options = comm_options
        if not tf.distribute.has_strategy():
            raise RuntimeError("This layer must be created under tf.distribute.Strategy.Scope().")
        self._embedding_weights = self.add_weight(shape=shape, initializer=init, dtype="float32",
                                                  trainable=True, name="EmbeddingWeights")

    @property
    def embedding_weights(self):
        return self._embedding_weights

    def broadcast_variables(self):
        """Sets every worker's table to worker 0's. Call it inside `strategy.run`, on every worker
        (a collective). A table created under the strategy's scope already starts from worker
        0's values; this is for tables a worker changed on its own (e.g. loaded from a file)."""
        replica_ctx = tf.distribute.get_replica_context()
        if replica_ctx is None or tf.distribute.in_cross_replica_context():
            raise RuntimeError("TFDistributedEmbedding.broadcast_variables must be called inside strategy.run")
        if replica_ctx.num_replicas_in_sync == 1:
            return
        value = exchange.all_gather(tf.convert_to_tensor(self._embedding_weights))[0]

        def _assign(strategy, v):
            return strategy.extended.update(self._embedding_weights.value, lambda var, x: var.assign(x), args=(v,))

        replica_ctx.merge_call(_assign, args=(value,))

    def call(self, inputs):
        """`[*inputs.shape, embedding_vec_size]` float32: the row of each key of `inputs` (int32 or
        int64 keys in `[0, vocabulary_size)`)."""
        if tf.distribute.in_cross_replica_context():
            raise RuntimeError("The forward propagation of TFDistributedEmbedding "
                               "cannot be called in cross_replica_context.")
        inputs = tf.convert_to_tensor(inputs)
        if inputs.dtype not in (tf.int32, tf.int64):
            raise ValueError(f"TFDistributedEmbedding: keys must be int32 or int64, got {inputs.dtype.name}")
        return tf.nn.embedding_lookup(params=self._embedding_weights, ids=inputs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self._embedding_vec_size,)
