"""ParameterServer.lookup on the GPU tier: latency and lookups/s against the bare cache kernel,
the same server on the CPU tier, and HugeCTR's published "TF with HPS" numbers.

Run on a CUDA machine with PyTorch, with the module built (the standalone build copied into
helpers/embedlab with its _build_info.json is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    cp /tmp/b/_embedlab_core*.so /tmp/b/_build_info.json helpers/embedlab/
    PYTHONPATH=helpers python3 helpers/benchmarks/hps_server_gpu.py

The model: --tables tables (26, DLRM's) of --rows rows each (dims 16 and 128), one HPS JSON
(volatile DB parallel_hash_map holding every row, no persistent DB, dynamic cache of
gpucacheper 0.5, hit_rate_threshold 0.9). A "model lookup" is one lookup of a batch of keys in
each of the tables. Keys: a hot set (30 % of each table's rows) is looked up first so that it is
cached; "100 % hits" batches draw from it, "95 % hits" batches replace 5 % of the keys by keys
drawn from the other rows (their rows come from the hash map, and are inserted into the cache
asynchronously, so the measured hit rate, printed, is about 95 %).

Columns (wall time per model lookup, median of --reps after warm-up, 3 key sets in rotation):
  * many: ``ps.lookup_many(model, [keys_on_gpu per table])``, the whole model's lookup as one
    request (one host synchronization for all tables), rows returned on the GPU;
  * bare many: ``CudaCacheLookup.lookup`` on the server's own caches, every table's keys in one
    array (each table's kernel and miss compaction on one stream, one synchronization; no miss
    handling): the floor of ``many``; "over bare" is ``many`` minus it, in us: what the server
    adds per request (Python, the keys' concatenation, the output views, the counters);
  * flat: ``ps.lookup_many(model, flat_keys, sizes=[batch] * tables, device=0)``, the same
    request as one flat key array and one flat row buffer (HugeCTR's Triton KEYS / NUMKEYS
    layout): no per-table arrays in or out;
  * many host io: ``lookup_many`` with host keys and host rows (one copy each way);
  * server: ``ps.lookup(model, t, keys_on_gpu)`` for each table, rows returned on the GPU;
  * bare: ``CudaEmbeddingCache.lookup(keys, out, missing=...)`` on the server's own caches (the
    kernel, the miss compaction and its one synchronization; no miss handling): the floor of
    any synchronous lookup through this cache;
  * host io: the GPU-tier server with host keys and host rows (what the Triton python backend
    does): one copy of the keys in, one of the rows out;
  * cpu tier: the same JSON on ParameterServer(gpu_cache=False), host keys and rows.
HugeCTR's numbers (v23.12.00 docs/source/hierarchical_parameter_server/hps_dlrm_benchmark.md,
"TF with HPS", A100-SXM4-80GB, Triton, server-side compute) are whole-model latencies, the
MLP included; they are printed beside ours for scale only.

Prints a table and writes JSON through _results' naming (under $OUT when OUT is set).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _gpu import gpu_info, out_path  # noqa: E402

HUGECTR_TF_HPS_US = {1024: 849.0, 4096: 1459.0, 65536: 15036.0}


def median_ms(fn, reps, sync, warmup=2):
    times = []
    for i in range(warmup + reps):
        sync()
        t0 = time.perf_counter()
        fn(i)
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--rows", type=int, default=262144, help="rows per table")
    ap.add_argument("--batches", type=int, nargs="+",
                    default=[32, 128, 512, 1024, 4096, 16384, 65536, 131072])
    ap.add_argument("--hits", type=float, nargs="+", default=[1.0, 0.95])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--skip-cpu-above", type=int, default=131072, help="no CPU-tier column above this batch")
    ap.add_argument("--skip-per-table-host-above", type=int, default=131072,
                    help="no per-table host-keys column above this batch")
    ap.add_argument("--profile", type=int, nargs="*", default=[],
                    help="batches whose lookup_many (list form, then sizes form) is also run under cProfile "
                         "(printed, top 25 by own time): where the server's time over bare-many goes")
    args = ap.parse_args()

    import torch
    from embedlab._native import core
    from embedlab.hps import ParameterServer
    from embedlab.sparse_model import write_sparse_model

    info = gpu_info(torch)
    rng = np.random.default_rng(12345)
    results = []
    tmp = tempfile.mkdtemp(prefix="hps_server_gpu_")
    sync = torch.cuda.synchronize
    out = out_path("hps_server_gpu", info)

    def write():        # after each dim, so that a run cut short keeps what it measured
        out.write_text(json.dumps({"benchmark": "hps_server_gpu", "utc": datetime.datetime.now(datetime.timezone.utc)
                                   .isoformat(timespec="seconds"), "args": vars(args), "machine": info,
                                   "hugectr_note": "HugeCTR v23.12.00 hps_dlrm_benchmark.md, TF with HPS, "
                                                   "A100-SXM4-80GB, Triton, server-side compute, DLRM incl. MLP",
                                   "results": results}, indent=1))
        print(f"wrote {out}", flush=True)

    for dim in args.dims:
        keys = rng.permutation(np.unique(rng.integers(0, 2**62, int(args.rows * 1.05), dtype=np.int64)))[:args.rows]
        vecs = rng.standard_normal((keys.size, dim)).astype(np.float32)
        path = write_sparse_model(os.path.join(tmp, f"t{dim}"), keys, vecs)
        js = {"volatile_db": {"type": "parallel_hash_map", "initial_cache_rate": 1.0},
              "persistent_db": {"type": "disabled"},
              "models": [{"model": "m", "sparse_files": [str(path)] * args.tables,
                          "embedding_table_names": [f"t{i}" for i in range(args.tables)],
                          "embedding_vecsize_per_table": [dim] * args.tables, "deployed_device_list": [0],
                          "gpucache": True, "gpucacheper": 0.5, "hit_rate_threshold": 0.9,
                          "embedding_cache_type": "dynamic"}]}
        t0 = time.perf_counter()
        ps = ParameterServer(js, gpu_cache=True)
        cpu = ParameterServer(js, gpu_cache=False)
        print(f"dim {dim}: two servers of {args.tables} x {args.rows} rows loaded in {time.perf_counter() - t0:.1f} s",
              flush=True)
        hot = keys[: int(0.3 * keys.size)]
        cold = keys[int(0.3 * keys.size):]
        for t in range(args.tables):        # cache the hot set (a miss-only batch: inserted synchronously)
            for s in range(0, hot.size, 65536):
                ps.lookup("m", t, hot[s:s + 65536], device=0)
                cpu.lookup("m", t, hot[s:s + 65536])
        ps.wait_background()
        caches = ps._gpu_caches[("dynamic", 0)]
        look = core().CudaCacheLookup(0)
        cache_list = [caches._tables[f"hps_et.m.t{t}"] for t in range(args.tables)]
        # The hot keys every table's cache holds: "100 % hits" batches draw only from them (a key
        # that one table's set could not hold would make every request take the miss path).
        buf = np.empty((hot.size, dim), np.float32)
        lost = np.unique(np.concatenate([caches.find(f"hps_et.m.t{t}", hot, buf) for t in range(args.tables)]))
        hot = np.delete(hot, lost)
        for hit in args.hits:
            for b in args.batches:
                def make_sets():
                    """3 key sets (one array per table each); each timed path gets its own, so that
                    misses one path inserted into the cache are not hits of the next."""
                    out = []
                    for _ in range(3):
                        per_table = []
                        for t in range(args.tables):
                            q = hot[rng.integers(0, hot.size, b)]
                            nm = int(round((1 - hit) * b))
                            if nm:
                                q[rng.choice(b, nm, replace=False)] = cold[rng.integers(0, cold.size, nm)]
                            per_table.append(q)
                        out.append(per_table)
                    return out

                sets, msets, mhsets = make_sets(), make_sets(), make_sets()
                dsets = [[torch.from_numpy(q).cuda() for q in s] for s in sets]
                mdsets = [[torch.from_numpy(q).cuda() for q in s] for s in msets]
                outs = [torch.empty((b, dim), dtype=torch.float32, device="cuda") for _ in range(args.tables)]
                miss = torch.empty(b, dtype=torch.int64, device="cuda")
                miss_all = torch.empty(b * args.tables, dtype=torch.int64, device="cuda")
                stream = torch.cuda.current_stream().cuda_stream
                reps = args.reps if b <= 16384 else max(5, args.reps // 2)
                # Correctness first: the server's rows are the table's rows.
                got = ps.lookup("m", 0, dsets[0][0], device=0).cpu().numpy()
                idx = {int(k): i for i, k in enumerate(keys)} if b <= 4096 else None
                if idx is not None:
                    assert np.array_equal(got, vecs[[idx[int(k)] for k in sets[0][0]]]), "wrong rows"
                # lookup_many first, on key sets of its own: the rows are the per-table lookup's.
                got_many = ps.lookup_many("m", dsets[0], device=0)
                assert all(torch.equal(got_many[t], ps.lookup("m", t, dsets[0][t], device=0))
                           for t in range(args.tables)), "lookup_many differs from lookup"
                ps.wait_background()
                m_before = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]

                def many(i):
                    ps.lookup_many("m", mdsets[i % 3], device=0)
                t_many = median_ms(many, reps, sync)
                m_after = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]
                mh, mm = m_after["hits"] - m_before["hits"], m_after["misses"] - m_before["misses"]
                many_hit_rate = mh / max(1, mh + mm)
                ps.wait_background()

                flat_keys = [torch.cat(s) for s in mdsets]
                flat_out = torch.empty(args.tables * b * dim, dtype=torch.float32, device="cuda")
                sizes, offs = [b] * args.tables, [t * b * dim for t in range(args.tables)]

                def bare_many(i):
                    look.lookup(cache_list, flat_keys[i % 3], sizes, flat_out, offs, miss_all, stream)
                t_bare_many = median_ms(bare_many, reps, sync)

                # The sizes form, on key sets of its own (checked against the list form first).
                fsets = [torch.cat([torch.from_numpy(q) for q in s]).cuda() for s in make_sets()]
                got_flat = ps.lookup_many("m", fsets[0], sizes=sizes, device=0)
                got_list = ps.lookup_many("m", list(fsets[0].split(sizes)), device=0)
                assert torch.equal(got_flat, torch.cat([r.reshape(-1) for r in got_list])), \
                    "lookup_many(sizes=) differs from the list form"
                ps.wait_background()

                def flat_many(i):
                    ps.lookup_many("m", fsets[i % 3], sizes=sizes, device=0)
                t_flat = median_ms(flat_many, reps, sync)
                ps.wait_background()
                if b in args.profile:
                    import cProfile
                    import pstats
                    for label, fn in (("lookup_many, list of device keys", many), ("lookup_many, sizes=", flat_many)):
                        prof = cProfile.Profile()
                        prof.enable()
                        for i in range(30):
                            fn(i)
                        sync()
                        prof.disable()
                        print(f"--- profile of {label}: dim {dim}, batch {b}, hit target {hit}: us per request "
                              "(own time, with callees), top 25 by own time (compiled functions the profiler "
                              "does not see, such as the cache binding's, count in their caller's own time)")
                        st = pstats.Stats(prof).stats
                        for (fname, line, func), (_, nc, tt, ct, _) in sorted(st.items(), key=lambda kv: -kv[1][2])[:25]:
                            print(f"{1e6 * tt / 30:9.1f} {1e6 * ct / 30:9.1f}  {nc / 30:5.1f}x  "
                                  f"{Path(fname).name}:{line}({func})")
                    ps.wait_background()

                def many_host(i):
                    ps.lookup_many("m", mhsets[i % 3])
                t_many_host = median_ms(many_host, reps, sync)
                ps.wait_background()
                before = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]

                def server(i):
                    s = dsets[i % 3]
                    for t in range(args.tables):
                        ps.lookup("m", t, s[t], device=0)
                t_server = median_ms(server, reps, sync)
                after = ps.stats()["tiers"]["cache"]["devices"]["cuda:0"]
                hit_rate = (after["hits"] - before["hits"]) / max(1, (after["hits"] - before["hits"]) +
                                                                    (after["misses"] - before["misses"]))
                ps.wait_background()
                names = [f"hps_et.m.t{t}" for t in range(args.tables)]

                def bare(i):
                    s = dsets[i % 3]
                    for t in range(args.tables):
                        caches._tables[names[t]].lookup(s[t], outs[t], stream=stream, missing=miss)
                t_bare = median_ms(bare, reps, sync)

                def host_io(i):
                    s = sets[i % 3]
                    for t in range(args.tables):
                        ps.lookup("m", t, s[t])
                t_host = median_ms(host_io, reps, sync) if b <= args.skip_per_table_host_above else None
                ps.wait_background()
                t_cpu = None
                if b <= args.skip_cpu_above:
                    def cpu_tier(i):
                        s = sets[i % 3]
                        for t in range(args.tables):
                            cpu.lookup("m", t, s[t])
                    t_cpu = median_ms(cpu_tier, max(3, reps // 3), lambda: None, warmup=1)
                row = {"dim": dim, "batch": b, "hit_target": hit, "hit_rate": hit_rate, "tables": args.tables,
                       "server_ms": t_server, "bare_ms": t_bare, "host_io_ms": t_host, "cpu_tier_ms": t_cpu,
                       "many_hit_rate": many_hit_rate, "many_ms": t_many, "bare_many_ms": t_bare_many, "many_host_io_ms": t_many_host,
                       "many_over_bare_many": t_many / t_bare_many,
                       "many_minus_bare_many_us": 1e3 * (t_many - t_bare_many),
                       "flat_ms": t_flat, "flat_minus_bare_many_us": 1e3 * (t_flat - t_bare_many),
                       "many_over_bare": t_many / t_bare,
                       "many_lookups_per_s": args.tables * b / (t_many / 1e3),
                       "server_over_bare": t_server / t_bare,
                       "server_minus_bare_us_per_table": 1e3 * (t_server - t_bare) / args.tables,
                       "lookups_per_s": args.tables * b / (t_server / 1e3),
                       "hugectr_tf_hps_a100_whole_model_us": HUGECTR_TF_HPS_US.get(b)}
                results.append(row)
                cpu_txt = "-" if t_cpu is None else f"{t_cpu:9.3f}"
                host_txt = "-" if t_host is None else f"{t_host:8.3f}"
                print(f"dim {dim:3d} batch {b:6d} hits {many_hit_rate * 100:5.1f}/{hit_rate * 100:5.1f} %: many {t_many:8.3f} ms  "
                      f"bare-many {t_bare_many:8.3f} ms  x{t_many / t_bare_many:4.2f}  over bare "
                      f"{row['many_minus_bare_many_us']:6.0f} us  flat {t_flat:8.3f} ms (over bare "
                      f"{row['flat_minus_bare_many_us']:6.0f} us)  many-host {t_many_host:8.3f} ms  "
                      f"| server {t_server:8.3f} ms  "
                      f"bare {t_bare:8.3f} ms  x{t_server / t_bare:4.2f}  (+{row['server_minus_bare_us_per_table']:6.1f} "
                      f"us/table)  host-io {host_txt} ms  cpu-tier {cpu_txt} ms  "
                      f"{row['lookups_per_s'] / 1e6:8.1f} M lookups/s",
                      flush=True)
        ps.close()
        cpu.close()
        write()
    print("\n| dim | batch | hits (many) | lookup_many (ms) | bare many (ms) | many/bare many | many-bare many (us) | "
          "sizes= form (ms) | sizes=-bare many (us) | many host in/out (ms) | per-table server (ms) | 26 bare calls (ms) | many/26 bare | "
          "per-table host in/out (ms) | CPU tier (ms) | M lookups/s (many) | HugeCTR TF+HPS A100, whole model incl. MLP (us) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        cpu_ms = "-" if r["cpu_tier_ms"] is None else f"{r['cpu_tier_ms']:.3f}"
        host_ms = "-" if r["host_io_ms"] is None else f"{r['host_io_ms']:.3f}"
        print(f"| {r['dim']} | {r['batch']:,} | {100 * r['many_hit_rate']:.1f} % | {r['many_ms']:.3f} | {r['bare_many_ms']:.3f} | "
              f"{r['many_over_bare_many']:.2f} | {r['many_minus_bare_many_us']:.0f} | {r['flat_ms']:.3f} | "
              f"{r['flat_minus_bare_many_us']:.0f} | {r['many_host_io_ms']:.3f} | "
              f"{r['server_ms']:.3f} | {r['bare_ms']:.3f} | {r['many_over_bare']:.2f} | {host_ms} | {cpu_ms} | "
              f"{r['many_lookups_per_s'] / 1e6:.1f} | {r['hugectr_tf_hps_a100_whole_model_us'] or ''} |")


if __name__ == "__main__":
    main()
