"""GPU benchmark of the HPS embedding cache's hit path (CudaEmbeddingCache) against a PyTorch gather.

Run on a CUDA machine with PyTorch, after building the module (standalone is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    PYTHONPATH=/tmp/b python3 helpers/benchmarks/hps_gpu.py

What it does, in one run on one GPU:
  1. measures the device-copy ceiling (a 1 GiB device-to-device copy, bytes read + written);
  2. fills a cache (8 ways, dynamic and static) of --rows16 slots at dim 16 and --rows128 slots at
     dim 128 with --fill x slots random int64 keys, and keeps the keys that stayed (the hit set;
     its size over the slots is the load factor printed);
  3. for batches of 65,536 and 65,536 x 26 keys, uniform and Zipf(1.05) over the hit set, checks
     that lookup_mask() returns exactly the inserted rows, then times (CUDA events around
     CUDA-graph replays of 8 different batches, median of --reps) our hit path and, on the same
     rows from a plain [rows, dim] tensor with the row indices already known, the plain gather
     floor (`_gather_rows_cuda`: one thread per 16-byte chunk, nothing but the copy; what a cache
     hit cannot beat, it has no hashing and no key compare) and torch.index_select. "of floor" is
     the floor's time over ours. "eager" times back-to-back Python calls of lookup_mask instead
     (binding overhead included);
  4. times the key probe alone: 8 bytes gathered at random slots of an array as large as the
     cache's keys (what proving a hit's key costs by itself, one random access per lookup);
  5. times the full lookup() (hit rows, the ascending miss positions, one synchronization) on
     the same batches with --miss of the keys replaced by absent ones, against the hit path,
     and the hit path called and synchronized the same way (wall time: what any synchronous
     call costs, so that lookup()'s own part, the miss compaction, shows as the difference).
Bandwidth is counted the FBGEMM way: each looked-up row read once, the keys read, the outputs
written (batch * (8 + 2 * 4 * dim) bytes), over time, and as a fraction of the copy bandwidth.

A dynamic cache stamps a hit with the current epoch when its stamp differs, and the epoch
advances only in insert() (embedding_cache.h): replayed lookups alone stamp each row once. So for
dynamic caches the script also times the hit path with advance_epoch() before each lookup (what
every insert() of the misses does between two lookups of serving; then every hit writes its
stamp): "after insert" is that graph's time per lookup minus the advance kernel's own (timed
alone, in a graph of its own).

Prints a table and writes JSON to docs/benchmarks/results/hps_gpu_<gpu>_<UTC time>.json
(the same name under $OUT if OUT is set).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu import events_ms, gpu_info, load_core, out_path  # noqa: E402


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
    return events_ms(torch, g.replay, reps, inner=1, warmup=warmup) / len(calls)


def eager_ms(torch, calls, reps, warmup=3):
    """Median ms per call of the calls launched one after the other (no graph)."""
    def all_calls():
        for f in calls:
            f()
    return events_ms(torch, all_calls, reps, inner=1, warmup=warmup) / len(calls)


def full_lookup_ms(torch, cache, qkeys, absent, out, args):
    """Median wall ms of lookup() (it synchronizes) over the 8 batches with a share args.miss of
    each batch's keys replaced by absent keys; also checks the miss positions it returns."""
    stream = torch.cuda.current_stream().cuda_stream
    batches, expect = [], []
    for q in qkeys:
        q = q.clone()
        pos = torch.randperm(len(q), device="cuda")[: int(len(q) * args.miss)]
        q[pos] = absent[torch.randint(0, len(absent), (len(pos),), device="cuda")]
        batches.append(q)
        expect.append(torch.sort(pos).values)
    buf = torch.empty(len(qkeys[0]), dtype=torch.int64, device="cuda")
    kw = {"missing": buf}
    try:
        cache.lookup(batches[0], out, stream=stream, **kw)
    except TypeError:  # a build whose lookup() allocates the miss array itself
        kw = {}
    for q, e in zip(batches, expect):
        got = cache.lookup(q, out, stream=stream, **kw)
        if not torch.equal(got, e):
            raise SystemExit("hps_gpu: lookup() returned other miss positions")
    times, mask_times = [], []
    for rep in range(3 + args.reps):
        for q in batches:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            cache.lookup(q, out, stream=stream, **kw)
            t1 = time.perf_counter()
            # the same batch through the hit path alone, synchronized the same way: what a
            # synchronous call costs without the miss compaction and the copy of its count
            cache.lookup_mask(q, out, None, stream=stream)
            torch.cuda.current_stream().synchronize()
            if rep >= 3:
                times.append(t1 - t0)
                mask_times.append(time.perf_counter() - t1)
    return 1e3 * float(np.median(times)), 1e3 * float(np.median(mask_times)), int(len(expect[0]))


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
    for dim, rows in ((d, {16: args.rows16, 128: args.rows128}[d]) for d in args.dims):
        for static in (False, True):
            cache = core.CudaEmbeddingCache(rows, dim, ways=8, static=static)
            keys = np.unique(rng.integers(-(2**62), 2**62, size=int(cache.capacity * args.fill), dtype=np.int64))
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
            load = count / cache.capacity
            print(f"dim {dim} {'static' if static else 'dynamic'}: {count} of {len(keys)} keys cached "
                  f"({cache.capacity} slots, load {load:.2f})", flush=True)
            probe_table = torch.randn(cache.capacity, 2, device="cuda")  # 8 bytes per slot, as the keys
            absent = torch.from_numpy(np.setdiff1d(rng.integers(-(2**62), 2**62, size=1 << 21, dtype=np.int64),
                                                   keys)).cuda()
            for dist in args.dists:
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

                    def floor(i):
                        return lambda: core._gather_rows_cuda(table, idx[i], ref,
                                                              stream=torch.cuda.current_stream().cuda_stream)

                    floor_out = torch.empty(batch, dim, device="cuda")
                    core._gather_rows_cuda(table, idx[0], floor_out, stream=torch.cuda.current_stream().cuda_stream)
                    torch.cuda.synchronize()
                    if not torch.equal(floor_out, out):
                        raise SystemExit(f"hps_gpu: the gather floor returned other rows at dim {dim} batch {batch}")
                    del floor_out
                    ms = graph_ms(torch, [ours(i) for i in range(8)], args.reps)
                    ms_floor = graph_ms(torch, [floor(i) for i in range(8)], args.reps)
                    ms_eager = eager_ms(torch, [ours(i) for i in range(8)], args.reps)
                    ms_ref = graph_ms(torch, [theirs(i) for i in range(8)], args.reps)
                    ms_adv = ms_adv_only = None
                    if not static and hasattr(cache, "advance_epoch"):
                        def advance():
                            cache.advance_epoch(stream=torch.cuda.current_stream().cuda_stream)

                        def ours_after_insert(i):
                            f = ours(i)

                            def g():
                                advance()
                                f()
                            return g
                        ms_adv = graph_ms(torch, [ours_after_insert(i) for i in range(8)], args.reps)
                        ms_adv_only = graph_ms(torch, [advance] * 8, args.reps)
                    ms_full, ms_mask_wall, misses = full_lookup_ms(torch, cache, qkeys, absent, out, args)
                    # the key probe: 8 bytes read at a random slot of an array as large as the
                    # cache's keys (what proving a hit's key costs on its own), the same count
                    probe_pos = [torch.randint(0, cache.capacity, (batch,), device="cuda") for _ in range(8)]
                    probe_out = torch.empty(batch, 2, device="cuda")

                    def probe(i):
                        return lambda: core._gather_rows_cuda(probe_table, probe_pos[i], probe_out,
                                                              stream=torch.cuda.current_stream().cuda_stream)
                    ms_probe = graph_ms(torch, [probe(i) for i in range(8)], args.reps)
                    del probe_pos, probe_out
                    nbytes = batch * (8 + 2 * 4 * dim)
                    r = {"dim": dim, "cache": "static" if static else "dynamic", "dist": dist, "batch": batch,
                         "cache_rows": count, "slots": cache.capacity, "load": load, "ways": cache.ways,
                         "ms": ms, "ms_floor": ms_floor, "of_floor": ms_floor / ms, "ms_eager": ms_eager,
                         "ms_key_probe": ms_probe, "of_floor_plus_probe": (ms_floor + ms_probe) / ms,
                         "ms_torch_gather": ms_ref, "ms_full_lookup": ms_full, "full_lookup_misses": misses,
                         "full_vs_hit": ms_full / ms, "ms_hit_path_wall": ms_mask_wall,
                         "ms_with_advance": ms_adv, "ms_advance_alone": ms_adv_only,
                         "ms_after_insert": None if ms_adv is None else ms_adv - ms_adv_only,
                         "of_floor_after_insert": None if ms_adv is None else ms_floor / (ms_adv - ms_adv_only),
                         "gkeys_per_s": batch / (ms * 1e-3) / 1e9,
                         "gkeys_per_s_eager": batch / (ms_eager * 1e-3) / 1e9,
                         "gkeys_per_s_torch_gather": batch / (ms_ref * 1e-3) / 1e9,
                         "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
                         "frac_copy_bw": nbytes / (ms * 1e-3) / 1e9 / copy_gbs,
                         "frac_copy_bw_floor": nbytes / (ms_floor * 1e-3) / 1e9 / copy_gbs,
                         "frac_copy_bw_torch_gather": nbytes / (ms_ref * 1e-3) / 1e9 / copy_gbs,
                         "vs_torch_gather": ms_ref / ms}
                    rows_out.append(r)
                    print(f"  {dist:7s} batch {batch:8d}: cache {ms:.4f} ms ({r['gkeys_per_s']:.2f} G keys/s, "
                          f"{100 * r['frac_copy_bw']:.0f}% of copy; eager {ms_eager:.4f} ms); gather floor "
                          f"{ms_floor:.4f} ms -> cache at {100 * r['of_floor']:.0f}% of the floor; key probe alone "
                          f"{ms_probe:.4f} ms (floor + probe = {100 * r['of_floor_plus_probe']:.0f}% of ours); "
                          f"torch index_select "
                          f"{ms_ref:.4f} ms; full lookup() with {misses} misses {ms_full:.4f} ms "
                          f"= {r['full_vs_hit']:.2f}x the hit path (the hit path called and synchronized the "
                          f"same way: {ms_mask_wall:.4f} ms wall)", flush=True)
                    if ms_adv is not None:
                        print(f"  {dist:7s} batch {batch:8d}: after an insert (advance_epoch before each lookup, "
                              f"every hit stamps): {ms_adv:.4f} ms - advance kernel {ms_adv_only:.4f} ms = "
                              f"{r['ms_after_insert']:.4f} ms -> {100 * r['of_floor_after_insert']:.0f}% of the floor",
                              flush=True)
            del cache, d_keys, values, table, hit_keys, absent, probe_table
            torch.cuda.empty_cache()
    print()
    print(f"{'dim':>4} {'cache':>8} {'load':>5} {'dist':>8} {'batch':>8} {'cache ms':>9} {'floor ms':>9} "
          f"{'of floor':>8} {'probe ms':>9} {'G keys/s':>9} {'%copy':>6} {'torch ms':>9} {'lookup() ms':>11} "
          f"{'x hit':>6} {'after ins':>9} {'of floor':>8}")
    for r in rows_out:
        print(f"{r['dim']:>4} {r['cache']:>8} {r['load']:>5.2f} {r['dist']:>8} {r['batch']:>8} {r['ms']:>9.4f} "
              f"{r['ms_floor']:>9.4f} {100 * r['of_floor']:>7.0f}% {r['ms_key_probe']:>9.4f} {r['gkeys_per_s']:>9.2f} "
              f"{100 * r['frac_copy_bw']:>5.0f}% {r['ms_torch_gather']:>9.4f} {r['ms_full_lookup']:>11.4f} "
              f"{r['full_vs_hit']:>6.2f} " + ("" if r["ms_after_insert"] is None else
                                              f"{r['ms_after_insert']:>9.4f} {100 * r['of_floor_after_insert']:>7.0f}%"))
    result = {"benchmark": "hps_gpu", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
              "command": " ".join(sys.argv), "info": info, "copy_gb_per_s": copy_gbs, "rows": rows_out}
    path = out_path("hps_gpu", info)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows16", type=int, default=8 << 20, help="cache slots at dim 16")
    p.add_argument("--rows128", type=int, default=4 << 20, help="cache slots at dim 128")
    p.add_argument("--fill", type=float, default=0.67, help="keys inserted per slot (the load factor, before "
                   "the sets that overflow evict or refuse)")
    p.add_argument("--miss", type=float, default=0.1, help="share of absent keys in the full lookup() batches")
    p.add_argument("--dims", type=int, nargs="+", default=[16, 128], choices=[16, 128])
    p.add_argument("--dists", nargs="+", default=["uniform", "zipf"], choices=["uniform", "zipf"])
    p.add_argument("--batches", type=int, nargs="+", default=[65536, 65536 * 26])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    run(p.parse_args())


if __name__ == "__main__":
    main()
