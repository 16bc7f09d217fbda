"""CPU benchmark: the training step of `embedlab.plugin.EmbeddingLayer`, eager and in graph.

One layer of `--vocab` x `--dim` float32 rows (default 1M x 16) on one device, `--slots` slots
(default 26), batch `--batch` (default 4,096), 1..`--max-keys` keys per slot (default 3) drawn
uniformly from the vocabulary. Every step uses the next of `--batches` batches of fresh keys,
so no step finds its rows in cache from the step before.

Cases (each timed eagerly and inside one `tf.function`):

* `own_{coo,dense}`: the layer trains its table itself (`optimizer=embedlab.optimizers.SGD`,
  the optimizer inside the backward; the tape asks for the gradient of `bp_trigger`);
* `model_{coo,dense}`: `optimizer=None`; the tape's `IndexedSlices` gradient of the table goes
  to `embedlab.optimizers.SGD.apply_gradients`.

`coo` feeds a `tf.SparseTensor [batch, slots, max_keys]` (canonical order), `dense` the same
keys as a `[batch, slots, max_keys]` tensor padded with -1. The step's loss is
sum(out * r) with a fixed random r. All cases are timed in turn within each repeat, so load
from other processes on a shared machine hits them alike; each figure is the median over
`--repeats` steps, with the 10th and 90th percentiles beside it.

Prints a table and writes JSON (default docs/benchmarks/results/plugin_layer_<machine>_<date>.json).

Usage (the `embedlab` package on PYTHONPATH is the one measured):
    PYTHONPATH=helpers python helpers/benchmarks/plugin_layer.py --repeats 30
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--slots", type=int, default=26)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--max-keys", type=int, default=3, help="keys per slot drawn from 1..max")
    p.add_argument("--batches", type=int, default=8, help="distinct batches cycled through")
    p.add_argument("--repeats", type=int, default=30, help="timed steps per case")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="", help="a name for this run in the JSON (e.g. 'before')")
    p.add_argument("--out", type=Path, default=None, help="JSON path (default: results/plugin_layer_...)")
    return p.parse_args()


def _batch(rng, a, tf):
    """One batch as (SparseTensor [B, S, M], dense [B, S, M] with -1 padding): the same keys."""
    B, S, M = a.batch, a.slots, a.max_keys
    counts = rng.integers(1, M + 1, size=(B, S))
    dense = np.full((B, S, M), -1, np.int64)
    mask = np.arange(M)[None, None, :] < counts[:, :, None]
    dense[mask] = rng.integers(0, a.vocab, size=int(mask.sum()))
    idx = np.argwhere(mask).astype(np.int64)          # row-major: canonical order
    sp = tf.SparseTensor(idx, dense[mask], [B, S, M])
    return sp, tf.constant(dense)


def main():
    a = _parse()
    import tensorflow as tf
    import embedlab
    from embedlab import optimizers, plugin

    rng = np.random.default_rng(a.seed)
    batches = [_batch(rng, a, tf) for _ in range(a.batches)]
    r = tf.constant(rng.standard_normal((a.batch, a.slots, a.dim)).astype(np.float32))
    plugin.init(devices=["/CPU:0"], seed=a.seed)

    def make(own):
        opt = optimizers.SGD(0.01)
        layer = plugin.EmbeddingLayer(a.vocab, a.dim, a.slots, a.max_keys, "sum",
                                      optimizer=opt if own else None)
        variables = layer.trainable_variables

        def step(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(layer(x) * r)
            grads = tape.gradient(loss, variables)
            if not own:
                opt.apply_gradients(zip(grads, variables))
            return loss
        return step

    cases = {}
    for own in (True, False):
        step = make(own)
        graph = tf.function(step)
        for form, k in (("coo", 0), ("dense", 1)):
            inputs = [b[k] for b in batches]
            prefix = "own" if own else "model"
            cases[f"{prefix}_{form}_eager"] = (step, inputs)
            cases[f"{prefix}_{form}_graph"] = (graph, inputs)

    for name, (fn, inputs) in cases.items():
        for i in range(a.warmup):
            fn(inputs[i % len(inputs)]).numpy()
    times = {name: [] for name in cases}
    for i in range(a.repeats):
        for name, (fn, inputs) in cases.items():
            x = inputs[i % len(inputs)]
            t0 = time.perf_counter()
            fn(x).numpy()
            times[name].append((time.perf_counter() - t0) * 1e3)

    rows = {}
    print(f"{'case':<20}{'median ms':>11}{'p10':>9}{'p90':>9}   (embedlab at {Path(embedlab.__file__).parent})")
    for name, t in times.items():
        q = np.percentile(t, [10, 90])
        rows[name] = {"median_ms": statistics.median(t), "p10_ms": float(q[0]), "p90_ms": float(q[1]),
                      "all_ms": t}
        print(f"{name:<20}{rows[name]['median_ms']:>11.2f}{q[0]:>9.2f}{q[1]:>9.2f}")
    out = a.out or _results.default_out("plugin_layer", _results.cpu_machine())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "plugin_layer", "label": a.label, "args": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "embedlab": str(Path(embedlab.__file__).parent), "cpu": _results.cpu_name(),
        "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "cases": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
