"""Keras-RS's `DistributedEmbedding` on EmbedLab's kernels, for CPU (and GPU tables).

`keras_rs.layers.DistributedEmbedding` accelerates only TPUs with SparseCore; on CPU and GPU
it runs one plain `keras.layers.Embedding` lookup per feature and leaves the tables to the
model's optimizer. `embedlab.keras_rs.DistributedEmbedding` takes the same
`keras_rs.layers.TableConfig` / `FeatureConfig` objects (or `tf.tpu.experimental.embedding`
configs), the same call (`layer(inputs, weights=None)` or `layer(layer.preprocess(...))` with
dense, ragged or sparse ids, nested like the configs) and returns the same activations, but:

* all tables of the layer go through **one** fused EmbedLab lookup (features that share a
  table are looked up together, as one input of their concatenated rows);
* each table's `TableConfig.optimizer` (SGD, Adagrad, Adam, FTRL; `optimizers` lists the honoured
  options) updates the touched rows **inside the lookup's backward**, as SparseCore does, while
  `model.fit`'s optimizer trains the rest of the model; `optimizer_in_backward=False` (or a
  table optimizer of None) gives Keras-RS's CPU behaviour instead (trainable tables, trained by
  the model's optimizer from `IndexedSlices` gradients);
* combiners sum, mean and sqrtn (sqrtn as the weighted sum with weights `w / sqrt(sum w^2)`),
  weights, and `FeatureConfig.input_shape` truncation of ragged / sparse rows (`inputs`);
* `.keras` saving (tables, the fused optimizers' state), `model.export(path)` (a SavedModel for
  serving: its graph holds EmbedLab's ops, so the serving process registers them before
  `tf.saved_model.load`, with `import embedlab.keras_rs` or `embedlab.tf_ops()`, as for any
  custom-op library) and `export_hps(path)`, which writes the tables as HPS sparse models for
  `embedlab.hps`;
* `sharding="row"`: every table split row-wise over the workers of `embedlab.sok` (row i on rank
  i % n) under `MultiWorkerMirroredStrategy`, looked up by `sok.lookup_sparse` and trained by its
  fused optimizer on the shard's gradient: the same losses and tables on 1 and 2 workers.

`EmbedReduce` is Keras-RS's single-table layer on the same kernel.

Semantics that differ from Keras-RS on CPU: with the default `optimizer_in_backward=True`, the
tables are non-trainable variables (plus one trainable `bp_trigger` scalar), Adam is lazy (only
touched rows' moments move) and FTRL leaves untouched rows as they are.

XLA: EmbedLab's custom ops have no XLA kernels. Traced inside an XLA context (a
`tf.function(jit_compile=True)`, which is how Keras-RS's own jit tests call the layer), the layer
(and `EmbedReduce`) runs as XLA-compilable TensorFlow ops instead (`xla`): a gather and a segment
sum per feature with the same combiners, weights and truncation, and, in the backward, each
table's fused optimizer applied to the touched rows with resource gathers and scatters, the same
update as the kernels (same losses and tables to float32 summation order). It logs this once
(INFO, logger `embedlab.keras_rs`). Both layers set Keras' `supports_jit = False`, so a model
holding them keeps the (faster) custom kernels: `jit_compile="auto"` resolves to False, and
Keras turns `model.compile(jit_compile=True)` off with its warning "Model doesn't support
`jit_compile=True`". Dense, ragged and sparse ids compile (under XLA, truncation to
`input_shape` marks the dropped ids -1 instead of removing them, so that every shape stays
static); `sharding="row"` does not (its lookup is a collective of custom ops).

Example:
    >>> import keras_rs, tensorflow as tf
    >>> from embedlab.keras_rs import DistributedEmbedding
    >>> table = keras_rs.layers.TableConfig("t", vocabulary_size=100, embedding_dim=8, optimizer="adagrad")
    >>> fc = {"f": keras_rs.layers.FeatureConfig("f", table, input_shape=(4, 1), output_shape=(4, 8))}
    >>> DistributedEmbedding(fc)({"f": tf.constant([[1], [2], [3], [4]])})["f"].shape.as_list()
    [4, 8]
"""
from .layer import DistributedEmbedding, EmbedReduce

__all__ = ["DistributedEmbedding", "EmbedReduce"]
