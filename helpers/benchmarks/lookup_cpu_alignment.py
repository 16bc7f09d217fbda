"""Where a table's buffer starts, and what that costs EmbedLab's CPU forward; and what TensorFlow
itself adds to the op in a tf.function over the framework-free core on the same buffers.

Three parts, one process each (every part holds two copies of 26 tables of 1M x dim fp32):

* ``--part offset``: the framework-free core's forward (``lookup_forward``, 2 threads) on two
  NumPy copies of the same tables, both on 2 MiB transparent huge pages: one starting at its
  mapping (2 MiB-aligned), the other ``--offset`` bytes into its mapping (64: where TensorFlow's
  large buffers start, see below). Interleaved, same keys, same pool.
* ``--part tf``: the core on the NumPy copies, the core on the ``tf.Variable``s' own buffers (a
  zero-copy DLPack view), and the op in a ``tf.function`` of ``--steps`` chained steps
  (``embed_lab_fused_resource_lookup`` on those variables), its ids captured eager tensors
  (``--ids captured``, passed in on every call) or constants of the graph (``--ids graph``).
  The variables are built as EmbedLab
  builds its tables (``--variables embedlab``, the default: ``embedlab.tables.aligned``, each a
  2 MiB-aligned mapping on huge pages) or by ``tf.Variable(array)`` (``--variables tensorflow``:
  TensorFlow's allocator, 64 bytes into a page). Reports where each variable's buffer
  starts (mod 4096) and, per case, every thread's CPU time and run-queue wait per step
  (``/proc/self/task/*/schedstat``; the caller's includes its Python work and the sampling).
* ``--part variables``: the op in graph on ordinary ``tf.Variable``s (TensorFlow's allocator) and
  on variables built from the 2 MiB-aligned NumPy buffers through DLPack (``tf.Variable`` adopts
  such a tensor's buffer: no copy, checked), with the core on those NumPy buffers.

Each timed call comes after ``--lead-ms`` of untimed calls of the same case (as lookup_cpu.py's
peers block); median of ``--repeats``. Writes results/lookup_cpu_alignment_<machine>_<date>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
import lookup_cpu as lc  # noqa: E402


def _parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=["offset", "tf", "variables"], required=True)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--steps", type=int, default=8, help="op steps per tf.function call (--part tf)")
    p.add_argument("--variables", choices=["embedlab", "tensorflow"], default="embedlab",
                   help="--part tf: the variables built as EmbedLab builds its tables (embedlab.tables.aligned: "
                        "2 MiB-aligned, huge pages) or as tf.Variable(array) builds them (TensorFlow's allocator)")
    p.add_argument("--ids", choices=["captured", "graph"], default="captured",
                   help="--part tf: the tf.function's ids as eager tensors it captures (passed in on every call, "
                        "as lookup_cpu.py's in-graph cases do) or as constants of its graph (nothing passed in)")
    p.add_argument("--offset", type=int, default=64, help="bytes into the mapping (--part offset); a multiple of 4")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--lead-ms", type=float, default=15.0)
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    if a.offset % 4 or a.offset < 0:
        p.error("--offset must be a non-negative multiple of 4 bytes")
    return a


def _threads():
    """{tid: (name, cpu ns, run-queue wait ns)} of every thread of this process."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                s = f.read().split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            out[int(tid)] = (name, int(s[0]), int(s[1]))
        except (OSError, ValueError, IndexError):
            pass
    return out


def _time(cases, repeats, lead_ms):
    """Median / min ms per step of each case, interleaved, and per-thread CPU and run-queue wait
    (ms per step) over the timed calls. cases: name -> (fn, steps per call)."""
    me = threading.get_native_id()
    for fn, _ in cases.values():
        for _ in range(3):
            fn()
    times = {n: [] for n in cases}
    acc = {n: {} for n in cases}
    for _ in range(repeats):
        for n, (fn, k) in cases.items():
            t0 = time.perf_counter()
            fn()
            while (time.perf_counter() - t0) * 1e3 < lead_ms:
                fn()
            s0 = _threads()
            t0 = time.perf_counter()
            fn()
            times[n].append((time.perf_counter() - t0) * 1e3 / k)
            for tid, (name, cpu, wait) in _threads().items():
                b = s0.get(tid, (name, cpu, wait))
                d = acc[n].setdefault("caller" if tid == me else f"{name}:{tid}", [0, 0])
                d[0] += cpu - b[1]
                d[1] += wait - b[2]
    threads = {n: {g: {"cpu_ms": c / 1e6 / (repeats * cases[n][1]), "runq_wait_ms": w / 1e6 / (repeats * cases[n][1])}
                   for g, (c, w) in acc[n].items() if c > 0} for n in cases}
    return ({n: statistics.median(t) for n, t in times.items()}, {n: min(t) for n, t in times.items()}, threads)


def _fill(x, rng):
    for r0 in range(0, x.shape[0], 1 << 18):
        r1 = min(x.shape[0], r0 + (1 << 18))
        x[r0:r1] = rng.random((r1 - r0, x.shape[1]), dtype=np.float32) * 0.1 - 0.05


def _address(x):
    return x.__array_interface__["data"][0]


def main():
    a = _parse()
    import embedlab
    core = embedlab.core()
    T, B, R, D, K = a.tables, a.batch, a.rows, a.dim, a.steps
    rng = np.random.default_rng(a.seed)
    arrays = []
    for _ in range(T):
        x = lc._page_buffer((R, D), True)
        _fill(x, rng)
        arrays.append(x)
    batches = []
    for _ in range(K):
        offs, keys = [], []
        for _ in range(T):
            o = np.zeros(B + 1, np.int64)
            np.cumsum(rng.integers(1, 4, size=B), out=o[1:])
            offs.append(o)
            keys.append(rng.integers(0, R, size=int(o[-1]), dtype=np.int64))
        batches.append((offs, keys))
    comb = ["sum"] * T
    outs = [np.empty((B, D), np.float32) for _ in range(T)]

    def core_on(tabs):
        it = iter(range(1 << 62))

        def f():
            offs, keys = batches[next(it) % K]
            core.lookup_forward(tabs, offs, keys, None, comb, outs)
        return f

    def first_outputs(tabs):
        o = [np.empty((B, D), np.float32) for _ in range(T)]
        core.lookup_forward(tabs, batches[0][0], batches[0][1], None, comb, o)
        return [x.tobytes() for x in o]

    res = {"benchmark": "lookup_cpu_alignment", "machine": _results.cpu_machine(), "cpu": _results.cpu_name(),
           "host": platform.node(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "argv": sys.argv, "part": a.part, "dim": D, "tables": T, "rows": R, "batch": B,
           "table_kib": T * R * D * 4 // 1024, "numpy_table_addr_mod_4096": [_address(x) % 4096 for x in arrays]}
    ref = first_outputs(arrays)
    if a.part == "offset":
        shifted = []
        for x in arrays:
            m = lc._page_buffer((R * D + a.offset // 4 + 16,), True)
            y = m[a.offset // 4: a.offset // 4 + R * D].reshape(R, D)
            y[:] = x
            shifted.append(y)
        res["shifted_table_addr_mod_4096"] = [_address(y) % 4096 for y in shifted]
        res["bits_equal"] = first_outputs(shifted) == ref
        cases = {"core_aligned_ms": (core_on(arrays), 1), f"core_offset{a.offset}_ms": (core_on(shifted), 1)}
        huge = {"aligned": lc._huge_kb(arrays), "shifted": None}
        med, mins, threads = _time(cases, a.repeats, a.lead_ms)
        huge["shifted"] = lc._huge_kb(shifted)
    else:
        import tensorflow as tf
        lib = embedlab.tf_ops()
        if a.part == "tf" and a.variables == "embedlab":
            from embedlab import tables as _tables
            tables = [tf.Variable(_tables.aligned(x)) for x in arrays]
        else:
            tables = [tf.Variable(x) for x in arrays]
        res["variables"] = a.variables if a.part == "tf" else "tensorflow"
        res["ids"] = a.ids if a.part == "tf" else "captured"

        class _Capsule:  # np.from_dlpack takes an object with __dlpack__, TensorFlow gives a capsule
            def __init__(self, c):
                self.c = c

            def __dlpack__(self, stream=None, **_):
                return self.c

            def __dlpack_device__(self):
                return (1, 0)

        def view(v):  # the variable's own buffer (nothing writes the variables here)
            return np.from_dlpack(_Capsule(tf.experimental.dlpack.to_dlpack(v.value())))

        tf_arrays = [view(v) for v in tables]
        res["tf_views_are_the_variables"] = all(_address(view(v)) == _address(x) for v, x in zip(tables, tf_arrays))
        res["tf_table_addr_mod_4096"] = [_address(x) % 4096 for x in tf_arrays]
        raw = [([tf.constant(o) for o in b[0]], [tf.constant(k) for k in b[1]]) for b in batches]

        def graph_on(tabs):
            @tf.function
            def graph():
                dep = tf.constant(0.0)
                for b in range(K):
                    ids = raw[b] if a.ids == "captured" else ([tf.constant(o) for o in batches[b][0]],
                                                              [tf.constant(k) for k in batches[b][1]])
                    with tf.control_dependencies([dep]):
                        out = lib.embed_lab_fused_resource_lookup([v.handle for v in tabs], ids[0], ids[1], [],
                                                                  combiners=comb)
                    with tf.control_dependencies(out):
                        dep = tf.identity(dep)
                return dep
            return lambda: memoryview(graph())

        def op_outputs(tabs):
            got = lib.embed_lab_fused_resource_lookup([v.handle for v in tabs], raw[0][0], raw[0][1], [],
                                                      combiners=comb)
            return [g.numpy().tobytes() for g in got]

        if a.part == "tf":
            res["bits_equal"] = op_outputs(tables) == ref and first_outputs(tf_arrays) == ref
            cases = {"core_numpy_ms": (core_on(arrays), 1), "core_tf_variables_ms": (core_on(tf_arrays), 1),
                     "graph_tf_variables_ms": (graph_on(tables), K)}
        else:
            aligned = [tf.Variable(tf.experimental.dlpack.from_dlpack(x.__dlpack__())) for x in arrays]
            res["aligned_variables_adopt_numpy"] = all(_address(view(v)) == _address(x) for v, x in zip(aligned, arrays))
            res["bits_equal"] = op_outputs(tables) == ref and op_outputs(aligned) == ref
            cases = {"core_numpy_ms": (core_on(arrays), 1), "graph_tf_variables_ms": (graph_on(tables), K),
                     "graph_aligned_variables_ms": (graph_on(aligned), K)}
        med, mins, threads = _time(cases, a.repeats, a.lead_ms)
        huge = {"numpy": lc._huge_kb(arrays), "tf_variables": lc._huge_kb(tf_arrays)}  # after the op advised them
        res["tf_inter_op_threads"] = tf.config.threading.get_inter_op_parallelism_threads()
    res.update({"huge_kib": huge, "median_ms": med, "min_ms": mins, "threads_ms_per_step": threads,
                "load_average_after": os.getloadavg()[0]})
    print(json.dumps({k: res[k] for k in ("time_utc", "part", "bits_equal", "huge_kib", "median_ms", "min_ms")}, indent=1))
    out = a.out or _results.default_out(f"lookup_cpu_alignment_{a.part}", res["machine"])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
