"""GPU benchmark of the HPS embedding cache's hit path (CudaEmbeddingCache) against a PyTorch gather.

Run on a CUDA machine with PyTorch, after building the module (standalone is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    PYTHONPATH=/tmp/b python3 helpers/benchmarks/hps_gpu.py

What it does, in one run on one GPU:
  1. measures the device-copy ceiling (a 1 GiB device-to-device copy, bytes read + written);
  2. fills a cache (8 ways, dynamic and static) of --rows16 rows at dim 16 and --rows128 rows at
     dim 128 with random int64 keys, and keeps the keys that stayed (the hit set);
  3. for batches of 65,536 keys and larger, uniform and Zipf(1.05) over the hit set, checks that
     lookup_mask() returns exactly the inserted rows, then times (CUDA events around CUDA-graph
     replays of 8 different batches, median of --reps) our hit path and, on the same rows,
     torch.index_select from a plain [rows, dim] tensor with the row indices already known
     (the gather a cache hit cannot beat: it has no hashing and no key compare). "eager" times
     back-to-back Python calls of lookup_mask instead (binding overhead included).
Bandwidth is counted the FBGEMM way: each looked-up row read once, the keys read, the outputs
written (batch * (8 + 2 * 4 * dim) bytes), over time, and as a fraction of the copy bandwidth.

Prints a table and writes JSON to helpers/benchmarks/results/hps_gpu_<gpu>_<UTC time>.json
(the same name under $OUT if OUT is set).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu import gpu_info, load_core, out_path  # noqa: E402


def graph_ms(torch, calls, reps, warmup=3):
    """Median ms per call: `calls` (a list of thunks, run round-robin) captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in calls:  # warm-up outside the graph (first launches, lazy init)
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in calls:
            f()
    times = []
    for i in range(warmup + reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b) / len(calls))
    return float(np.median(times))


def eager_ms(torch, calls, reps, warmup=3):
    times = []
    for i in range(warmup + reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for f in calls:
            f()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b) / len(calls))
    return float(np.median(times))


def copy_bandwidth(torch, reps):
    n = 1 << 28  # 1 GiB of float32 each way
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = graph_ms(torch, [lambda: dst.copy_(src)], reps)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 4 * n / (ms * 1e-3) / 1e9


def zipf_positions(rng, n, count, alpha=1.05):
    z = (rng.zipf(alpha, size=n).astype(np.int64) - 1) % count
    return (z * 2654435761) % count  # hot ranks spread over the hit set


def run(args):
    import torch
    core = load_core()
    if not hasattr(core, "CudaEmbeddingCache"):
        raise SystemExit("hps_gpu: _embedlab_core was built without CUDA; build with -DEMBEDLAB_CUDA=ON")
    if not torch.cuda.is_available():
        raise SystemExit("hps_gpu: no CUDA device visible to PyTorch")
    rng = np.random.default_rng(args.seed)
    info = gpu_info(torch)
    copy_gbs = copy_bandwidth(torch, args.reps)
    print(f"{info['gpu']}: device copy {copy_gbs:.0f} GB/s (read + write)", flush=True)
    rows_out = []
    for dim, rows in ((16, args.rows16), (128, args.rows128)):
        for static in (False, True):
            cache = core.CudaEmbeddingCache(rows, dim, ways=8, static=static)
            keys = np.unique(rng.integers(-(2**62), 2**62, size=int(rows * 1.05), dtype=np.int64))
            rng.shuffle(keys)
            d_keys = torch.from_numpy(keys).cuda()
            values = torch.randn(len(keys), dim, device="cuda")
            stream = torch.cuda.current_stream().cuda_stream
            for b in range(0, len(keys), 1 << 20):
                cache.insert(d_keys[b:b + (1 << 20)], values[b:b + (1 << 20)], stream=stream)
            hit = torch.zeros(len(keys), dtype=torch.uint8, device="cuda")
            probe = torch.empty(len(keys), dim, device="cuda")
            cache.lookup_mask(d_keys, probe, hit, stream=stream)
            pos = torch.nonzero(hit).flatten()  # inserted positions still cached: the hit set
            table = values[pos].contiguous()     # the same rows as a plain tensor for the baseline
            hit_keys = d_keys[pos].contiguous()
            count = len(pos)
            del probe
            print(f"dim {dim} {'static' if static else 'dynamic'}: {count} of {len(keys)} keys cached "
                  f"(capacity {cache.capacity})", flush=True)
            for dist in ("uniform", "zipf"):
                for batch in args.batches:
                    idx = [torch.from_numpy(rng.integers(0, count, size=batch) if dist == "uniform"
                                            else zipf_positions(rng, batch, count)).cuda() for _ in range(8)]
                    qkeys = [hit_keys[i].contiguous() for i in idx]
                    out = torch.empty(batch, dim, device="cuda")
                    ref = torch.empty(batch, dim, device="cuda")
                    mask = torch.empty(batch, dtype=torch.uint8, device="cuda")
                    # correctness first: exactly the inserted rows, every position a hit
                    out.fill_(float("nan"))
                    cache.lookup_mask(qkeys[0], out, mask, stream=torch.cuda.current_stream().cuda_stream)
                    torch.index_select(table, 0, idx[0], out=ref)
                    torch.cuda.synchronize()
                    if not (bool(mask.all()) and torch.equal(out, ref)):
                        raise SystemExit(f"hps_gpu: wrong rows at dim {dim} batch {batch} {dist}")

                    def ours(i):
                        return lambda: cache.lookup_mask(qkeys[i], out, None,
                                                         stream=torch.cuda.current_stream().cuda_stream)

                    def theirs(i):
                        return lambda: torch.index_select(table, 0, idx[i], out=ref)

                    ms = graph_ms(torch, [ours(i) for i in range(8)], args.reps)
                    ms_eager = eager_ms(torch, [ours(i) for i in range(8)], args.reps)
                    ms_ref = graph_ms(torch, [theirs(i) for i in range(8)], args.reps)
                    nbytes = batch * (8 + 2 * 4 * dim)
                    r = {"dim": dim, "cache": "static" if static else "dynamic", "dist": dist, "batch": batch,
                         "cache_rows": count, "ms": ms, "ms_eager": ms_eager, "ms_torch_gather": ms_ref,
                         "gkeys_per_s": batch / (ms * 1e-3) / 1e9,
                         "gkeys_per_s_eager": batch / (ms_eager * 1e-3) / 1e9,
                         "gkeys_per_s_torch_gather": batch / (ms_ref * 1e-3) / 1e9,
                         "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
                         "frac_copy_bw": nbytes / (ms * 1e-3) / 1e9 / copy_gbs,
                         "frac_copy_bw_torch_gather": nbytes / (ms_ref * 1e-3) / 1e9 / copy_gbs,
                         "vs_torch_gather": ms_ref / ms}
                    rows_out.append(r)
                    print(f"  {dist:7s} batch {batch:8d}: cache {r['gkeys_per_s']:.2f} G keys/s "
                          f"({r['gb_per_s']:.0f} GB/s, {100 * r['frac_copy_bw']:.0f}% of copy; eager "
                          f"{r['gkeys_per_s_eager']:.2f}); torch gather {r['gkeys_per_s_torch_gather']:.2f} G keys/s "
                          f"({100 * r['frac_copy_bw_torch_gather']:.0f}%); cache/gather time "
                          f"{r['vs_torch_gather']:.2f}x", flush=True)
            del cache, d_keys, values, table, hit_keys
            torch.cuda.empty_cache()
    print()
    print(f"{'dim':>4} {'cache':>8} {'dist':>8} {'batch':>8} {'G keys/s':>9} {'GB/s':>6} {'%copy':>6} "
          f"{'torch G/s':>9} {'torch %':>7}")
    for r in rows_out:
        print(f"{r['dim']:>4} {r['cache']:>8} {r['dist']:>8} {r['batch']:>8} {r['gkeys_per_s']:>9.2f} "
              f"{r['gb_per_s']:>6.0f} {100 * r['frac_copy_bw']:>5.0f}% {r['gkeys_per_s_torch_gather']:>9.2f} "
              f"{100 * r['frac_copy_bw_torch_gather']:>6.0f}%")
    result = {"benchmark": "hps_gpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": " ".join(sys.argv), "info": info, "copy_gb_per_s": copy_gbs, "rows": rows_out}
    path = out_path("hps_gpu", info)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows16", type=int, default=8 << 20, help="cache rows at dim 16")
    p.add_argument("--rows128", type=int, default=2 << 20, help="cache rows at dim 128")
    p.add_argument("--batches", type=int, nargs="+", default=[65536, 262144, 1048576])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    run(p.parse_args())


if __name__ == "__main__":
    main()
