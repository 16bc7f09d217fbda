"""Benchmark: the HPS + ONNX ensemble served by tritonserver, against the same work in process.

In one run, on notebook 05's export (`<DATA_DIR>/hps_triton/serving.json`):

1. the ceiling: a two-model identity ensemble (python backend, no work) at batch 1 and 1,024;
2. the served `ensemble` (hps_embedding -> dense) at batch 1 and 1,024, 1 and 4 concurrent clients;
3. the same two steps in this process, no server: `ParameterServer.lookup`, then onnxruntime
   (`embedlab.serving.InProcessModel`), one caller, onnxruntime on one thread and on all cores
   (the faster one is the reference for the served/in-process ratio);
4. the TensorFlow inference SavedModel (`hps.LookupLayer` + the dense layers) in this process.

Load comes from perf_analyzer when the tritonclient install provides one that runs here; the
pinned wheel does not ship it, so a bounded multi-threaded tritonclient load generator is used
(`embedlab.serving.run_load`: synchronous clients over HTTP on 127.0.0.1, a fixed time per
point). Its client threads share the machine with the server, so on a small machine served
numbers are a lower bound. Every point runs `--rounds` times, interleaved with the others, and
the median is reported (slow phases of a shared machine hit all points alike).

Prints a table and writes JSON under docs/benchmarks/results/serving_<machine>_<date>.json.

    .venv/bin/python helpers/benchmarks/serving.py                  # after notebook 05
    .venv/bin/python helpers/benchmarks/serving.py --seconds 1 --rounds 1 --no-tf
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
try:  # the installed package (make setup); else the source tree next to this script
    import embedlab  # noqa: F401
except ImportError:
    sys.path.insert(0, str(HERE.parent))

from embedlab import config  # noqa: E402
from embedlab.serving import (ENSEMBLE, IDENTITY_ENSEMBLE, InProcessModel, TritonServer,  # noqa: E402
                              load_manifest, run_load, write_identity_repository,
                              write_model_repository)
from embedlab.serving.reference import sample_keys, table_keys  # noqa: E402


def _perf_analyzer():
    """perf_analyzer from PATH or the tritonclient install, if one runs here; else None."""
    import subprocess
    cands = [shutil.which("perf_analyzer")]
    try:
        import tritonclient
        cands += [str(p) for p in Path(tritonclient.__file__).parent.rglob("perf_analyzer")]
    except ImportError:
        pass
    for exe in filter(None, cands):
        try:
            if subprocess.run([exe, "--version"], capture_output=True, timeout=10).returncode == 0:
                return exe
        except (OSError, subprocess.TimeoutExpired):
            continue
    return None


def _inproc(fn, batches, seconds: float) -> dict:
    fn(batches[0])
    lat = []
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        fn(batches[i % len(batches)])
        lat.append(time.perf_counter() - t)
        i += 1
    el = time.perf_counter() - t0
    lat = np.asarray(lat)
    b = batches[0].shape[0]
    return {"batch": b, "concurrency": 1, "requests": i, "failed": 0, "seconds": el,
            "requests_per_s": i / el, "rows_per_s": i * b / el,
            "p50_ms": float(np.percentile(lat, 50) * 1e3), "p90_ms": float(np.percentile(lat, 90) * 1e3),
            "p99_ms": float(np.percentile(lat, 99) * 1e3)}


def _tf_model(manifest):
    """keys -> logits through notebook 05's inference SavedModel (hps.LookupLayer + dense)."""
    from embedlab.serving.reference import TFInferenceModel
    return TFInferenceModel(manifest).predict


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, default=config.DATA_DIR / "hps_triton")
    ap.add_argument("--seconds", type=float, default=2.0, help="time per point and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-tf", action="store_true", help="skip the TensorFlow SavedModel")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)

    manifest = load_manifest(args.export)
    load_start = os.getloadavg()[0]
    k = manifest.keys_per_sample
    rng = np.random.default_rng(0)
    pool = table_keys(manifest)
    batches = {b: [sample_keys(manifest, b, rng, pool) for _ in range(32)] for b in (1, 1024)}
    pa = _perf_analyzer()
    load_tool = "embedlab.serving.run_load (tritonclient HTTP, threads)"
    if pa:
        print(f"perf_analyzer found at {pa}; this script still drives embedlab.serving.run_load so that "
              "every point of the table comes from one generator")
    else:
        print("perf_analyzer: not provided by this tritonclient install; using embedlab.serving.run_load")
    print(f"load generator: {load_tool}")

    work = Path(tempfile.mkdtemp(prefix="embedlab-serving-bench-"))
    repo = write_model_repository(manifest, work / "repository", max_batch_size=1024)
    ident = write_identity_repository(work / "identity", keys_per_sample=k, max_batch_size=1024)
    # Both repositories are served by one server so that the points can be interleaved.
    for d in ident.iterdir():
        shutil.move(str(d), repo / d.name)

    # The in-process baseline at its best: onnxruntime on all cores, and on one (no pool wake-ups).
    ncpu = os.cpu_count() or 1
    refs = {n: InProcessModel(manifest, threads=n) for n in sorted({1, ncpu})}
    tf_run = None if args.no_tf else _tf_model(manifest)
    points = {}

    def add(name, res):
        points.setdefault(name, []).append(res)

    with TritonServer(repo, log_file=work / "triton.log") as server:
        for r in range(args.rounds):
            for b in (1, 1024):
                add(("identity ensemble (ceiling)", b, 1), run_load(
                    server, batches[b], model=IDENTITY_ENSEMBLE, output="OUTPUT", numkeys_name=None,
                    concurrency=1, duration_s=args.seconds).summary())
                for c in (1, 4):
                    add(("served ensemble", b, c), run_load(
                        server, batches[b], model=ENSEMBLE, concurrency=c, duration_s=args.seconds).summary())
                for n, ref in refs.items():
                    add((f"in process: HPS lookup + onnxruntime ({n} thr)", b, 1),
                        _inproc(ref.predict, batches[b], args.seconds))
                if tf_run is not None:
                    add(("in process: TF SavedModel (hps.LookupLayer)", b, 1),
                        _inproc(tf_run, batches[b], args.seconds))
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    for ref in refs.values():
        ref.close()

    rows = []
    for (name, b, c), rs in points.items():
        med = {key: statistics.median(x[key] for x in rs)
               for key in ("requests_per_s", "rows_per_s", "p50_ms", "p90_ms", "p99_ms")}
        med.update(name=name, batch=b, concurrency=c, failed=sum(x["failed"] for x in rs),
                   requests=sum(x["requests"] for x in rs))
        rows.append(med)
    by = {(x["name"], x["batch"], x["concurrency"]): x for x in rows}
    inproc = {b: max(by[(f"in process: HPS lookup + onnxruntime ({n} thr)", b, 1)]["rows_per_s"] for n in refs)
              for b in (1, 1024)}

    print(f"\n{'what':<48}{'batch':>6}{'clients':>8}{'req/s':>10}{'rows/s':>12}{'p50 ms':>9}"
          f"{'p90 ms':>9}{'p99 ms':>9}{'failed':>7}{'vs in-proc':>11}")
    for x in rows:
        ratio = x["rows_per_s"] / inproc[x["batch"]]
        print(f"{x['name']:<48}{x['batch']:>6}{x['concurrency']:>8}{x['requests_per_s']:>10,.0f}"
              f"{x['rows_per_s']:>12,.0f}{x['p50_ms']:>9.3f}{x['p90_ms']:>9.3f}{x['p99_ms']:>9.3f}"
              f"{x['failed']:>7}{ratio:>10.2f}x")
    best = max(by[("served ensemble", 1024, c)]["rows_per_s"] for c in (1, 4))
    print(f"\nbatch 1,024: served / best in-process rows/s = {best / inproc[1024]:.2f} "
          f"(best of 1 and 4 clients); identity ceiling {by[('identity ensemble (ceiling)', 1024, 1)]['rows_per_s']:,.0f} rows/s")
    b1 = by[("served ensemble", 1, 1)]
    print(f"batch 1, one client: p50 {b1['p50_ms']:.3f} ms, p99 {b1['p99_ms']:.3f} ms")
    print(f"machine load (1-min average): {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end, "
          f"on {os.cpu_count()} cores")

    sys.path.insert(0, str(HERE))
    from _results import cpu_machine, default_out
    out = args.out or default_out("serving", cpu_machine())
    out.parent.mkdir(parents=True, exist_ok=True)
    load1 = os.getloadavg()[0]
    res = {"machine": {"cpu": _cpu_name(), "cores": os.cpu_count(), "loadavg_1min_at_start": load_start, "loadavg_1min_at_end": load1,
                       "python": platform.python_version()},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([Path(sys.executable).name, *sys.argv]),
           "load_generator": load_tool, "seconds_per_point": args.seconds, "rounds": args.rounds,
           "export": str(args.export), "keys_per_sample": k, "emb_vec_size": manifest.emb_vec_size,
           "points": rows,
           "served_over_inprocess_batch1024": best / inproc[1024]}
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    sys.exit(main())
