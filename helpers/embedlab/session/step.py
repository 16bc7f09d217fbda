"""The inputs of the Session's compiled steps: one named structure, its signature and its
values built here and nowhere else.

A training step takes::

    {"label": [n, label_dim] float32, "dense": [n, dense_dim] float32,
     "iteration": int64 (1-based), "lr_dense": float32, "lr_embeddings": [E] float32,
     "embeddings": [ per embedding, in model order:
         {"splits": [n * slots + 1] int64,        row splits of its sparse input (sample-major)
          "rows": [nnz] int64,                    the keys' table rows (`KeyTranslation`)
          "init_rows": [k] int64, "init_values": [k, vec] float32,   rows to initialize first
          "rows_in_use": int64} ]}                rows a Global update covers

and an evaluation step the same without the iteration, the learning rates and the three
initialization / update entries (its rows are -1 for keys the tables do not hold).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

__all__ = ["StepInputs"]


class StepInputs:
    """Signature and values of the step inputs for a model's Data layer and embeddings."""

    def __init__(self, data, embeddings):
        self.data, self.embeddings = data, list(embeddings)

    def signature(self, train: bool) -> dict:
        """The `tf.TensorSpec` structure of a training (`train=True`) or evaluation step."""
        d = self.data
        sig = {"label": tf.TensorSpec([None, d.label_dim], tf.float32),
               "dense": tf.TensorSpec([None, d.dense_dim], tf.float32)}
        if train:
            sig.update(iteration=tf.TensorSpec([], tf.int64), lr_dense=tf.TensorSpec([], tf.float32),
                       lr_embeddings=tf.TensorSpec([len(self.embeddings)], tf.float32))
        per = []
        for e in self.embeddings:
            s = {"splits": tf.TensorSpec([None], tf.int64), "rows": tf.TensorSpec([None], tf.int64)}
            if train:
                s.update(init_rows=tf.TensorSpec([None], tf.int64),
                         init_values=tf.TensorSpec([None, e.vec], tf.float32),
                         rows_in_use=tf.TensorSpec([], tf.int64))
            per.append(s)
        sig["embeddings"] = per
        return sig

    def train(self, batch, sparse, rows, iteration: int, lr_dense: float, lr_embeddings) -> dict:
        """Training-step values for `batch`: `sparse` = (row_splits, keys) and `rows` = table rows
        per embedding. Takes the rows each embedding must initialize first (`pending_init`)."""
        out = {"label": tf.constant(batch.label), "dense": tf.constant(batch.dense),
               "iteration": tf.constant(iteration, tf.int64), "lr_dense": tf.constant(lr_dense, tf.float32),
               "lr_embeddings": tf.constant(lr_embeddings, tf.float32)}
        per = []
        for e, (splits, _), r in zip(self.embeddings, sparse, rows):
            irows, ivals = e.pending_init(r)
            per.append({"splits": tf.constant(splits), "rows": tf.constant(r), "init_rows": tf.constant(irows),
                        "init_values": tf.constant(ivals), "rows_in_use": tf.constant(e.rows_in_use, tf.int64)})
        out["embeddings"] = per
        return out

    @staticmethod
    def eval(batch, sparse, rows) -> dict:
        """Evaluation-step values for `batch` (rows: -1 for keys the tables do not hold)."""
        return {"label": tf.constant(batch.label), "dense": tf.constant(batch.dense),
                "embeddings": [{"splits": tf.constant(splits), "rows": tf.constant(np.asarray(r))}
                               for (splits, _), r in zip(sparse, rows)]}
