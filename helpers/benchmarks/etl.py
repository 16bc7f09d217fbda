"""Benchmark: the Criteo ETL single-process, on Dask with 1 and 2 workers, and NVTabular's CPU workflow.

One generated input (default 4M rows, Kaggle TSV layout), the same recipe everywhere: every
line is training data (`split=None`), categoricals with a frequency threshold of 6 (missing and
rare -> 0), the crosses C1xC2 and C3xC4 encoded as categories too, dense features: missing -> 0,
clip at 0, log(x + 1), min-max to [0, 1]. Output parquet.

Strong scaling, the same resources per worker in every Dask configuration (`CONFIGS`):
- `single`: `criteo.preprocess(src, dst)` in one process, pyarrow's default thread pool (one
  thread per core: its CSV parser runs on both cores);
- `single_1core`: the same, pinned to one core (`os.sched_setaffinity`) with one pyarrow thread;
- `dask1`, `dask2`: `criteo.preprocess(src, dst, client=...)` on a LocalCluster of 1 / 2
  worker processes of one thread each, pyarrow's pool included (`local_client(n,
  cpu_threads=1)`), started before the clock starts; the task stream gives each kind of task's
  compute seconds and each worker's busy share, and the CPU seconds of every process are kept;
- `dask1_1core`: `dask1` with the whole cluster (client, scheduler, nanny, worker) on one core;
  `dask1_2threads`: one worker whose pyarrow pool has 2 threads (`local_client(1)`'s default);
- `bound`: no Dask: the chunk functions of each pass (count, pass 1, pass 2) over all chunks in
  1 plain process, then dealt over 2 processes run at once (one thread each), and two reference
  loads the same way (a pure Python loop; NumPy copies of 256 MiB arrays): what 2 cores give
  this work on this machine;
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

    for c in single single_1core dask1 dask2 bound; do
      PYTHONPATH=helpers .venv/bin/python helpers/benchmarks/etl.py --configs $c --json results/etl_....json
    done
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
CHUNK_BYTES = int(os.environ.get("ETL_BENCH_CHUNK_MIB", "32")) << 20     # --chunk-mib
# The Criteo 1TB click logs: 24 days, 4,373,472,329 lines (Criteo's published count).
TB_LINES = 4_373_472_329
NAMES = ["label"] + [f"I{i}" for i in range(1, 14)] + [f"C{i}" for i in range(1, 27)]


# ----------------------------------------------------------------------------- workers

def _embedlab():
    try:
        import embedlab  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(HERE.parent))


CONFIGS = {
    # name: (Dask workers or 0 for the single process, native threads per process, pinned to 1 core)
    "single": (0, None, False),             # pyarrow's default pool: one thread per core
    "single_1core": (0, 1, True),
    "dask1": (1, 1, False),                 # one thread per worker in every Dask configuration
    "dask2": (2, 1, False),
    "dask1_1core": (1, 1, True),            # the whole cluster (scheduler, client, worker) on 1 core
    "dask1_2threads": (1, 2, False),        # local_client(1)'s default: the worker gets both cores
}


def _task_summary(tasks, wall: float) -> dict:
    """Per task kind (count, pass1, merge, ...): tasks, compute seconds; per worker: busy share."""
    kinds, busy = {}, {}
    for t in tasks:
        key = t["key"] if isinstance(t["key"], str) else str(t["key"])
        kind = key.split("-")[1] if key.startswith("etl-") else key.split("-")[0]
        comp = sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "compute")
        xfer = sum(s["stop"] - s["start"] for s in t["startstops"] if s["action"] == "transfer")
        k = kinds.setdefault(kind, {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0})
        k["tasks"] += 1
        k["compute_s"] += comp
        k["transfer_s"] += xfer
        busy[t["worker"]] = busy.get(t["worker"], 0.0) + comp
    return {"kinds": kinds, "worker_busy_share": sorted(b / wall for b in busy.values())}


def run_embedlab(config: str, src: str, dst: str) -> dict:
    workers, threads, one_core = CONFIGS[config]
    if one_core:        # before anything starts: the workers and their threads inherit it
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    if threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    _embedlab()
    import pyarrow as pa
    if threads is not None:
        pa.set_cpu_count(threads)
    from embedlab.data import criteo
    from embedlab.data.criteo import etl_dask
    kw = dict(split=None, freq_threshold=FREQ_THRESHOLD, chunk_bytes=CHUNK_BYTES, progress=False)
    info = {"affinity": sorted(os.sched_getaffinity(0)), "pyarrow_cpu_count": pa.cpu_count()}
    if not workers:
        t0 = time.perf_counter()
        res = criteo.preprocess(src, dst, **kw)
        return {"seconds": time.perf_counter() - t0, "rows": sum(res.rows.values()), **info}
    import psutil
    from distributed import get_task_stream
    with etl_dask.local_client(workers, cpu_threads=threads) as client:
        info["worker_pyarrow_cpu_count"] = sorted(client.run(lambda: __import__(
            "pyarrow").cpu_count()).values())
        # CPU seconds of every process of the cluster over the run: this process (the client
        # and, in a LocalCluster, the scheduler), the nannies and the workers.
        me = psutil.Process()
        procs = {"client+scheduler": [me]}
        for p in me.children(recursive=True):
            role = "worker" if p.pid in set(client.run(os.getpid).values()) else "nanny/other"
            procs.setdefault(role, []).append(p)

        def cpu():
            return {k: sum(sum(p.cpu_times()[:2]) for p in v) for k, v in procs.items()}
        with get_task_stream(client) as ts:
            c0 = cpu()
            t0 = time.perf_counter()
            res = criteo.preprocess(src, dst, client=client, **kw)
            seconds = time.perf_counter() - t0
            c1 = cpu()
        peak = etl_dask.worker_peak_rss(client)
    meta = json.loads((Path(dst) / "metadata.json").read_text())
    return {"seconds": seconds, "rows": sum(res.rows.values()),
            "worker_peak_rss": sorted(peak.values()), "dask": meta["dask"],
            "tasks": _task_summary(ts.data, seconds),
            "cpu_seconds": {k: c1[k] - c0[k] for k in c0}, **info}


# ----------------------------------------------------------------------------- bound

def run_bound(src: str, dst: str) -> dict:
    """What 2 cores give this work without Dask: the chunk tasks of each pass run in 1, then in
    2 plain processes (one thread each, chunks dealt i::n), and two reference loads (a pure
    Python loop: the cores alone; a NumPy copy of 256 MiB arrays: memory bandwidth)."""
    _embedlab()
    import pickle
    import shutil
    from embedlab.data.criteo import etl_dask
    os.environ["OMP_NUM_THREADS"] = "1"
    work = Path(dst)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # Not timed: the vocabularies pass 2 needs, from the same chunk functions.
    _, chunks = etl_dask._plan(src, CHUNK_BYTES)
    stats = [etl_dask._stats_task(ch, 1, etl_dask._count_task(ch), 0, 1 << 62, True)
             for ch in chunks]
    vocab = etl_dask._vocab_task(etl_dask._merge_task(*stats), FREQ_THRESHOLD)
    (work / "vocab.pkl").write_bytes(pickle.dumps(vocab))
    out = {"chunks": len(chunks)}
    for job in ("spin", "memcpy", "count", "pass1", "pass2"):
        out[job] = {}
        for n in (1, 2):
            kids = [subprocess.Popen([sys.executable, __file__, "--run", "bound-child", "--src",
                                      src, "--dst", str(work), "--part", f"{i}/{n}/{job}"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                    for i in range(n)]
            for k in kids:                       # every child has imported and prepared
                assert k.stdout.readline().strip() == "ready"
            t0 = time.perf_counter()
            for k in kids:
                k.stdin.write("go\n")
                k.stdin.flush()
            own = [json.loads(k.stdout.readline()) for k in kids]
            wall = time.perf_counter() - t0
            for k in kids:
                k.wait()
            out[job][n] = {"wall": wall, "own_seconds": [o["seconds"] for o in own]}
        out[job]["speedup"] = out[job][1]["wall"] / out[job][2]["wall"]
    shutil.rmtree(work, ignore_errors=True)
    return {"seconds": 0.0, "rows": 0, "bound": out}


def run_bound_child(src: str, work: str, part: str):
    import pickle
    i, n, job = part.split("/")
    i, n = int(i), int(n)
    _embedlab()
    import numpy as np
    from fsspec.implementations.local import LocalFileSystem
    from embedlab.data.criteo import etl_dask
    _, chunks = etl_dask._plan(src, CHUNK_BYTES)
    mine = chunks[i::n]
    vocab = pickle.loads((Path(work) / "vocab.pkl").read_bytes())
    tmp = Path(work) / f"out_{i}_{n}_{job}"
    for sub in ("_work", "train", "val", "test"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    counts = [etl_dask._count_task(ch) for ch in mine] if job in ("pass1", "pass2") else []
    options = dict(normalize_dense=True, feature_cross=True, on_error="fail",
                   rows_per_file=2_000_000, row_group_rows=65_536)
    bounds = np.array([1, 1 << 62, 1 << 62, 1 << 62])
    a = np.ones(32 << 20)                  # 256 MiB
    b = np.empty_like(a)
    b[:] = a
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    if job == "spin":
        x = 0
        for k in range(20_000_000 // n):
            x += k
    elif job == "memcpy":
        for _ in range(40 // n):
            np.copyto(b, a)
    elif job == "count":
        for ch in mine:
            etl_dask._count_task(ch)
    elif job == "pass1":
        for ch, c in zip(mine, counts):
            etl_dask._stats_task(ch, 1, c, 0, 1 << 62, True)
    elif job == "pass2":
        for ch, c in zip(mine, counts):
            etl_dask._write_task(ch, 1, c, 0, bounds, vocab, options, LocalFileSystem(),
                                 str(tmp), 5)
    print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


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


LABELS = {
    "single": "single process (pyarrow: 2 threads)",
    "single_1core": "single process, 1 core, 1 thread",
    "dask1": "Dask, 1 worker (1 thread)",
    "dask2": "Dask, 2 workers (1 thread each)",
    "dask1_1core": "Dask, 1 worker, whole cluster on 1 core",
    "dask1_2threads": "Dask, 1 worker with 2 threads",
    "nvt": "NVTabular 23.08 CPU, 2 workers",
}


def report(results: dict, out: Path):
    runs = results["runs"]
    rows = results["rows"]
    print(f"\nCriteo ETL, {rows:,} generated rows ({results['input_bytes'] / 1e6:.0f} MB TSV), "
          f"{results['machine']} ({results['cores']} cores), chunks of "
          f"{results.get('chunk_bytes', 32 << 20) >> 20} MiB\n")
    print(f"{'config':<15} {'seconds':>8} {'rows/s':>10} {'peak RSS (tree)':>16}  notes")
    for name in LABELS:
        r = runs.get(name)
        if r is None:
            continue
        note = ""
        if "worker_peak_rss" in r:
            note = "workers " + ", ".join(f"{b / 2**20:,.0f}" for b in r["worker_peak_rss"]) + " MiB"
        if "identical_to_single" in r:
            note += f"; identical to single: {r['identical_to_single']}"
        if "tasks" in r:
            note += "; busy " + ", ".join(f"{b:.2f}" for b in r["tasks"]["worker_busy_share"])
            k = r["tasks"]["kinds"]
            note += "; task compute s: " + ", ".join(
                f"{n} {k[n]['compute_s']:.2f}" for n in ("count", "pass1", "pass2") if n in k)
        if "cpu_seconds" in r:
            note += "; CPU s: " + ", ".join(f"{n} {v:.1f}" for n, v in r["cpu_seconds"].items())
        print(f"{name:<15} {r['seconds']:>8.1f} {r['rows_per_s']:>10,.0f} "
              f"{r['peak_rss_tree'] / 2**20:>12,.0f} MiB  {note}")
    ratios = {}
    for a, b in (("dask2", "dask1"), ("dask1", "single_1core"), ("dask1", "single"),
                 ("dask2", "single"), ("dask2", "dask1_1core"), ("single", "single_1core"),
                 ("dask2", "nvt")):
        if a in runs and b in runs:
            ratios[f"{a}_over_{b}"] = runs[a]["rows_per_s"] / runs[b]["rows_per_s"]
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}x")
    results["ratios"] = ratios
    if "bound" in results:
        print("\nwithout Dask, 2 plain processes against 1 (wall seconds, speedup):")
        for job, v in results["bound"].items():
            if isinstance(v, dict):
                print(f"  {job:<7} {v['1']['wall']:6.2f} -> {v['2']['wall']:6.2f} s: "
                      f"{v['speedup']:.2f}x")
    if "dask2" in runs:
        d2 = runs["dask2"]
        # Per-core rates: 2 single-threaded workers on the 2 cores (every core busy, as on a
        # cluster of one worker per core), and 1 worker alone (one core, the other one idle: an
        # upper bound). Carried to 32-core machines linearly (docs/benchmarks/index.md says what that leaves out).
        per_core = {"every core busy (dask2 / 2)": d2["rows_per_s"] / 2}
        if "dask1" in runs:
            per_core["one core alone (dask1)"] = runs["dask1"]["rows_per_s"]
        ph = d2["dask"]["phase_seconds"]
        bytes_per_line = results["input_bytes"] / rows
        pred = {}
        print(f"\npredicted 1 TB ({TB_LINES:,} lines); merge + vocabularies took "
              f"{ph['merge_vocab']:.2f} s here")
        for label, rate in per_core.items():
            pred[label] = {"per_core_rows_per_s": rate, "machines": {}}
            for machines in (1, 8, 64):
                sec = TB_LINES / (rate * machines * 32)
                read_gbs = 3 * bytes_per_line * TB_LINES / sec / 1e9
                pred[label]["machines"][machines] = {"seconds": sec,
                                                     "input_read_GB_per_s": read_gbs}
                print(f"  {label}, {rate:,.0f} rows/s per core, {machines:>2} x 32 cores: "
                      f"{sec / 60:7.1f} min of chunk work; reading the input 3 times: "
                      f"{read_gbs:,.1f} GB/s")
        results["prediction_1tb"] = pred
        results["phases_dask2"] = ph
    out.write_text(json.dumps(results, indent=1))
    _plot(results, out.with_suffix(".png"))
    print(f"\nwrote {out} and {out.with_suffix('.png')}")


def _plot(results, png: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = results["runs"]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    xs = [n for n in (1, 2) if f"dask{n}" in runs]
    if xs:
        ys = [runs[f"dask{n}"]["rows_per_s"] for n in xs]
        ax.plot(xs, ys, "o-", label="EmbedLab on Dask, 1 thread per worker")
        ax.plot(xs, [ys[0] * n for n in xs], ":", color="grey", label="linear from 1 worker")
        if "bound" in results and len(xs) == 2:
            b = results["bound"]
            speed = ((b["count"]["1"]["wall"] + b["pass1"]["1"]["wall"] + b["pass2"]["1"]["wall"])
                     / (b["count"]["2"]["wall"] + b["pass1"]["2"]["wall"]
                        + b["pass2"]["2"]["wall"]))
            ax.plot([2], [ys[0] * speed], "^", color="C1",
                    label=f"1 worker x {speed:.2f}: the chunk work in 2 plain processes")
    if "single" in runs:
        ax.axhline(runs["single"]["rows_per_s"], color="C2", ls="--",
                   label="single process (2 threads)")
    if "single_1core" in runs:
        ax.axhline(runs["single_1core"]["rows_per_s"], color="C2", ls=":",
                   label="single process, 1 core")
    if "nvt" in runs:
        ax.plot([2], [runs["nvt"]["rows_per_s"]], "s", color="C3",
                label="NVTabular 23.08 CPU, 2 workers")
    ax.set_xticks([1, 2])
    ax.set_xlabel("Dask worker processes")
    ax.set_ylabel("rows / s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Criteo ETL, {results['rows'] / 1e6:.0f}M rows, {results['machine']}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=4_000_000)
    ap.add_argument("--configs", default="single,single_1core,dask1,dask2",
                    help=f"comma-separated, of {', '.join(CONFIGS)}, nvt, bound")
    ap.add_argument("--data-dir", type=Path, default=Path(os.environ.get(
        "EMBEDLAB_DATA_DIR", HERE.parent.parent / "data" / "cache")) / "bench_etl")
    ap.add_argument("--nvt-python", default=os.environ.get("NVT_PYTHON", ""),
                    help="python of an environment with nvtabular 23.08 (the nvt config)")
    ap.add_argument("--chunk-mib", type=int, default=None,
                    help="chunk_bytes of the ETL in MiB (default 32; recorded in the JSON)")
    ap.add_argument("--json", type=Path, default=None, help="results file (appended to)")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--run", help=argparse.SUPPRESS)        # child: one configuration
    ap.add_argument("--src", help=argparse.SUPPRESS)
    ap.add_argument("--dst", help=argparse.SUPPRESS)
    ap.add_argument("--part", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.chunk_mib is not None:           # the children read it from the environment
        os.environ["ETL_BENCH_CHUNK_MIB"] = str(a.chunk_mib)
        global CHUNK_BYTES
        CHUNK_BYTES = a.chunk_mib << 20
    if a.run == "bound-child":
        run_bound_child(a.src, a.dst, a.part)
        return
    if a.run:
        res = (run_nvt(a.src, a.dst) if a.run == "nvt" else run_bound(a.src, a.dst)
               if a.run == "bound" else run_embedlab(a.run, a.src, a.dst))
        print(json.dumps(res))
        return
    out = a.json or _results.default_out("etl", _results.cpu_machine())
    results = json.loads(out.read_text()) if out.exists() else {
        "machine": _results.cpu_machine(), "cpu": _results.cpu_name(), "cores": os.cpu_count(),
        "rows": a.rows, "chunk_bytes": CHUNK_BYTES, "runs": {}}
    if a.report:
        report(results, out)
        return
    if results["rows"] != a.rows or results.get("chunk_bytes", 32 << 20) != CHUNK_BYTES:
        raise SystemExit(f"{out} holds a run of {results['rows']} rows in chunks of "
                         f"{results.get('chunk_bytes', 32 << 20)} bytes; use another --json")
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
        if config == "bound":
            results["bound"] = r["bound"]
            print(json.dumps(r["bound"], indent=1))
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1))
            continue
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
