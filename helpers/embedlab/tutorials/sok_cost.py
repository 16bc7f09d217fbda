"""Notebook 04's cost model of a sharded training step and its per-worker memory probe.

A step of the DeepFM of `embedlab.tutorials.sok_demo` on n workers, each with its own cores, is
modelled as

    step(n) = step(1) / n                                  each worker's share of the global batch
            + calls · alpha + bytes(n) / bandwidth         the collectives

where step(1) is the measured 1-worker step (the compute, no collectives), `calls` the number of
collectives a step runs (fixed by the model: per `lookup_sparse` call one all-gather of the
counts, two all-to-alls forward, one backward; plus the all-reduces of the dense gradients and of
the loss), `bytes(n)` what one worker sends to the others per step (`exchange_volume`), and
alpha (the fixed cost of one collective) and the bandwidth are fitted from two all-to-all probes
of different sizes timed in the same run as the step (`fit_link`). The fit is checked against the measured exchange
(`explain_exchange`) and the measured 2-worker step.
"""
from __future__ import annotations

import numpy as np

from .verdicts import compare, spread  # noqa: F401  (re-exported for the notebook)

__all__ = ["spread", "compare", "exchange_volume", "fit_link", "explain_exchange", "deepfm_dense_bytes",
           "predict_step", "step_model", "shard_bytes", "memory_probe"]

# Collectives per `lookup_sparse` call with one group of tables (one embedding dim): the counts'
# all-gather, the keys' and the rows' all-to-all forward, the rows' gradient all-to-all backward.
COLLECTIVES_PER_LOOKUP = 4


def exchange_volume(keys, workers: int, dims=(8, 1), key_bytes: int = 8) -> dict:
    """What one worker sends per training step of `sok_demo`'s DeepFM (keys of one global batch).

    Each `lookup_sparse` call (one per embedding dim) buckets this worker's keys by owner (row
    % n) into an `[n, P]` buffer, P the largest bucket over all workers (every worker sends the
    same shape), and all-to-alls the keys, the rows back (P·dim floats per peer) and, backward,
    the rows' gradients. Bytes to peers only: the bucket a worker keeps is not sent.

    Args:
        keys: int64 `[global_batch, slots]` row ids of one global batch (workers take equal slices).
        workers: n. dims: the embedding dim of each `lookup_sparse` call. key_bytes: bytes per key.

    Returns:
        {"workers", "collectives" (per step), "bytes" (sent by one worker to its peers per step),
        "pad" (P · n over the keys one worker holds: the padding of the buffer)}.

    Example:
        >>> exchange_volume(np.arange(8).reshape(4, 2), 2, dims=(4,))["bytes"]   # P=2: 2 keys + 2 rows + 2 grads
        80
    """
    keys = np.asarray(keys)
    if keys.ndim != 2 or workers < 1 or len(keys) % workers:
        raise ValueError(f"exchange_volume: keys must be [batch, slots] with batch divisible by workers={workers}, "
                         f"got shape {keys.shape}")
    n = workers
    calls = COLLECTIVES_PER_LOOKUP * len(dims) if n > 1 else 0
    if n == 1:
        return {"workers": 1, "collectives": 0, "bytes": 0, "pad": 1.0}
    local = keys.reshape(n, -1)                                      # [worker, its keys]
    counts = np.stack([np.bincount(k % n, minlength=n) for k in local])   # [src, owner]
    P = max(int(counts.max()), 1)
    per_key = key_bytes + sum(2 * 4 * d for d in dims) / len(dims)     # key + row + gradient, per call
    sent = (n - 1) * P * per_key * len(dims)
    return {"workers": n, "collectives": calls, "bytes": int(round(sent)), "pad": P * n / local.shape[1]}


def fit_link(small_ms, big_ms, big_bytes: int, small_bytes: int = 4) -> dict:
    """Fixed cost per collective and bandwidth from two all-to-all probes of different sizes.

    Args:
        small_ms, big_ms: repeated timings (ms) of an all-to-all sending `small_bytes` and
            `big_bytes` to each peer.

    Returns:
        {"alpha_ms" (fixed cost of one call: the small probe's median), "ms_per_mb" (the big
        probe's extra time per MB sent), "gb_per_s", "resolved"}. When the two probes'
        interquartile ranges overlap, the bytes' cost is within the noise: "resolved" is False
        and ms_per_mb is an upper bound (the big probe's 75th percentile minus the small one's
        25th), so that a prediction errs towards a slower link.

    Example:
        >>> round(fit_link([1.0], [3.0], big_bytes=2_000_004)["ms_per_mb"], 3)
        1.0
    """
    if big_bytes <= small_bytes:
        raise ValueError(f"fit_link: big_bytes={big_bytes} must exceed small_bytes={small_bytes}")
    s, b = spread(small_ms), spread(big_ms)
    mb = (big_bytes - small_bytes) / 1e6
    resolved = b["q25"] > s["q75"] or (b["n"] == 1 and s["n"] == 1 and b["median"] > s["median"])
    extra = b["median"] - s["median"] if resolved else b["q75"] - s["q25"]
    per_mb = max(extra, 1e-6) / mb
    return {"alpha_ms": s["median"], "ms_per_mb": per_mb, "gb_per_s": 1.0 / per_mb, "resolved": bool(resolved)}


def explain_exchange(link: dict, volume: dict, exchange_ms) -> dict:
    """The model's exchange (calls · alpha + bytes / bandwidth) against the measured one.

    Args:
        link: `fit_link`'s result. volume: `exchange_volume`'s for the measured run.
        exchange_ms: repeated timings (ms) of the exchange.

    Returns:
        {"fixed_ms", "bytes_ms", "predicted_ms", "measured" (a `spread`), "residual_ms"
        (measured median - predicted), "noise_ms" (half the interquartile range)}.

    Example:
        >>> r = explain_exchange({"alpha_ms": 1, "ms_per_mb": 2}, {"collectives": 8, "bytes": 500_000}, [10, 10, 10])
        >>> r["predicted_ms"], r["residual_ms"]
        (9.0, 1.0)
    """
    m = spread(exchange_ms)
    fixed = volume["collectives"] * link["alpha_ms"]
    by = volume["bytes"] / 1e6 * link["ms_per_mb"]
    return {"fixed_ms": fixed, "bytes_ms": by, "predicted_ms": fixed + by, "measured": m,
            "residual_ms": m["median"] - (fixed + by), "noise_ms": (m["q75"] - m["q25"]) / 2}


def deepfm_dense_bytes(dim: int = 8, hidden=(64, 32), slots: int = 26, dense: int = 13) -> int:
    """Bytes of `sok_demo`'s dense variables (MLP and the dense features' linear term): what the
    all-reduce of the dense gradients moves each step.

    Example:
        >>> deepfm_dense_bytes()
        65336
    """
    width, n = slots * dim + dense, 0
    for h in tuple(hidden) + (1,):
        n += width * h + h
        width = h
    return 4 * (n + dense)


def predict_step(compute_ms: float, workers: int, volume: dict, alpha_ms: float, ms_per_mb: float,
                 dense_bytes: int = 0, extra_ms: float = 0.0) -> dict:
    """The step on `workers` workers, each with its own cores, at the same global batch:

        step(n) = compute / n + (collectives + 2) · alpha + (bytes(n) + 2 (n-1)/n · dense_bytes) / bandwidth + extra

    the 2 extra collectives being the all-reduces of the dense gradients (a ring moves
    2 (n-1)/n of their bytes) and of the loss.

    Args:
        compute_ms: one worker's step on the whole global batch (no collectives).
        volume: `exchange_volume(keys, workers)`. alpha_ms, ms_per_mb: the link (`fit_link`).
        dense_bytes: the dense gradients' bytes (`deepfm_dense_bytes`). extra_ms: a fixed cost
            added when workers > 1 (e.g. a measured residual).

    Returns:
        {"compute_ms", "collectives_ms" (calls · alpha), "bytes_ms", "exchange_ms" (the two, plus
        extra_ms), "step_ms"}.

    Example:
        >>> predict_step(20.0, 2, {"collectives": 8, "bytes": 500_000}, 1.0, 2.0)["step_ms"]
        21.0
    """
    if workers < 1:
        raise ValueError(f"predict_step: workers must be >= 1, got {workers}")
    compute = compute_ms / workers
    if workers == 1:
        return {"compute_ms": compute, "collectives_ms": 0.0, "bytes_ms": 0.0, "exchange_ms": 0.0, "step_ms": compute}
    calls = (volume["collectives"] + 2) * alpha_ms
    by = (volume["bytes"] + 2 * (workers - 1) / workers * dense_bytes) / 1e6 * ms_per_mb
    ex = calls + by + extra_ms
    return {"compute_ms": compute, "collectives_ms": calls, "bytes_ms": by, "exchange_ms": ex, "step_ms": compute + ex}


def shard_bytes(rows: int, dim: int, workers: int, slots: int = 1, itemsize: int = 4) -> list[int]:
    """Bytes each worker holds of a distributed table (row i on rank i % n) and its optimizer slots.

    Args:
        rows, dim: the global table. workers: n. slots: optimizer state tables of the same shape
            (Adagrad: 1).

    Returns:
        one byte count per rank.

    Example:
        >>> shard_bytes(17, 3, 2, slots=0)
        [108, 96]
    """
    if rows < 0 or dim < 1 or workers < 1:
        raise ValueError(f"shard_bytes: rows={rows}, dim={dim}, workers={workers} must be >= 0, >= 1, >= 1")
    return [((rows - r + workers - 1) // workers) * dim * itemsize * (1 + slots) for r in range(workers)]


def _rss_mib(field: str = "VmRSS") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(rows: int, dim: int, out=None) -> dict:
    """This worker's memory for a distributed table of `rows x dim` trained by Adagrad (collective).

    Creates the table from an initializer (each worker builds only its own shard), runs one
    lookup and Adagrad update touching every worker's rows (the update creates the
    accumulator), and reads this process's resident memory before and after.

    Args:
        rows, dim: the global table. out: rank 0 writes the result of every rank here (JSON).

    Returns:
        {"rank", "workers", "shard_bytes" (table + accumulator), "rss_before_mib",
        "rss_growth_mib", "peak_rss_mib"} of this worker; rank 0 also gets "ranks" (every rank's).
    """
    import json
    from pathlib import Path

    from .._tfstart import import_tensorflow
    tf = import_tensorflow()
    import embedlab.optimizers as eo
    import embedlab.sok as sok
    from ..sok import exchange

    ctx = sok.init()
    before = _rss_mib()
    table = sok.Variable(tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=0), shape=[rows, dim], name="big")
    opt = sok.OptimizerWrapper(eo.Adagrad(learning_rate=0.05))
    ids = tf.ragged.constant([[r for r in range(ctx.world_size)]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse([table], [ids], combiners=["sum"])[0])
    opt.apply_gradients(zip(tape.gradient(loss, [table]), [table]))
    mine = int(table.shape[0]) * dim * 4 * (1 + len(opt.slots(table)))
    res = {"rank": ctx.rank, "workers": ctx.world_size, "shard_bytes": mine, "rss_before_mib": before,
           "rss_growth_mib": _rss_mib() - before, "peak_rss_mib": _rss_mib("VmHWM")}
    vals = [res["shard_bytes"], res["rss_before_mib"], res["rss_growth_mib"], res["peak_rss_mib"]]
    every = exchange.all_gather(tf.constant(vals, tf.float64)).numpy().reshape(ctx.world_size, -1)
    if ctx.rank == 0:
        res["ranks"] = [{"rank": r, "shard_bytes": int(v[0]), "rss_before_mib": float(v[1]),
                         "rss_growth_mib": float(v[2]), "peak_rss_mib": float(v[3])} for r, v in enumerate(every)]
        if out:
            Path(out).write_text(json.dumps(res))
    return res


def main():
    import argparse
    ap = argparse.ArgumentParser(description="memory of one distributed table per worker (notebook 04)")
    ap.add_argument("--rows", type=int, required=True)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--out", required=True, help="JSON written by rank 0")
    a = ap.parse_args()
    memory_probe(a.rows, a.dim, a.out)


if __name__ == "__main__":
    main()


def step_model(one: dict, two: dict, keys, links: dict, workers=(1, 2, 4, 8)) -> dict:
    """Notebook 04's cost model, fitted from a 1-worker and a profiled 2-worker run of `sok_demo.train`.

    Args:
        one, two: the runs' results (`two` with `profile=True`).
        keys: int64 `[global_batch, 26]` rows of one global batch, as the step routes them.
        links: name -> (alpha_ms, ms_per_mb) or None for the link fitted from `two`'s probes.
        workers: the worker counts to predict.

    Returns:
        {"link" (fitted), "volume" (2 workers), "exchange" (`explain_exchange`), "step1" / "step2"
        (`spread`s of the measured steps), "model2" (`predict_step` for 2 workers on the fitted
        link), "pred" ({link name: [predict_step per worker count]}), "workers", "lines" (the
        reading: the fit, the 2-worker residual against the noise and, when larger, its measured
        pieces; the prediction table)}.
    """
    S, parts = two["breakdown_samples_ms"], two["breakdown_ms"]
    link = fit_link(S["probe small"], S["probe big"], two["probe_bytes"]["big"], two["probe_bytes"]["small"])
    dense_bytes = deepfm_dense_bytes()
    vol2 = exchange_volume(keys, 2)
    ex = explain_exchange(link, vol2, S["exchange"])
    step1, step2 = spread(one["step_samples_ms"]), spread(two["step_samples_ms"])
    p2 = predict_step(step1["median"], 2, vol2, link["alpha_ms"], link["ms_per_mb"], dense_bytes)
    lines = [f"Link fitted from the probes: α = {link['alpha_ms']:.2f} ms per collective, "
             + (f"{link['gb_per_s']:.2f} GB/s." if link["resolved"] else
                f"at least {link['gb_per_s']:.2f} GB/s: the large probe is within the small one's noise, so the bytes' "
                "cost is below what this run resolves, and the model uses this bound."),
             f"On 2 workers a worker sends {vol2['bytes'] / 1e6:.2f} MB of keys, rows and gradients per step (its buffers "
             f"hold {vol2['pad']:.2f}x its keys: padding to the largest bucket), and {dense_bytes / 1e3:.0f} kB of dense "
             "gradients."]
    res = step2["median"] - p2["step_ms"]
    noise = (step2["q75"] - step2["q25"]) / 2
    lines.append(f"Model, 2 workers: {p2['compute_ms']:.1f} ms of compute (half the 1-worker step) + "
                 f"{p2['collectives_ms']:.1f} ms for {vol2['collectives'] + 2} collectives + {p2['bytes_ms']:.1f} ms of "
                 f"bytes = {p2['step_ms']:.1f} ms. Measured: {step2['median']:.1f} ms (interquartile "
                 f"{step2['q25']:.1f}-{step2['q75']:.1f}). Residual {res:+.1f} ms.")
    compute2 = parts["lookup"] + parts["dense"] + parts["embedding update"]
    extra = compute2 - p2["compute_ms"]
    if abs(res) <= noise:
        lines.append(f"The residual is within the measured step's noise (±{noise:.1f} ms, half its interquartile "
                     "range): to that precision, half the compute plus the collectives' fixed cost and bytes account "
                     "for the 2-worker step.")
    else:
        lines.append(f"The measured step is {'above' if res > 0 else 'below'} the model by more than its noise "
                     f"(±{noise:.1f} ms, half its interquartile range). Two measured pieces of the difference:")
        lines.append(f"  compute: the 2-worker run's lookup, dense part and embedding update, each timed alone, take "
                     f"{compute2:.1f} ms where the model gives {p2['compute_ms']:.1f} ({extra:+.1f} ms). "
                     + ("The two workers share this machine's cores, and other work runs on them, so a worker's "
                        "compute does not halve; each part timed alone also pays its own call." if extra > 0 else
                        "The workers' compute halved, or better."))
        lines.append(f"  exchange: measured {ex['measured']['median']:.1f} ms against {ex['predicted_ms']:.1f} ms for "
                     f"its {vol2['collectives']} collectives and bytes ({ex['residual_ms']:+.1f} ms, noise "
                     f"±{ex['noise_ms']:.1f}). "
                     + ("Beyond the collectives it runs the routing kernels (count and scatter of the keys, per call), "
                        "the owner's lookup into the received buffer and the stitching of rows, and each collective "
                        "waits for the slower worker." if ex["residual_ms"] > ex["noise_ms"] else
                        "It took less than its collectives cost one by one: the two `lookup_sparse` calls are "
                        "independent, so the step's graph can run their collectives side by side, while each probe "
                        "pays a call and a meeting of the workers alone." if ex["residual_ms"] < -ex["noise_ms"] else
                        "Within its noise, the collectives' fixed cost and bytes account for it."))
        lines.append(f"  together {extra + ex['residual_ms']:+.1f} ms of the {res:+.1f} ms; the pieces are timed alone "
                     "and the step overlaps some of them, so they need not add up to the residual.")
    resolved = {name: (link["alpha_ms"], link["ms_per_mb"]) if v is None else v for name, v in links.items()}
    pred = {name: [predict_step(step1["median"], n, exchange_volume(keys, n), a, m, dense_bytes) for n in workers]
            for name, (a, m) in resolved.items()}
    lines.append("")
    lines.append(f"{'predicted step (ms), a worker per machine':46s}"
                 + "".join(f"{n:>3d} worker{'s' if n > 1 else ' '}" for n in workers))
    for name, ps in pred.items():
        lines.append(f"{name:46s}" + "".join(f"{p['step_ms']:11.2f}" for p in ps))
    for name, ps in pred.items():
        wins = [n for n, p in zip(workers[1:], ps[1:]) if p["step_ms"] < step1["median"]]
        if wins:
            lines.append(f"{name}: the model's step beats one worker's from {wins[0]} workers on "
                         f"({ps[list(workers).index(wins[0])]['step_ms']:.1f} ms against {step1['median']:.1f}).")
        else:
            lines.append(f"{name}: no step up to {workers[-1]} workers beats one worker's "
                         f"({min(p['step_ms'] for p in ps[1:]):.1f} ms at best, against {step1['median']:.1f}): the "
                         f"collectives, {ps[1]['exchange_ms']:.1f} ms a step on 2 workers, cost more than the compute "
                         "that sharding saves.")
    return {"link": link, "volume": vol2, "exchange": ex, "step1": step1, "step2": step2, "model2": p2, "pred": pred,
            "workers": tuple(workers), "lines": lines}
