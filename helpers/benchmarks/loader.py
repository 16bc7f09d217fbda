"""Benchmark: ParquetLoader vs TensorFlow's own input pipelines, Criteo schema, one run.

Measures, on the same generated data and in the same process:

1. ETL: `criteo.generate` and `criteo.preprocess` (TSV -> parquet) rows/s;
2. `ParquetLoader`: parquet on disk -> shuffled batches of TF tensors, rows/s;
3. TensorFlow item-by-item: `tf.data.Dataset.from_tensor_slices(columns)` (per-row elements,
   columns already in memory), `.batch()`, `.prefetch()` - with and without a per-row shuffle;
4. TensorFlow over TFRecord: `TFRecordDataset -> batch -> map(parse_example) -> prefetch`;
5. peak resident memory of a loader epoch (fresh subprocesses) on a dataset 2x and 8x the
   shuffle buffer, against the loader's stated bound.

Prints a table and writes JSON (default `docs/benchmarks/results/loader_<machine>_<date>.json`).

    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/loader.py            # 2M rows
    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/loader.py --rows 400000 --quick
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
try:  # the installed package (make setup); else the source tree next to this script
    import embedlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent))

from embedlab import config  # noqa: E402
from embedlab.data import ParquetLoader, criteo, formats, resident_set  # noqa: E402

BYTES_PER_ROW = 4 + 13 * 4 + 28 * 8   # label + I1..I13 float32 + C1..C26 + 2 crosses int64


def _epoch_rate(make_iter):
    """rows/s and rows of one full pass."""
    t0 = time.perf_counter()
    rows = 0
    for _, y in make_iter():
        rows += int(y.shape[0])
    return rows / (time.perf_counter() - t0), rows


def _time_interleaved(pipelines, repeats):
    """Median rows/s per pipeline over `repeats` rounds; each round runs every pipeline once,
    so slow phases of a noisy machine hit all pipelines alike."""
    rates = {k: [] for k in pipelines}
    rows = {}
    for r in range(repeats):
        for name, make in pipelines.items():
            rate, rows[name] = _epoch_rate(make)
            rates[name].append(rate)
            print(f"  round {r + 1}/{repeats} {name:16s} {rate:12,.0f} rows/s", flush=True)
    return {k: statistics.median(v) for k, v in rates.items()}, rates, rows


def _memory_child(path, batch, buffer_rows):
    """One loader epoch in a fresh interpreter (embedlab.data.resident_set.peak_rss); RSS in MiB.
    `base` is the process after importing the loader (Keras and TensorFlow), `peak` its VmHWM."""
    rows, mem = resident_set.peak_rss(resident_set.loader_epoch, str(path), batch, buffer_rows=buffer_rows,
                                      seed=0, preload=("embedlab.data.loader",))
    return dict(rows=rows, base=mem.base_mib, peak=mem.peak_mib)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of generated Criteo data")
    ap.add_argument("--batch-size", type=int, default=65_536)
    ap.add_argument("--buffer-rows", type=int, default=262_144)
    ap.add_argument("--baseline-rows", type=int, default=500_000,
                    help="rows fed to the (slower) TensorFlow baselines")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON path (default results/loader_<machine>_<date>.json)")
    ap.add_argument("--quick", action="store_true", help="skip the memory subprocesses")
    ap.add_argument("--memory-bound-mib", type=float, default=450.0,
                    help="the stated bound checked: RSS the loader may add (default settings)")
    args = ap.parse_args(argv)

    import psutil
    import embedlab
    tf = embedlab.import_tensorflow()

    root = args.data_dir or config.data_path("bench_loader", "x").parent
    root.mkdir(parents=True, exist_ok=True)
    B, N = args.batch_size, args.rows
    res = {"machine": {"cpu": _results.cpu_name(),
                       "cores": os.cpu_count(), "memory_gib": round(
                           psutil.virtual_memory().total / 2**30, 1),
                       "python": platform.python_version(), "tensorflow": tf.__version__,
                       "numpy": np.__version__},
           "rows": N, "batch_size": B, "buffer_rows": args.buffer_rows}

    # 1. ETL ---------------------------------------------------------------------------
    tsv = root / f"criteo_{N}.txt"
    t0 = time.perf_counter()
    criteo.generate(tsv, rows=N, seed=12345, progress=False)
    res["generate_rows_per_s"] = N / (time.perf_counter() - t0)
    pq_dir = root / f"parquet_{N}"
    etl = criteo.preprocess(tsv, pq_dir, split=None, rows_per_file=max(N // 8, 1),
                            row_group_rows=65_536, progress=False)
    res["etl_rows_per_s"] = etl.rows_per_second
    res["tsv_bytes"] = tsv.stat().st_size
    files = etl.files["train"]
    print(f"generate: {res['generate_rows_per_s']:,.0f} rows/s; preprocess (2 passes, TSV -> "
          f"parquet): {etl.rows_per_second:,.0f} rows/s; {len(files)} parquet files")

    # 2-4. The pipelines -----------------------------------------------------------------
    loader = ParquetLoader(pq_dir / "train", B, buffer_rows=args.buffer_rows, seed=0)
    loader_ns = ParquetLoader(pq_dir / "train", B, buffer_rows=args.buffer_rows, shuffle=False)
    ds_wrapped = loader.to_tf_dataset()

    # TensorFlow item-by-item (columns already in memory: the most favourable case).
    M = min(args.baseline_rows, N)
    data = formats.read_parquet(files)
    cols = {k: v[:M] for k, v in data.items()}
    del data
    dense = np.stack([cols.pop(c) for c in criteo.INT_COLUMNS], axis=1)
    label = cols.pop(criteo.LABEL).reshape(-1, 1)
    feats = dict(cols, dense=dense)
    items = tf.data.Dataset.from_tensor_slices((feats, label))
    ds_items = items.batch(B).prefetch(tf.data.AUTOTUNE)
    ds_items_shuf = items.shuffle(args.buffer_rows, seed=0).batch(B).prefetch(tf.data.AUTOTUNE)

    # TFRecord + parse_example.
    tfr = root / f"criteo_{M}.tfrecord"
    if not tfr.exists():
        t0 = time.perf_counter()
        formats.write_tfrecord(tfr, dict(label=label[:, 0], **{c: dense[:, j] for j, c in
                                                              enumerate(criteo.INT_COLUMNS)},
                                         **cols))
        res["tfrecord_write_rows_per_s"] = M / (time.perf_counter() - t0)
    columns = ([(criteo.LABEL, "float")] + [(c, "float") for c in criteo.INT_COLUMNS]
               + [(c, "int") for c in etl.columns])
    ds_tfr = formats.tfrecord_dataset(tfr, B, columns=columns)
    ds_tfr_shuf = formats.tfrecord_dataset(tfr, B, columns=columns,
                                           shuffle_buffer=args.buffer_rows, seed=0)
    pipelines = {"loader": lambda: iter(loader), "loader_noshuffle": lambda: iter(loader_ns),
                 "loader_tfdata": lambda: iter(ds_wrapped), "items": lambda: iter(ds_items),
                 "items_shuffle": lambda: iter(ds_items_shuf), "tfrecord": lambda: iter(ds_tfr),
                 "tfrecord_shuffle": lambda: iter(ds_tfr_shuf)}
    print("timing (interleaved rounds):")
    med, all_rates, rows = _time_interleaved(pipelines, args.repeats)
    assert rows["loader"] == N and rows["items"] == M, rows
    for k, v in med.items():
        res[f"{k}_rows_per_s"] = v
    res["all_rates"] = all_rates
    res["baseline_rows"] = M

    # 5. Memory ------------------------------------------------------------------------
    rg = 65_536
    # The loader's documented bound (prefetch=2): buffer + permuted copy, a row group stored
    # and one decoded ahead, 4 batches in flight.
    res["memory_bound_mib"] = ((2 * (args.buffer_rows + rg) + 2 * rg + 4 * B)
                               * BYTES_PER_ROW) / 2**20
    if not args.quick:
        small = sorted((pq_dir / "train").glob("*.parquet"))[:2]
        small_dir = root / f"parquet_{N}_first2"
        small_dir.mkdir(exist_ok=True)
        for f in small:
            link = small_dir / f.name
            if not link.exists():
                link.symlink_to(f)
        mem = {}
        for name, path in (("small", small_dir), ("full", pq_dir / "train")):
            mem[name] = _memory_child(path, B, args.buffer_rows)
            mem[name]["rows_over_buffer"] = mem[name]["rows"] / args.buffer_rows
        res["memory"] = mem

    # Table ------------------------------------------------------------------------------
    L = res["loader_rows_per_s"]
    rows_t = [
        ("ParquetLoader (shuffled, TF tensors)", L),
        ("ParquetLoader, no shuffle", res["loader_noshuffle_rows_per_s"]),
        ("ParquetLoader via to_tf_dataset()", res["loader_tfdata_rows_per_s"]),
        ("tf.data item-by-item (from_tensor_slices -> batch)", res["items_rows_per_s"]),
        ("tf.data item-by-item + shuffle", res["items_shuffle_rows_per_s"]),
        ("tf.data TFRecord -> batch -> parse_example", res["tfrecord_rows_per_s"]),
        ("tf.data TFRecord + shuffle", res["tfrecord_shuffle_rows_per_s"]),
    ]
    print(f"\nCriteo schema (label, 13 dense, 28 categorical), batch {B:,}, "
          f"{os.cpu_count()} cores, {N:,} rows (baselines {M:,})")
    print(f"{'pipeline':55s} {'rows/s':>12s} {'loader is':>10s}")
    for name, r in rows_t:
        print(f"{name:55s} {r:12,.0f} {L / r:9.1f}x")
    res["ratio_vs_items"] = L / res["items_rows_per_s"]
    res["ratio_vs_items_shuffle"] = L / res["items_shuffle_rows_per_s"]
    res["ratio_vs_tfrecord"] = L / res["tfrecord_rows_per_s"]
    res["ratio_vs_tfrecord_shuffle"] = L / res["tfrecord_shuffle_rows_per_s"]
    if "memory" in res:
        print(f"\nPeak RSS of one loader epoch (fresh process; TF imported before 'base'); "
              f"loader arrays by formula {res['memory_bound_mib']:.0f} MiB, stated bound "
              f"{args.memory_bound_mib:.0f} MiB:")
        for name, m in res["memory"].items():
            print(f"  {m['rows']:>10,} rows ({m['rows_over_buffer']:.1f}x buffer): base "
                  f"{m['base']:.0f} MiB, peak {m['peak']:.0f} MiB, loader "
                  f"{m['peak'] - m['base']:.0f} MiB")
    if "memory" in res:
        res["memory_stated_bound_mib"] = args.memory_bound_mib
        worst = max(m["peak"] - m["base"] for m in res["memory"].values())
        print(f"largest loader share {worst:.0f} MiB (stated bound {args.memory_bound_mib:.0f} MiB)")
    print(f"\nParquetLoader: {L:,.0f} rows/s; {res['ratio_vs_items']:.1f}x item-by-item, "
          f"{res['ratio_vs_tfrecord']:.1f}x TFRecord + parse_example")
    if args.out is None:
        args.out = _results.default_out("loader", _results.cpu_machine())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
