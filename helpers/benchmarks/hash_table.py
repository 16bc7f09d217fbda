"""CPU benchmark: EmbedLab's int64 hash table vs a Python dict and TensorFlow's hash tables.

For each table size (default 1M and 10M distinct keys, uniform random int64) the script
fills every table with the same keys, then times lookups of `--queries` keys drawn from the
stored ones, uniformly (`uniform`, the cache-unfriendly case) or by a Zipf(`--zipf-a`) power law
over a random ranking of the keys (`zipf`, hot keys in cache), in batches of `--batch` keys:

* insert: the fill itself, `find_or_insert` of the fresh keys in batches (each key new).
* find: all keys present.
* find_or_insert: the same queries through find_or_insert (all present: the steady state of a
  trained model, which must still be ready to insert).

Implementations, all in the same run and on the same keys:

* `embedlab` - `embedlab.core().HashTable` on NumPy arrays, with the process pool
  (all cores) and with `num_threads=1`;
* `embedlab-tf` - the TF resource `embedlab.hash_table.HashTable`, one `tf.function` call
  per batch;
* `dict` - a Python dict, as vectorised as a dict gets: `keys.tolist()`, `map(d.get, ...)`
  (C-level iteration) into `np.fromiter` (find); for find_or_insert the same map, then a
  Python loop over the misses only with `d.setdefault(k, len(d))` (the same dense values);
* `tf-mutable` - `tf.lookup.experimental.MutableHashTable` (int64 -> int64, default -1);
* `tf-dense` - `tf.lookup.experimental.DenseHashTable` (empty_key INT64_MIN, deleted_key
  INT64_MIN + 1, so those two keys are not valid there).
  The TensorFlow tables have no find_or_insert: their fill is a plain `insert` of precomputed
  dense values (a lower bound), and their find_or_insert is what a TensorFlow user writes
  (lookup, `tf.unique` of the misses, insert with size() + range, lookup again), in a
  `tf.function`.

Each query figure is the median over `--repeats` passes, the implementations interleaved
within each pass, so load from other processes on a shared machine hits them alike; the fill
is timed once. Reported as million keys per second and as the ratio embedlab / other.

Prints a table and writes JSON (default docs/benchmarks/results/hash_table_<machine>_<UTC time>.json).

Usage:
    .venv/bin/python helpers/benchmarks/hash_table.py --sizes 1000000 10000000
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from embedlab._io import atomic_file

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402

I64_MIN = np.iinfo(np.int64).min


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--queries", type=int, default=2_000_000, help="keys looked up per timed pass")
    p.add_argument("--batch", type=int, default=65_536, help="keys per call")
    p.add_argument("--dists", nargs="+", default=["uniform", "zipf"], choices=["uniform", "zipf"])
    p.add_argument("--zipf-a", type=float, default=1.1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--impls", nargs="+",
                   default=["embedlab", "embedlab-1t", "embedlab-tf", "dict", "tf-mutable", "tf-dense"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", type=Path, default=None)
    return p.parse_args()


def batches(a, b):
    return [a[i:i + b] for i in range(0, len(a), b)]


# ---- implementations: each gives fill(batches), find(batches), find_or_insert(batches) ----------

class Embedlab:
    def __init__(self, core, num_threads):
        self.t = core.HashTable(1024, num_threads=num_threads)

    def prepare(self, arrays):
        return arrays

    def fill(self, bs):
        for b in bs:
            self.t.find_or_insert(b)

    def find(self, bs):
        return [self.t.find(b) for b in bs]

    def find_or_insert(self, bs):
        return [self.t.find_or_insert(b) for b in bs]

    def size(self):
        return self.t.size()


class EmbedlabTf:
    def __init__(self, tf):
        from embedlab.hash_table import HashTable
        self.tf = tf
        self.t = HashTable(1024, name="bench")
        spec = [tf.TensorSpec([None], tf.int64)]
        self._find = tf.function(self.t.find, input_signature=spec)
        self._foi = tf.function(lambda k: self.t.find_or_insert(k), input_signature=spec)

    def prepare(self, arrays):
        return [self.tf.constant(a) for a in arrays]

    def fill(self, bs):
        for b in bs:
            self._foi(b)

    def find(self, bs):
        return [self._find(b) for b in bs]

    def find_or_insert(self, bs):
        return [self._foi(b) for b in bs]

    def size(self):
        return int(self.t.size())


class PyDict:
    """The C-level paths of a dict: map(d.get) over the batch, a Python loop only for misses."""

    def __init__(self):
        self.d = {}

    def prepare(self, arrays):
        return arrays

    def _find_or_insert(self, b):
        d = self.d
        keys = b.tolist()
        vals = list(map(d.get, keys))
        if None in vals:
            for i, v in enumerate(vals):
                if v is None:
                    vals[i] = d.setdefault(keys[i], len(d))
        return np.array(vals, dtype=np.int64)

    def fill(self, bs):
        for b in bs:
            self._find_or_insert(b)

    def find(self, bs):
        get = self.d.get
        return [np.fromiter(map(get, b.tolist(), itertools.repeat(-1)), np.int64, count=len(b)) for b in bs]

    def find_or_insert(self, bs):
        return [self._find_or_insert(b) for b in bs]

    def size(self):
        return len(self.d)


class TfTable:
    def __init__(self, tf, dense):
        self.tf = tf
        if dense:
            self.t = tf.lookup.experimental.DenseHashTable(
                tf.int64, tf.int64, default_value=-1, empty_key=I64_MIN, deleted_key=I64_MIN + 1,
                initial_num_buckets=1024)
        else:
            self.t = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=-1)
        spec = [tf.TensorSpec([None], tf.int64)]
        t = self.t

        @tf.function(input_signature=spec * 2)
        def insert(k, v):
            t.insert(k, v)

        @tf.function(input_signature=spec)
        def find(k):
            return t.lookup(k)

        @tf.function(input_signature=spec)
        def find_or_insert(k):
            v = tf.ensure_shape(t.lookup(k), [None])
            missing = tf.boolean_mask(k, v < 0)
            new, _ = tf.unique(missing)
            t.insert(new, t.size() + tf.range(tf.size(new, out_type=tf.int64), dtype=tf.int64))
            return t.lookup(k)

        self._insert, self._find, self._foi = insert, find, find_or_insert
        self._next = 0

    def prepare(self, arrays):
        return [self.tf.constant(a) for a in arrays]

    def fill(self, bs):
        for b in bs:  # fresh unique keys: values are the dense positions (a lower bound)
            n = int(b.shape[0])
            self._insert(b, self.tf.range(self._next, self._next + n, dtype=self.tf.int64))
            self._next += n

    def find(self, bs):
        return [self._find(b) for b in bs]

    def find_or_insert(self, bs):
        return [self._foi(b) for b in bs]

    def size(self):
        return int(self.t.size())


def make(name, core, tf):
    if name == "embedlab":
        return Embedlab(core, 0)
    if name == "embedlab-1t":
        return Embedlab(core, 1)
    if name == "embedlab-tf":
        return EmbedlabTf(tf)
    if name == "dict":
        return PyDict()
    if name == "tf-mutable":
        return TfTable(tf, dense=False)
    if name == "tf-dense":
        return TfTable(tf, dense=True)
    raise ValueError(f"unknown implementation {name!r}")


def as_numpy(x):
    return x if isinstance(x, np.ndarray) else x.numpy()


def run_size(n, a, core, tf, rng):
    keys = np.unique(rng.integers(I64_MIN + 2, np.iinfo(np.int64).max, size=int(n * 1.01) + 16, dtype=np.int64))
    keys = rng.permutation(keys)[:n]  # n distinct keys in random order
    assert len(keys) == n
    fill_batches = batches(keys, a.batch)
    rows = []
    impls = {}
    print(f"\n== {n:,} keys: filling", flush=True)
    for name in a.impls:
        impl = make(name, core, tf)
        empty = impl.prepare([np.zeros(0, np.int64)])
        impl.fill(empty)  # traces the tf.functions outside the timing
        impl.find(empty)
        impl.find_or_insert(empty)
        bs = impl.prepare(fill_batches)
        gc.collect()
        t0 = time.perf_counter()
        impl.fill(bs)
        dt = time.perf_counter() - t0
        assert impl.size() == n, (name, impl.size())
        impls[name] = impl
        rows.append({"size": n, "dist": "fresh", "op": "insert", "impl": name, "seconds": dt,
                     "mkeys_per_s": n / dt / 1e6})
        print(f"   {name:12s} insert {n / dt / 1e6:8.2f} M keys/s", flush=True)

    for dist in a.dists:
        if dist == "uniform":
            idx = rng.integers(0, n, size=a.queries)
        else:
            ranks = (rng.zipf(a.zipf_a, size=a.queries) - 1) % n
            idx = rng.permutation(n)[ranks]
        q = keys[idx]
        want = None
        prepared = {name: impl.prepare(batches(q, a.batch)) for name, impl in impls.items()}
        times = {(name, op): [] for name in impls for op in ("find", "find_or_insert")}
        load_before = os.getloadavg()[0]
        for rep in range(a.repeats + 1):  # pass 0 warms up (traces, page faults), not timed
            for op in ("find", "find_or_insert"):
                for name, impl in impls.items():
                    fn = getattr(impl, op)
                    t0 = time.perf_counter()
                    out = fn(prepared[name])
                    dt = time.perf_counter() - t0
                    if rep == 0:  # every implementation agrees with the first (values are dense)
                        got = np.concatenate([as_numpy(o) for o in out]) if out else np.zeros(0, np.int64)
                        if want is None:
                            want = got
                        elif not np.array_equal(got, want):
                            raise AssertionError(f"{name} {op} disagrees with {a.impls[0]} ({dist}, {n} keys)")
                    else:
                        times[(name, op)].append(dt)
        load_after = os.getloadavg()[0]
        for (name, op), ts in times.items():
            med = statistics.median(ts)
            rows.append({"size": n, "dist": dist, "op": op, "impl": name, "seconds": med, "seconds_all": ts,
                         "mkeys_per_s": a.queries / med / 1e6, "load_average_before": load_before,
                         "load_average_after": load_after})
        print(f"   {dist}: done (load {load_before:.1f} -> {load_after:.1f})", flush=True)
        assert all(impl.size() == n for impl in impls.values())
    del impls
    gc.collect()
    return rows


def main():
    a = parse_args()
    import embedlab
    tf = embedlab.import_tensorflow()   # without TensorFlow's C++ start-up banner; TF_CPP_MIN_LOG_LEVEL=2 unless set
    import embedlab
    core = embedlab.core()
    rng = np.random.default_rng(a.seed)
    rows = []
    for n in a.sizes:
        rows += run_size(n, a, core, tf, rng)
    base = {(r["size"], r["dist"], r["op"]): r["mkeys_per_s"] for r in rows if r["impl"] == "embedlab"}
    for r in rows:
        b = base.get((r["size"], r["dist"], r["op"]))
        r["embedlab_speedup"] = b / r["mkeys_per_s"] if b else None

    machine = {"name": _results.cpu_machine(), "cpu": _results.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
               "tensorflow": tf.__version__, "numpy": np.__version__}
    print(f"\nM keys/s (median of {a.repeats}; batch {a.batch:,}; {a.queries:,} queries per pass); "
          f"x = embedlab / this; {machine['cpu']}, {machine['cores']} cores, TF {tf.__version__}")
    hdr = f"{'size':>11s} {'keys':8s} {'op':15s}" + "".join(f"{n:>20s}" for n in a.impls)
    print(hdr)
    for n in a.sizes:
        for dist, op in [("fresh", "insert")] + [(d, o) for d in a.dists for o in ("find", "find_or_insert")]:
            cells = []
            for name in a.impls:
                r = next(r for r in rows if (r["size"], r["dist"], r["op"], r["impl"]) == (n, dist, op, name))
                s = r["embedlab_speedup"]
                cells.append(f"{r['mkeys_per_s']:9.2f}" + (f" ({s:5.1f}x)" if name != "embedlab" and s else " " * 8))
            print(f"{n:>11,d} {dist:8s} {op:15s}" + "".join(f"{c:>20s}" for c in cells))

    out_path = a.out or _results.default_out("hash_table", _results.cpu_machine())
    out = {"command": " ".join([Path(sys.executable).name] + sys.argv), "machine": machine,
           "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "results": rows, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with atomic_file(out_path) as tmp:
        tmp.write_text(json.dumps(out, indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
