"""CPU benchmark: the HPS's database tiers, Redis (``redis_cluster``) and RocksDB (``rocks_db``).

For each dim (default 16 and 128) a table of ``--rows`` rows is stored in each database, then
batches of ``--batch`` keys (default 65,536), drawn uniformly (``uniform``) or with Zipf(1.05)
popularity over a random ranking of the keys (``zipf``), are looked up through the tier:

* ``redis tier``: ``RedisTier.find`` (EmbedLab's ``redis_cluster`` tier: rows in
  ``num_partitions`` Redis hashes, one pipelined ``HMGET`` per partition per ``max_batch_size``
  keys, replies parsed by hiredis), against a local ``redis-server`` on 127.0.0.1;
* ``redis-benchmark MGET``: Redis's own C client, ``redis-benchmark -c 1 -P 16`` running
  ``MGET`` of ``--mget-keys`` random keys per command over string keys holding values of the same
  size (4 x dim bytes): what one connection gets out of this server when nothing but the
  protocol is in the way. Reported in keys/s (commands/s x keys per MGET);
* ``redis GET loop``: a Python loop of single ``GET`` calls through redis-py (what a client
  without batching does);
* ``rocksdb tier``: ``RocksDBTier.find`` (rocksdict multi-get of ``max_batch_size`` keys on one
  column family), after the table was written the way the ParameterServer loads it (a bulk
  insert, which ends with a flush and a compaction).

Each figure is the median of ``--repeats`` passes, in keys per second; the four measurements are
interleaved within each pass (load from other processes hits them alike). The Redis and RocksDB
servers share the machine's cores with the client, like a single-host deployment.

Prints a table and writes JSON (default docs/benchmarks/results/hps_db_<machine>_<UTC time>.json).
``tier_results(...)`` returns these rows; ``make_tiers(...)`` gives ``helpers/benchmarks/hps.py`` its
``redis`` and ``rocks_db`` tiers.

Usage:
    .venv/bin/python helpers/benchmarks/hps_db.py [--dims 16 128] [--rows 262144] [--batch 65536]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from embedlab._io import atomic_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _results import cpu_machine, cpu_name, default_out  # noqa: E402


def _query(keys, batch, dist, rng):
    if dist == "uniform":
        return keys[rng.integers(0, len(keys), batch)]
    ranks = np.arange(1, len(keys) + 1, dtype=np.float64) ** -1.05
    order = rng.permutation(len(keys))
    return keys[order[rng.choice(len(keys), size=batch, p=ranks / ranks.sum())]]


def _median_rate(fn, n_keys, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n_keys / statistics.median(times)


def _redis_benchmark_mget(server, rows, value_bytes, mget_keys, pipeline, seconds=2.0):
    """keys/s of redis-benchmark's pipelined MGET over key:%012d string keys (all present)."""
    import shutil
    exe = shutil.which("redis-benchmark")
    if exe is None:
        raise FileNotFoundError("redis-benchmark not found (Debian's redis-tools / redis-server package)")
    # calibrate the request count to ~`seconds` of work
    n = 2000
    for _ in range(3):
        cmd = [exe, "-h", "127.0.0.1", "-p", str(server.port), "-a", server.password,
               "-c", "1", "-P", str(pipeline), "-n", str(n), "-r", str(rows), "--csv",
               "MGET", *["key:__rand_int__"] * mget_keys]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        took = time.perf_counter() - t0
        if out.returncode != 0:
            raise RuntimeError(f"redis-benchmark failed: {out.stderr[-500:]}")
        if took > seconds / 2:
            break
        n = int(n * max(2.0, seconds / max(took, 1e-3)))
    line = [l for l in out.stdout.splitlines() if l.startswith('"MGET')][-1]
    rps = float(line.split(",")[1].strip('"'))
    return rps * mget_keys


def tier_results(dims=(16, 128), rows=262144, batch=65536, repeats=3, mget_keys=100, get_loop_keys=2000,
                 dists=("uniform", "zipf"), seed=0, verbose=True) -> list:
    """Runs the benchmark; returns one dict per (tier, dim, dist)."""
    from embedlab.hps.config import PersistentDBConfig, VolatileDBConfig
    from embedlab.services.redis_server import start_redis
    from embedlab.hps.tiers import RedisTier, RocksDBTier

    rng = np.random.default_rng(seed)
    out = []
    server = start_redis()
    work = Path(tempfile.mkdtemp(prefix="embedlab-bench-hps-db-"))
    try:
        for dim in dims:
            keys = np.unique(rng.integers(0, 2**62, int(rows * 1.1)))[:rows]
            rng.shuffle(keys)
            vecs = rng.standard_normal((len(keys), dim)).astype(np.float32)
            name = f"hps_et.bench.d{dim}"
            client = server.client()
            client.flushall()
            redis = RedisTier(VolatileDBConfig(type="redis_cluster", address=server.address, password=server.password,
                                               num_partitions=8, max_batch_size=65536))
            redis.add_table(name, dim)
            t0 = time.perf_counter()
            redis.insert(name, keys, vecs)
            fill_s = time.perf_counter() - t0
            # string keys for redis-benchmark and the GET loop: key:%012d -> the same value bytes
            vb = vecs.tobytes()
            rb = 4 * dim
            pipe = client.pipeline(transaction=False)
            for i in range(len(keys)):
                pipe.set(f"key:{i:012d}", vb[rb * i:rb * (i + 1)])
                if i % 20000 == 19999:
                    pipe.execute()
            pipe.execute()
            rocks = RocksDBTier(PersistentDBConfig(type="rocks_db", path=str(work / f"rocks{dim}"), max_batch_size=65536))
            rocks.add_table(name, dim)
            t0 = time.perf_counter()
            rocks.insert(name, keys, vecs, bulk=True)     # as the ParameterServer loads a table
            rocks_fill_s = time.perf_counter() - t0
            idx = rng.integers(0, len(keys), get_loop_keys)
            names = [f"key:{i:012d}" for i in idx]

            def get_loop():
                for k in names:
                    client.get(k)
            for dist in dists:
                q = _query(keys, batch, dist, rng)
                buf = np.empty((batch, dim), np.float32)
                assert redis.find(name, q, buf).size == 0 and rocks.find(name, q, buf).size == 0
                # The four measurements interleaved within each pass, so load from other processes
                # on a shared machine hits them alike; medians over the passes.
                rates = {"redis": [], "mget": [], "get": [], "rocks": []}
                for _ in range(repeats):
                    rates["redis"].append(_median_rate(lambda: redis.find(name, q, buf), batch, 1))
                    rates["mget"].append(_redis_benchmark_mget(server, len(keys), rb, mget_keys, 16, seconds=1.0))
                    rates["get"].append(_median_rate(get_loop, get_loop_keys, 1))
                    rates["rocks"].append(_median_rate(lambda: rocks.find(name, q, buf), batch, 1))
                redis_rate, bench_mget, get_rate, rocks_rate = (statistics.median(rates[k])
                                                                for k in ("redis", "mget", "get", "rocks"))
                row = {"dim": dim, "dist": dist, "rows": len(keys), "batch": batch,
                       "redis_tier_keys_s": redis_rate, "redis_benchmark_mget_keys_s": bench_mget,
                       "redis_get_loop_keys_s": get_rate, "rocksdb_tier_keys_s": rocks_rate,
                       "redis_tier_vs_redis_benchmark": redis_rate / bench_mget,
                       "redis_tier_vs_get_loop": redis_rate / get_rate,
                       "redis_fill_keys_s": len(keys) / fill_s, "rocksdb_fill_keys_s": len(keys) / rocks_fill_s,
                       "mget_keys_per_command": mget_keys, "redis_benchmark_pipeline": 16}
                out.append(row)
                if verbose:
                    print(f"dim {dim:4d} {dist:8s} redis tier {redis_rate / 1e6:6.3f} M/s  redis-benchmark MGET "
                          f"{bench_mget / 1e6:6.3f} M/s ({redis_rate / bench_mget:5.2f}x)  GET loop "
                          f"{get_rate / 1e6:6.3f} M/s ({redis_rate / get_rate:6.1f}x)  rocksdb tier "
                          f"{rocks_rate / 1e6:6.3f} M/s", flush=True)
            redis.close()
            rocks.close()
            client.flushall()
    finally:
        server.stop()
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    return out


def make_tiers(time_calls, result, check_rows) -> dict:
    """The ``redis`` and ``rocks_db`` tiers for ``helpers/benchmarks/hps.py`` (its ``TIERS``), built
    on its helpers: ``TIERS.update(hps_db.make_tiers(time_calls, result, check_rows))``.

    Each takes ``(w, args)`` (``w.keys``, ``w.values``, ``w.queries``, ``w.positions``, ``w.dim``,
    ``w.batch``) and returns result rows; the Redis rows include ``redis-benchmark`` pipelined MGET
    of the same value size and a loop of single GETs, measured on the same server.
    """
    def tier_redis(w, args):
        from embedlab.hps.config import VolatileDBConfig
        from embedlab.services.redis_server import start_redis
        from embedlab.hps.tiers import RedisTier
        server = start_redis()
        try:
            rb = 4 * w.dim
            tier = RedisTier(VolatileDBConfig(type="redis_cluster", address=server.address,
                                              password=server.password, num_partitions=8, max_batch_size=65536))
            tier.add_table("hps_et.bench.t", w.dim)
            tier.insert("hps_et.bench.t", w.keys, w.values)
            out = np.empty((w.batch, w.dim), np.float32)
            if len(tier.find("hps_et.bench.t", w.queries[0], out)):
                raise SystemExit("hps benchmark: redis lost rows")
            check_rows("redis", out, w.values[w.positions[0]])
            reps = max(1, min(3, args.reps))
            sec = time_calls([lambda q=q: tier.find("hps_et.bench.t", q, out) for q in w.queries[:2]], reps)
            client = server.client()
            vb = np.ascontiguousarray(w.values).tobytes()
            pipe = client.pipeline(transaction=False)
            for i in range(len(w.keys)):
                pipe.set(f"key:{i:012d}", vb[rb * i:rb * (i + 1)])
                if i % 20000 == 19999:
                    pipe.execute()
            pipe.execute()
            mget = _redis_benchmark_mget(server, len(w.keys), rb, 100, 16, seconds=1.0)
            names = [f"key:{int(i):012d}" for i in w.positions[0][:2000]]
            t0 = time.perf_counter()
            for k in names:
                client.get(k)
            get_s = (time.perf_counter() - t0) / len(names) * w.batch
            rows = [result(w, "redis", "redis_cluster tier (pipelined HMGET)", sec, partitions=8),
                    result(w, "redis", "redis-benchmark MGET x100, -P 16, 1 conn", w.batch / mget),
                    result(w, "redis", "redis-py GET loop", get_s)]
            rows[0]["vs_redis_benchmark"] = rows[0]["mkeys_per_s"] / rows[1]["mkeys_per_s"]
            rows[0]["vs_get_loop"] = rows[0]["mkeys_per_s"] / rows[2]["mkeys_per_s"]
            tier.close()
            return rows
        finally:
            server.stop()

    def tier_rocks_db(w, args):
        import shutil
        from embedlab.hps.config import PersistentDBConfig
        from embedlab.hps.tiers import RocksDBTier
        work = Path(tempfile.mkdtemp(prefix="embedlab-bench-rocks-"))
        try:
            tier = RocksDBTier(PersistentDBConfig(type="rocks_db", path=str(work / "db"), max_batch_size=65536))
            tier.add_table("hps_et.bench.t", w.dim)
            tier.insert("hps_et.bench.t", w.keys, w.values, bulk=True)   # as the ParameterServer loads it
            out = np.empty((w.batch, w.dim), np.float32)
            if len(tier.find("hps_et.bench.t", w.queries[0], out)):
                raise SystemExit("hps benchmark: rocks_db lost rows")
            check_rows("rocks_db", out, w.values[w.positions[0]])
            sec = time_calls([lambda q=q: tier.find("hps_et.bench.t", q, out) for q in w.queries[:2]],
                             max(1, min(3, args.reps)))
            tier.close()
            return [result(w, "rocks_db", "rocks_db tier (rocksdict multi-get)", sec)]
        finally:
            shutil.rmtree(work, ignore_errors=True)

    return {"redis": tier_redis, "rocks_db": tier_rocks_db}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    p.add_argument("--rows", type=int, default=262144)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--mget-keys", type=int, default=100)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    load_start = os.getloadavg()
    rows = tier_results(a.dims, a.rows, a.batch, a.repeats, a.mget_keys)
    import redis as redis_py
    server_version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout.strip()
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
               "redis_py": redis_py.__version__, "redis_server": server_version,
               "load_average_start": load_start, "load_average_end": os.getloadavg()}
    print(f"\n{'dim':>4} {'keys':8} {'redis tier':>11} {'r-b MGET':>10} {'ratio':>6} {'GET loop':>9} {'ratio':>7} "
          f"{'rocksdb':>9}   (M keys/s; {machine['cpu']}, {machine['cores']} cores)")
    for r in rows:
        print(f"{r['dim']:4d} {r['dist']:8} {r['redis_tier_keys_s'] / 1e6:11.3f} {r['redis_benchmark_mget_keys_s'] / 1e6:10.3f} "
              f"{r['redis_tier_vs_redis_benchmark']:6.2f} {r['redis_get_loop_keys_s'] / 1e6:9.3f} "
              f"{r['redis_tier_vs_get_loop']:7.1f} {r['rocksdb_tier_keys_s'] / 1e6:9.3f}")
    out_path = a.out or default_out("hps_db", cpu_machine())
    doc = {"command": " ".join([Path(sys.executable).name] + sys.argv), "machine": machine, "results": rows,
           "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with atomic_file(out_path) as tmp:
        tmp.write_text(json.dumps(doc, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
