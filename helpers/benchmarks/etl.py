"""Benchmark: the Criteo ETL single-process, on Dask with 1 and 2 workers, and NVTabular's CPU workflow.

One generated input (default 4M rows, Kaggle TSV layout), the same recipe everywhere: every
line is training data (`split=None`), categoricals with a frequency threshold of 6 (missing and
rare -> 0), the crosses C1xC2 and C3xC4 encoded as categories too, dense features: missing -> 0,
clip at 0, log(x + 1), min-max to [0, 1]. Output parquet.

- `single`: `criteo.preprocess(src, dst)` in one process;
- `dask1`, `dask2`: `criteo.preprocess(src, dst, client=...)` on a LocalCluster of 1 / 2
  single-threaded worker processes (started before the clock starts);
- `nvt`: NVTabular 23.08 (`Categorify(freq_threshold=6)`, the crosses as
  `Categorify(encode_type="combo")`, `FillMissing`, `Clip`, `LogOp`, `NormalizeMinMax`) on a
  LocalCluster of 2 workers, run by the Python of a separate environment (`--nvt-python`),
  because NVTabular pins its own pandas / Dask / NumPy.

Each configuration runs in a fresh subprocess; the parent samples the resident memory of that
process and all its descendants (the Dask workers included) every 0.1 s, and reports the peak
of the sum. The Dask outputs are checked equal to the single-process output (per split and
column, a hash over the rows in order).

Configurations can run in separate invocations (each appends to the same JSON), so that every
call stays short; `--report` prints the table, the ratios, the predicted 1 TB times and draws
rows/s against workers (PNG next to the JSON).

    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/etl.py --configs single,dask1,dask2
    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/etl.py --configs nvt \\
        --nvt-python /tmp/nvt-venv/bin/python --json results/etl_....json
    PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/etl.py --report --json results/etl_....json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402

FREQ_THRESHOLD = 6
CHUNK_BYTES = 32 << 20
# The Criteo 1TB click logs: 24 days, 4,373,472,329 lines (Criteo's published count).
TB_LINES = 4_373_472_329
NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


# ----------------------------------------------------------------------------- workers

def _embedlab():
    try:
        import embedlab  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(HERE.parent))


def run_embedlab(config: str, src: str, dst: str) -> dict:
    _embedlab()
    from embedlab.data import criteo
    from embedlab.data.criteo import etl_dask
    kw = dict(split=None, freq_threshold=FREQ_THRESHOLD, chunk_bytes=CHUNK_BYTES, progress=False)
    if config == "single":
        t0 = time.perf_counter()
        res = criteo.preprocess(src, dst, **kw)
        return {"seconds": time.perf_counter() - t0, "rows": sum(res.rows.values())}
    n = int(config[len("dask"):])
    with etl_dask.local_client(n) as client:
        t0 = time.perf_counter()
        res = criteo.preprocess(src, dst, client=client, **kw)
        seconds = time.perf_counter() - t0
        peak = etl_dask.worker_peak_rss(client)
    meta = json.loads((Path(dst) / "metadata.json").read_text())
    return {"seconds": seconds, "rows": sum(res.rows.values()),
            "worker_peak_rss": sorted(peak.values()), "dask": meta["dask"]}


def run_nvt(src: str, dst: str) -> dict:
    import warnings
    warnings.simplefilter("ignore")
    import logging
    import nvtabular as nvt
    from dask.distributed import Client, LocalCluster
    from nvtabular import ops
    with LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        t0 = time.perf_counter()
        dtypes = {"label": "int8", **{f"I{i}": "float64" for i in range(1, 14)},
                  **{f"C{i}": "str" for i in range(1, 27)}}
        ds = nvt.Dataset(src, engine="csv", sep="\t", names=NAMES, dtype=dtypes, cpu=True,
                         part_size="64MB")
        dense = ([f"I{i}" for i in range(1, 14)] >> ops.FillMissing(fill_val=0)
                 >> ops.Clip(min_value=0) >> ops.LogOp() >> ops.NormalizeMinMax())
        # Categorify writes its vocabularies under out_path (the working directory by default).
        vocab = str(Path(dst).parent / "nvt_categories")
        cats = [f"C{i}" for i in range(1, 27)] >> ops.Categorify(freq_threshold=FREQ_THRESHOLD, out_path=vocab)
        cross = [["C1", "C2"], ["C3", "C4"]] >> ops.Categorify(
            encode_type="combo", freq_threshold=FREQ_THRESHOLD, out_path=vocab)
        wf = nvt.Workflow(dense + cats + cross + ["label"], client=client)
        wf.fit(ds)
        wf.transform(ds).to_parquet(dst, out_files_per_proc=1)
        seconds = time.perf_counter() - t0
        import pyarrow.parquet as pq
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in Path(dst).glob("*.parquet"))
    import dask
    import distributed
    import numpy
    import pandas
    import pyarrow
    return {"seconds": seconds, "rows": rows,
            "versions": {"nvtabular": nvt.__version__, "dask": dask.__version__,
                         "distributed": distributed.__version__, "pandas": pandas.__version__,
                         "numpy": numpy.__version__, "pyarrow": pyarrow.__version__}}


# ----------------------------------------------------------------------------- parent

def _tree_rss(proc) -> int:
    import psutil
    total = 0
    try:
        procs = [proc] + proc.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def measure(cmd: list[str]) -> dict:
    """Run cmd (prints one JSON line last); peak RSS of its process tree, sampled every 0.1 s."""
    import psutil
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(p.pid)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc))
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    out, err = p.communicate()
    done.set()
    t.join()
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed ({p.returncode}):\n{err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_rss_tree"] = peak[0]
    return res


def _column_digests(folder: Path) -> dict:
    """{split: {column: sha1 over the column's values, parts in name order}}."""
    import hashlib
    import pyarrow.parquet as pq
    out = {}
    for split_dir in sorted(p for p in folder.iterdir() if p.is_dir()):
        digests = {}
        for f in sorted(split_dir.glob("*.parquet")):
            t = pq.read_table(f)
            for name in t.column_names:
                h = digests.setdefault(name, hashlib.sha1())
                h.update(t.column(name).combine_chunks().to_numpy(zero_copy_only=False).tobytes())
        out[split_dir.name] = {k: v.hexdigest() for k, v in digests.items()}
    return out


def _input(rows: int, data_dir: Path) -> Path:
    _embedlab()
    from embedlab.data import criteo
    p = data_dir / f"criteo_{rows}rows_seed0.txt"
    if not p.exists():
        criteo.generate(p, rows=rows, seed=0, progress=False)
    return p


def report(results: dict, out: Path):
    runs = results["runs"]
    rows = results["rows"]
    print(f"\nCriteo ETL, {rows:,} generated rows ({results['input_bytes'] / 1e6:.0f} MB TSV), "
          f"{results['machine']} ({results['cores']} cores)\n")
    print(f"{'config':<8} {'seconds':>9} {'rows/s':>11} {'peak RSS (tree)':>16}  notes")
    for name in ("single", "dask1", "dask2", "nvt"):
        r = runs.get(name)
        if r is None:
            continue
        note = ""
        if "worker_peak_rss" in r:
            note = "workers " + ", ".join(f"{b / 2**20:,.0f}" for b in r["worker_peak_rss"]) + " MiB"
        if "identical_to_single" in r:
            note += f"; identical to single: {r['identical_to_single']}"
        print(f"{name:<8} {r['seconds']:>9.1f} {r['rows_per_s']:>11,.0f} "
              f"{r['peak_rss_tree'] / 2**20:>12,.0f} MiB  {note}")
    ratios = {}
    if "dask1" in runs and "dask2" in runs:
        ratios["dask2_over_dask1"] = runs["dask2"]["rows_per_s"] / runs["dask1"]["rows_per_s"]
    if "dask1" in runs and "single" in runs:
        ratios["dask1_over_single"] = runs["dask1"]["rows_per_s"] / runs["single"]["rows_per_s"]
    if "nvt" in runs and "dask2" in runs:
        ratios["dask2_over_nvt"] = runs["dask2"]["rows_per_s"] / runs["nvt"]["rows_per_s"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    results["ratios"] = ratios
    if "dask2" in runs:
        d2 = runs["dask2"]
        # Per-core rate: 2 single-threaded workers on the 2 cores, every core busy, as on a
        # cluster of one worker per core. Carried to 32-core machines linearly (an assumption:
        # RESULTS.md says what it leaves out).
        per_core = d2["rows_per_s"] / 2
        ph = d2["dask"]["phase_seconds"]
        bytes_per_line = results["input_bytes"] / rows
        pred = {}
        print(f"\npredicted 1 TB ({TB_LINES:,} lines): {per_core:,.0f} rows/s per core (Dask, 2 "
              f"workers / 2); merge + vocabularies took {ph['merge_vocab']:.2f} s here")
        for machines in (1, 8, 64):
            s = TB_LINES / (per_core * machines * 32)
            read_gbs = 3 * bytes_per_line * TB_LINES / s / 1e9
            pred[machines] = {"seconds": s, "input_read_GB_per_s": read_gbs}
            print(f"  {machines:>2} x 32 cores: {s / 3600:6.2f} h of chunk work; the input is "
                  f"read 3 times: {read_gbs:,.1f} GB/s in total from shared storage")
        results["prediction_1tb"] = {"per_core_rows_per_s": per_core, "machines": pred}
        results["phases_dask2"] = ph
    out.write_text(json.dumps(results, indent=1))
    _plot(results, out.with_suffix(".png"))
    _plot(results, HERE / "etl.png")             # the plot RESULTS.md shows, beside it
    print(f"\nwrote {out}, {out.with_suffix('.png')} and {HERE / 'etl.png'}")


def _plot(results, png: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [n for n in (1, 2) if f"dask{n}" in runs]
    if xs:
        ys = [runs[f"dask{n}"]["rows_per_s"] for n in xs]
        ax.plot(xs, ys, "o-", label="EmbedLab on Dask (LocalCluster)")
        ax.plot(xs, [ys[0] * n for n in xs], ":", color="grey", label="linear from 1 worker")
    if "single" in runs:
        ax.axhline(runs["single"]["rows_per_s"], color="C2", ls="--",
                   label="EmbedLab single process")
    if "nvt" in runs:
        ax.plot([2], [runs["nvt"]["rows_per_s"]], "s", color="C3",
                label="NVTabular 23.08 CPU, 2 workers")
    ax.set_xticks([1, 2])
    ax.set_xlabel("Dask worker processes")
    ax.set_ylabel("rows / s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Criteo ETL, {results['rows'] / 1e6:.0f}M rows, {results['machine']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--configs", default="single,dask1,dask2,nvt")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get(
        "EMBEDLAB_DATA_DIR", HERE.parent.parent / "data" / "cache")) / "bench_etl")
    ap.add_argument("--nvt-python", default=os.environ.get("NVT_PYTHON", ""),
                    help="python of an environment with nvtabular 23.08 (the nvt config)")
    ap.add_argument("--json", type=Path, default=None, help="results file (appended to)")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--run", help=argparse.SUPPRESS)        # child: one configuration
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dst", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        res = run_nvt(a.src, a.dst) if a.run == "nvt" else run_embedlab(a.run, a.src, a.dst)
        print(json.dumps(res))
        return
    out = a.json or _results.default_out("etl", _results.cpu_machine())
    results = json.loads(out.read_text()) if out.exists() else {
        "machine": _results.cpu_machine(), "cpu": _results.cpu_name(), "cores": os.cpu_count(),
        "rows": a.rows, "runs": {}}
    if a.report:
        report(results, out)
        return
    if results["rows"] != a.rows:
        raise SystemExit(f"{out} holds a {results['rows']}-row run; use another --json")
    a.data_dir.mkdir(parents=True, exist_ok=True)
    src = _input(a.rows, a.data_dir)
    results["input_bytes"] = src.stat().st_size
    import shutil
    for config in [c for c in a.configs.split(",") if c]:
        dst = a.data_dir / f"out_{config}"
        shutil.rmtree(dst, ignore_errors=True)
        if config == "nvt":
            if not a.nvt_python:
                raise SystemExit("--nvt-python (or NVT_PYTHON) is needed for the nvt config")
            py = a.nvt_python
        else:
            py = sys.executable
        r = measure([py, __file__, "--run", config, "--src", str(src), "--dst", str(dst)])
        r["rows_per_s"] = a.rows / r["seconds"]
        if config.startswith("dask") and (a.data_dir / "out_single").exists():
            r["identical_to_single"] = (_column_digests(a.data_dir / "out_single")
                                        == _column_digests(dst))
        results["runs"][config] = r
        print(f"{config}: {r['seconds']:.1f} s, {r['rows_per_s']:,.0f} rows/s, peak "
              f"{r['peak_rss_tree'] / 2**20:,.0f} MiB" + (
                  f", identical to single: {r['identical_to_single']}"
                  if "identical_to_single" in r else ""), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1))
        if config != "single":
            shutil.rmtree(dst, ignore_errors=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
