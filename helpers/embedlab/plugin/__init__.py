"""HugeCTR's TensorFlow embedding plugin, as a Keras 3 layer on EmbedLab's compiled ops.

The workflow of HugeCTR's `hugectr_tf_ops` (v2.3/v3.0), rebuilt on today's Keras::

    import embedlab.plugin as plugin
    plugin.init(devices=["/CPU:0", "/CPU:1"], seed=0)      # callable again, any time
    emb = plugin.EmbeddingLayer(vocabulary_size=1000, embedding_vec_size=8, slot_num=26,
                                max_nnz=2, combiner="sum", embedding_type="distributed",
                                optimizer=embedlab.optimizers.Adam(0.001))
    out = emb(keys)                                        # [batch, 26, 8]

Input (any of):

* dense int64 `[batch, slot_num, max_nnz]` keys padded with -1 (key 0 is valid);
* a COO `tf.SparseTensor` with dense_shape `[batch * slot_num, max_nnz]` or
  `[batch, slot_num, max_nnz]` (converted to CSR by a compiled counting sort);
* pre-built CSR, a tuple `(row_offsets, values)`: `row_offsets` int64 `[batch*slot_num + 1]`,
  `values` int64 `[nnz]` (HugeCTR's `fprop_v3` input). This skips the COO -> CSR sort;
* an `embedlab.SparseInput` of `batch * slot_num` rows (row b * slot_num + s is slot s of
  sample b), without weights.

Every form becomes one `embedlab.SparseInput`; a SparseTensor stays COO, and on one device the
lookup hands it to the op that sorts and looks up in one pass.

Output: float32 `[batch, slot_num, embedding_vec_size]`, each slot's keys pooled with
`combiner` ("sum" or "mean"); an empty slot gives zeros.

Placement ("devices" are the ones given to `init`, by default every logical CPU device):

* "distributed": rows are sharded by key % n: shard i holds keys i, i+n, i+2n, ... at local
  row key // n, so memory is vocabulary_size * vec floats in total.
* "localized": slot s lives on device s % n. With `slot_size_array` (keys of slot s lie in
  [offset_s, offset_s + slot_size_array[s]), offsets the running sum, as HugeCTR's
  preprocessing writes them) each device holds only its slots' rows. Without it every device
  holds a full vocabulary_size-row table (n times the memory) and a key must be used by the
  slots of one device only (true for Criteo-style per-slot offsets); `save` raises if a key
  was trained on two devices.

Results are bitwise identical whatever the number of devices: with one device the layer does
one pooled lookup; with several, each device gathers its rows unpooled (keys it doesn't own
masked to -1, which gives exact zeros), the gathered rows are added (x + 0 is exact), and one
pooled lookup over them in the original key order does the same float additions as the
one-device path. Initial values are a function of (seed, key) only, so sharding does not
change them.

To split one CPU into n logical devices (to try sharding on a laptop), call
`split_cpu(n)` (or `tf.config.set_logical_device_configuration`) *before* TensorFlow
initializes its devices, i.e. before the first op runs.

Training: with `optimizer=None` the tables are ordinary trainable variables and their
`IndexedSlices` gradients go to whatever optimizer the model uses (use
`embedlab.optimizers.*` for compiled sparse updates). With an EmbedLab optimizer, the layer
trains its tables itself, as the plugin did: its tables are non-trainable to Keras, a scalar
`bp_trigger` variable is trainable and, when backprop reaches it (in `model.fit`, or any
`GradientTape`), the layer applies its optimizer to the tables' sparse gradients; the
trigger's gradient is zero, so the model's optimizer leaves it at 0. Call `tape.gradient`
once per step (each call applies an update). The layer's optimizer updates each device's
table with its own compiled op (on one device, the backward and the update are a single op:
the optimizer runs inside the backward, as in `ops.fused_embedding_lookup(optimizer=...)`);
gradient clipping / loss-scaling options of that optimizer are not applied.

With `optimizer=None` and tables on several devices, the model's optimizer receives one
IndexedSlices gradient per device table: Keras optimizers handle that, but an
`embedlab.optimizers` instance currently fuses all sparse updates of a step into one op,
which TensorFlow cannot place across devices; give the layer its own optimizer instead
(or use one device).

The package: `placement` (the devices `init` sets, and which keys each device's table holds),
`layer` (`EmbeddingLayer`, `initial_values`), `checkpoint` (the layer's `save` / `restore` file
format).
"""
from __future__ import annotations

from .checkpoint import CheckpointError
from .layer import EmbeddingLayer, initial_values
from .placement import PluginConfig, current, init, split_cpu

__all__ = ["init", "split_cpu", "current", "EmbeddingLayer", "PluginConfig", "initial_values", "CheckpointError"]
