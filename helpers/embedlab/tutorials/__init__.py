"""What the notebooks call that is not product: their data recipes, training loops, demo models
and measurement helpers, kept out of the notebooks so that they read as the story.

- `training`: notebook 01's timed training loop and optimizer-step timer.
- `keras_rs_swap`: notebook 01's Keras-RS model trained with Keras-RS's `DistributedEmbedding` and,
  swapped, with EmbedLab's: the same losses, and the two train steps timed side by side.
- `input_forms`: notebook 01's cost split of the key input forms (CSR, COO, dense) and its report.
- `session_lab`: notebook 03's W&D data recipe, HugeCTR's training loop over (file list,
  keyset) pairs, memory probes, and the same Wide & Deep written by hand in Keras.
- `sok_guide`: SOK's getting-started guide as a module (its `DemoModel`, a learnable toy task,
  the new API's example), trained by notebook 04 in one process and in its 2-worker job.
- `sok_demo`: notebook 04's Criteo DeepFM on `sok.lookup_sparse`, on 1 or N workers
  (`python -m embedlab.sok.launch -n 2 -m embedlab.tutorials.sok_demo ...`).
- `sok_cost`: notebook 04's cost model of a sharded step (collectives' fixed cost, bytes per
  step, compute) fitted from its measurements, and its per-worker memory probe.
- `verdicts`: spread-aware comparisons of timings (a winner only outside the noise).
- `naive_dnn`: notebook 05's model: mock click data from a learnable click model, a naive TF DNN
  trained on it, and `export_for_serving` (the export steps are `embedlab.hps.export`'s).
- `hps_demo`: notebook 05's HPS tier demos (hit rate against cache size, the tier stacks timed,
  a Redis outage) and `captured_log` (notebooks 05 and 06).
"""
