"""CPU benchmark of the Hierarchical Parameter Server's tiers: keys/s per tier, with baselines.

    .venv/bin/python helpers/benchmarks/hps.py                 # every tier, dims 16 and 128
    .venv/bin/python helpers/benchmarks/hps.py --tiers cache hash_map --dims 16

One run, one machine: for each dim (16, 128) and key distribution (uniform, Zipf(1.05) with the
hot keys spread over the table) a table of --rows random int64 keys is built, and batches of
--batch keys drawn from it are looked up through each tier, round-robin over 8 different
batches, median of --reps. The baselines a user would otherwise write run in the same process
on the same batches:
  * "dict + np.take": a Python dict key -> row index, then numpy.take of the rows;
  * "np.take (indices known)": numpy.take with the row indices precomputed, no key lookup at all,
    the floor of any gather of these rows.

Tiers: one function per tier, registered in TIERS, all with the signature

    def tier_<name>(w: Workload, args: argparse.Namespace) -> list[dict]

`w` holds the table (w.keys int64[rows], w.values float32[rows, dim]) and the query batches
(w.queries, with w.positions: each query key's row in the table); the function builds its tier
from the table (untimed), times its lookups of w.queries with time_calls(), checks a batch
against w.values (exact), and returns result rows made by result(...). Each row is one
implementation; the baselines are tiers of their own ("baseline").

Prints a table and writes JSON to docs/benchmarks/results/hps_<machine>_<date>T<time>Z.json (or --out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def load_core():
    if os.environ.get("EMBEDLAB_CORE_STANDALONE"):
        import _embedlab_core
        return _embedlab_core
    import embedlab  # the installed package (make setup)
    return embedlab.core()


@dataclass
class Workload:
    dim: int
    dist: str  # "uniform" | "zipf"
    batch: int
    keys: np.ndarray       # int64[rows], unique, random
    values: np.ndarray     # float32[rows, dim]
    queries: list = field(default_factory=list)    # int64[batch] key batches (every key is in the table)
    positions: list = field(default_factory=list)  # int64[batch]: row of each query key in keys/values


def time_calls(calls, reps, warmup=1):
    """Median seconds per call of `calls` (thunks) run round-robin, over reps passes."""
    for _ in range(warmup):
        for f in calls:
            f()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for f in calls:
            f()
        times.append((time.perf_counter() - t0) / len(calls))
    return float(np.median(times))


def result(w, tier, impl, seconds, **extra):
    r = {"tier": tier, "impl": impl, "dim": w.dim, "dist": w.dist, "batch": w.batch, "ms": seconds * 1e3,
         "mkeys_per_s": w.batch / seconds / 1e6}
    r.update(extra)
    return r


def check_rows(name, out, expected):
    if not np.array_equal(out, expected):
        raise SystemExit(f"hps benchmark: {name} returned wrong rows")


# ---- tiers ----------------------------------------------------------------------------------------

def tier_baseline(w, args):
    """What a user would write without the HPS: a dict + np.take, and np.take with known rows."""
    index = {k: i for i, k in enumerate(w.keys.tolist())}
    out = np.empty((w.batch, w.dim), np.float32)

    def dict_take(q):
        idx = np.fromiter((index[k] for k in q.tolist()), dtype=np.int64, count=len(q))
        np.take(w.values, idx, axis=0, out=out)

    dict_take(w.queries[0])
    check_rows("dict + np.take", out, w.values[w.positions[0]])
    rows = [result(w, "baseline", "dict + np.take",
                   time_calls([lambda q=q: dict_take(q) for q in w.queries], max(1, args.reps // 2)))]
    rows.append(result(w, "baseline", "np.take (indices known)",
                       time_calls([lambda p=p: np.take(w.values, p, axis=0, out=out) for p in w.positions],
                                  args.reps)))
    return rows


def tier_cache(w, args):
    """The embedding cache's hit path (EmbeddingCache.lookup), dynamic and static."""
    core = load_core()
    rows = []
    out = np.empty((w.batch, w.dim), np.float32)
    for static in (False, True):
        cache = core.EmbeddingCache(len(w.keys), w.dim, ways=8, static=static, num_threads=args.threads)
        cache.insert(w.keys, w.values)
        # Only the hit path is timed: each batch is reduced to its keys that stayed cached (a full
        # set evicts, or, static, rejects), padded back to the batch size with cached keys.
        qs = []
        for q, p in zip(w.queries, w.positions):
            miss = cache.lookup(q, out)
            keep = np.delete(np.arange(len(q)), miss)
            sel = np.resize(keep, len(q))
            qs.append((q[sel].copy(), p[sel].copy()))
        miss = cache.lookup(qs[0][0], out)
        if len(miss):
            raise SystemExit("hps benchmark: cache hit batch has misses")
        check_rows("cache", out, w.values[qs[0][1]])
        sec = time_calls([lambda q=q: cache.lookup(q, out) for q, _ in qs], args.reps)
        rows.append(result(w, "cache", f"EmbeddingCache {'static' if static else 'dynamic'}", sec,
                           cached_fraction=cache.size() / len(w.keys), threads=args.threads))
    return rows


def tier_hash_map(w, args):
    """The volatile DB in process: hash_map (partitions in turn) and parallel_hash_map."""
    core = load_core()
    rows = []
    out = np.empty((w.batch, w.dim), np.float32)
    for parallel in (False, True):
        store = core.HashMapStore(w.dim, num_partitions=args.partitions, parallel=parallel, num_threads=args.threads)
        store.insert(w.keys, w.values)
        if len(store.find(w.queries[0], out)):
            raise SystemExit("hps benchmark: hash_map lost rows")
        check_rows("hash_map", out, w.values[w.positions[0]])
        sec = time_calls([lambda q=q: store.find(q, out) for q in w.queries], args.reps)
        rows.append(result(w, "hash_map", "parallel_hash_map" if parallel else "hash_map", sec,
                           partitions=args.partitions, threads=args.threads))
    return rows


TIERS = {"baseline": tier_baseline, "cache": tier_cache, "hash_map": tier_hash_map}
# The database tiers (redis with its redis-benchmark and GET-loop baselines, rocks_db): hps_db.py.
sys.path.insert(0, str(Path(__file__).resolve().parent))
import hps_db  # noqa: E402
from _results import cpu_machine, cpu_name, default_out  # noqa: E402
TIERS.update(hps_db.make_tiers(time_calls, result, check_rows))


# ---- workloads ------------------------------------------------------------------------------------

def zipf_positions(rng, n, rows, alpha=1.05):
    z = (rng.zipf(alpha, size=n).astype(np.int64) - 1) % rows
    return (z * 2654435761) % rows  # hot ranks spread over the table


def make_workloads(args, dim, rng):
    keys = np.unique(rng.integers(-(2**62), 2**62, size=int(args.rows * 1.01), dtype=np.int64))[: args.rows]
    rng.shuffle(keys)
    values = rng.standard_normal((len(keys), dim), dtype=np.float32)
    for dist in args.dists:
        w = Workload(dim, dist, args.batch, keys, values)
        for _ in range(8):
            p = rng.integers(0, len(keys), size=args.batch) if dist == "uniform" \
                else zipf_positions(rng, args.batch, len(keys))
            w.positions.append(p)
            w.queries.append(keys[p])
        yield w


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiers", nargs="+", default=list(TIERS), choices=list(TIERS))
    p.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    p.add_argument("--dists", nargs="+", default=["uniform", "zipf"], choices=["uniform", "zipf"])
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--rows", type=int, default=1 << 20, help="table rows (every tier holds all of them)")
    p.add_argument("--partitions", type=int, default=16, help="hash_map num_partitions")
    p.add_argument("--threads", type=int, default=0, help="native threads (0 = all cores)")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="", help="JSON path (default: results/hps_<machine>_<date>T<time>Z.json)")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for dim in args.dims:
        for w in make_workloads(args, dim, rng):
            for name in args.tiers:
                for r in TIERS[name](w, args):
                    rows.append(r)
                    print(f"dim {r['dim']:4d} {r['dist']:8s} {r['tier']:9s} {r['impl']:28s} "
                          f"{r['mkeys_per_s']:8.2f} M keys/s  ({r['ms']:.2f} ms / batch)", flush=True)
    # Ratios within the run (the machine may be shared: compare within one run only).
    for r in rows:
        base = [b for b in rows if b["dim"] == r["dim"] and b["dist"] == r["dist"] and b["impl"] == "dict + np.take"]
        if base:
            r["vs_dict_take"] = r["mkeys_per_s"] / base[0]["mkeys_per_s"]
        floor = [b for b in rows if b["dim"] == r["dim"] and b["dist"] == r["dist"]
                 and b["impl"] == "np.take (indices known)"]
        if floor:
            r["vs_np_take"] = r["mkeys_per_s"] / floor[0]["mkeys_per_s"]
    print()
    print(f"{'dim':>4} {'dist':>8} {'tier / impl':40s} {'M keys/s':>9} {'x dict':>7} {'x take':>7}")
    for r in rows:
        print(f"{r['dim']:>4} {r['dist']:>8} {r['tier'] + ' / ' + r['impl']:40s} {r['mkeys_per_s']:>9.2f} "
              f"{r.get('vs_dict_take', float('nan')):>7.2f} {r.get('vs_np_take', float('nan')):>7.2f}")
    res = {"benchmark": "hps", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": " ".join([Path(sys.executable).name] + sys.argv), "cpu": cpu_name(),
           "cores": os.cpu_count(), "load_average_at_end": os.getloadavg(), "args": vars(args), "rows": rows}
    out = Path(args.out) if args.out else default_out("hps", cpu_machine())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
