"""embedlab.keras_rs.DistributedEmbedding against Keras-RS's own (default_device) on the CPU.

A DCN-like model: 26 categorical features (one id per row, Criteo's shape), each its own table
of `--rows` x `--dim`, their activations concatenated with 13 dense features into a 2-layer MLP,
binary cross-entropy. Both layers get the same tables, the same data and the same optimizer
(Adagrad, or SGD with `--optimizer sgd`): Keras-RS's tables are trained by the model's
optimizer (its CPU behaviour), EmbedLab's by the same optimizer fused into the lookup's
backward. Each `tf.function` train step (forward, backward, optimizers) and forward is timed in
interleaved repeats; the table shows median and spread, and the losses of the two models over
the same batches (they agree to float32 rounding for SGD and for Adagrad on data whose keys are
unique in each batch; Keras' Adagrad squares duplicate keys' gradients separately).

    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/keras_rs.py --rows 100000 --batch 4096

The JSON (arguments, machine, 1-minute load average before and after, every timed repeat, the
losses) goes to `--out`, by default docs/benchmarks/results/keras_rs_<machine>_<date>.json
(`_results.py`); `--note` adds a free-text note to it (e.g. that the machine was shared).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

# This file's name is the package's: run as a script, its folder (sys.path[0]) would shadow it.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import keras_rs  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from embedlab.data.criteo.synth import KAGGLE_CARDINALITIES  # noqa: E402
from embedlab.keras_rs import DistributedEmbedding  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402

N_TABLES, N_DENSE = 26, 13


def build(layer_cls, rows, dim, batch, opt_name, seed):
    """One model: table i has rows[i] rows."""
    keras.utils.set_random_seed(seed)
    opt = {"adagrad": lambda: keras.optimizers.Adagrad(0.05), "sgd": lambda: keras.optimizers.SGD(0.05)}[opt_name]
    tables = [keras_rs.layers.TableConfig(f"t{i}", rows[i], dim, optimizer=opt(), combiner="sum",
                                          initializer=keras.initializers.RandomUniform(-0.05, 0.05, seed=seed + i))
              for i in range(N_TABLES)]
    fcs = {f"c{i}": keras_rs.layers.FeatureConfig(f"c{i}", tables[i], (batch, 1), (batch, dim)) for i in range(N_TABLES)}
    emb = layer_cls(fcs)
    mlp = [keras.layers.Dense(64, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed)),
           keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1))]
    model_opt = opt()

    def forward(cat, dense):
        out = emb(cat)
        x = tf.concat([dense] + [out[f"c{i}"] for i in range(N_TABLES)], 1)
        for layer in mlp:
            x = layer(x)
        return x

    @tf.function
    def fwd(cat, dense):
        return forward(cat, dense)

    @tf.function
    def step(cat, dense, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.binary_crossentropy(y, forward(cat, dense), from_logits=True))
        variables = emb.trainable_variables + [v for layer in mlp for v in layer.trainable_variables]
        grads = tape.gradient(loss, variables)
        model_opt.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return loss

    return emb, step, fwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000, help="rows of every table (without --criteo)")
    ap.add_argument("--criteo", action="store_true",
                    help="tables of the Criteo Kaggle columns' cardinalities (1460 ... 10,131,227 rows; "
                         "33.8M rows in all) instead of --rows each")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--optimizer", choices=["adagrad", "sgd"], default="adagrad")
    ap.add_argument("--steps", type=int, default=8, help="loss-curve steps (same batches for both)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--unique", action="store_true", help="keys unique within each batch and table")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON path (default docs/benchmarks/results/keras_rs_<machine>_<date>.json)")
    ap.add_argument("--note", default="", help="free text stored with the results (e.g. 'machine shared')")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    rng = np.random.default_rng(0)
    rows = list(KAGGLE_CARDINALITIES) if args.criteo else [args.rows] * N_TABLES

    def batch():
        if args.unique:     # a table smaller than the batch repeats its keys
            cat = {f"c{i}": tf.constant(np.resize(rng.permutation(rows[i]), args.batch)[:, None])
                   for i in range(N_TABLES)}
        else:
            cat = {f"c{i}": tf.constant(np.minimum(rng.zipf(1.2, (args.batch, 1)) - 1, rows[i] - 1))
                   for i in range(N_TABLES)}
        return (cat, tf.constant(rng.normal(size=(args.batch, N_DENSE)).astype(np.float32)),
                tf.constant(rng.integers(0, 2, (args.batch, 1)).astype(np.float32)))

    data = [batch() for _ in range(args.steps)]
    ours = build(DistributedEmbedding, rows, args.dim, args.batch, args.optimizer, 1)
    ref = build(keras_rs.layers.DistributedEmbedding, rows, args.dim, args.batch, args.optimizer, 1)
    ours[2](*data[0][:2]), ref[2](*data[0][:2])
    for name, table in ref[0].get_embedding_tables().items():       # the very same initial tables
        [layer for layer in ours[0]._table_layers if layer.name == name][0].embeddings.assign(table)
    losses = {"embedlab": [], "keras_rs": []}
    for cat, dense, y in data:
        losses["embedlab"].append(float(ours[1](cat, dense, y)))
        losses["keras_rs"].append(float(ref[1](cat, dense, y)))
    times = {f"{k}_{w}": [] for k in ("embedlab", "keras_rs") for w in ("step", "forward")}
    cat, dense, y = data[0]
    for _ in range(args.repeats):                     # interleaved: load changes hit both alike
        for key, (_, step, fwd) in (("embedlab", ours), ("keras_rs", ref)):
            t0 = time.perf_counter()
            step(cat, dense, y).numpy()
            times[f"{key}_step"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fwd(cat, dense).numpy()
            times[f"{key}_forward"].append(time.perf_counter() - t0)
    shape = "Criteo Kaggle's 26 tables (33.8M rows)" if args.criteo else f"26 tables x {args.rows}"
    print(f"{shape} x {args.dim}, batch {args.batch}, {args.optimizer}, "
          f"{os.cpu_count()} CPUs, {args.repeats} interleaved repeats (ms: median [min, max])")
    for w in ("step", "forward"):
        a, b = times[f"embedlab_{w}"], times[f"keras_rs_{w}"]
        print(f"  {w:8s} embedlab {1e3 * statistics.median(a):8.2f} [{1e3 * min(a):.2f}, {1e3 * max(a):.2f}]   "
              f"keras_rs {1e3 * statistics.median(b):8.2f} [{1e3 * min(b):.2f}, {1e3 * max(b):.2f}]   "
              f"ratio {statistics.median(b) / statistics.median(a):.2f}x")
    diff = max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(losses["embedlab"], losses["keras_rs"]))
    print("  losses embedlab", [round(v, 6) for v in losses["embedlab"]])
    print("  losses keras_rs", [round(v, 6) for v in losses["keras_rs"]])
    print(f"  largest relative loss difference {diff:.2e}")
    machine = {"cpu": _results.cpu_name(), "cpu_family_model": _results.cpu_family_model(),
               "cores": os.cpu_count(), "tensorflow": tf.__version__, "keras": keras.__version__,
               "keras_rs": getattr(keras_rs, "__version__", None)}
    ratios = {w: statistics.median(times[f"keras_rs_{w}"]) / statistics.median(times[f"embedlab_{w}"])
              for w in ("step", "forward")}
    out = {"command": " ".join(sys.argv), "machine": machine,
           "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
           # Other processes on a shared machine show up here (1-minute load average vs cores).
           "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
           "times_s": times, "median_ratio_keras_rs_over_embedlab": ratios, "losses": losses,
           "largest_relative_loss_difference": diff, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = args.out or _results.default_out("keras_rs", _results.cpu_machine())
    from embedlab._io import atomic_file
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(out, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
