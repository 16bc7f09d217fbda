"""CPU benchmark: EmbedLab's fused lookup vs `tf.nn.safe_embedding_lookup_sparse`, Criteo shape.

26 tables of `rows` x dim float32 (default 1M rows; dims 16, 64, 128), batch 4,096, 1-3 keys
per row drawn uniformly from the table (`--keys uniform`, the cache-unfriendly case) or from a
Zipf(1.1) power law like Criteo's categories (`--keys zipf`), one `tf.SparseTensor` of ids per
table, the same tensors and the same table variables for both sides. Everything runs inside
`tf.function`, warmed up; each figure is the median over `--repeats` timed calls, and all
cases are timed in turn within each repeat, so load from other processes on a shared machine
hits them alike (the 1-minute load average is recorded next to each row).

Measured, per dim, in the same run:

* forward: `embedlab.ops.fused_embedding_lookup` over the 26 tables (one op) vs 26 calls of
  `tf.nn.safe_embedding_lookup_sparse` (the op a TensorFlow user would otherwise pick). The
  EmbedLab side is timed twice: with the same COO `SparseTensor` (canonical, so the CPU
  kernel reads each key's row from the indices in its one pass; unordered COO would be sorted
  by row first) and with pre-built CSR (`tf.RaggedTensor`) input.
* in graph: the forward and the train steps again, `--steps-per-call` (K) steps per
  tf.function call, like Keras' `steps_per_execution`, so that TensorFlow's per-call Python
  overhead (milliseconds for 26 SparseTensor arguments, the same for both
  sides) is paid once per K steps. Every step uses the next of K batches of fresh keys (also
  in the per-call cases), so no step finds its rows in cache from the step before.
* call overhead: a tf.function with a no-op body called with the same 26 SparseTensors. Every
  per-call case pays it on both sides, so a per-call ratio cannot exceed native time / overhead.
* streaming read: a 1 GiB buffer read whole, in order (`tf.reduce_max`, in graph), the
  machine's streaming read rate in this run. (Not the tables themselves: once a sparse op has
  touched a variable, TensorFlow copies it whole on every plain read.) A forward must read each
  key's row; at that rate (the best seen; random rows are slower) those bytes alone take
  `fwd_floor_stream_ms`, so no forward kernel can beat TensorFlow's by more than
  `graph_fwd_ratio_stream_ceiling` = TensorFlow's in-graph forward / that floor.
* optimizer in backward: EmbedLab's step with `fused_embedding_lookup(..., optimizer=SGD)`,
  where one op sums the gradient rows and updates the tables (no IndexedSlices tensors).
* train step: forward, backward (`GradientTape`) and an SGD update with
  `embedlab.optimizers.SGD` vs the native step
  (safe_embedding_lookup_sparse + tape + `keras.optimizers.SGD`). Both use the loss
  sum_t sum(out_t * r_t) with fixed random r_t. Traced in a tf.function, `apply_gradients` fuses
  the update with the lookup's backward (one op, like "optimizer in backward"); the in-graph
  step is also timed with `fuse_lookup_backward=False` (the backward's IndexedSlices, then the
  sparse SGD op). Forward+backward without the update is timed
  too, and so are the pieces of EmbedLab's step on their own (the standalone COO->CSR op
  `ops.to_csr`, which lookups on CPU variables do not need; the forward, backward and SGD
  apply kernels), to show where the time goes.

Peers (when torch imports; `make bench-peers` runs this script in an environment with torch's
CPU wheel, `--peers only` skips the TensorFlow-vs-TensorFlow block): torch.nn.EmbeddingBag
against EmbedLab's framework-free core and its TensorFlow op, all on the very same tables (NumPy
buffers on 2 MiB huge pages, or 4 KiB with `--peer-pages 4k`, that torch wraps without a copy),
forward and train step, interleaved in one process; see `run_peers`. torch's OpenMP threads spin
for milliseconds after each call by default and would slow what runs next in the process, so
each timed call of the peers block comes after untimed calls of its own case lasting twice the
longest such spin measured in the run (`--peer-lead-ms`); `OMP_WAIT_POLICY=PASSIVE` in the
environment makes torch's threads sleep at once (docs/benchmarks/index.md reports both).

Prints a table with ratios and writes JSON (default
docs/benchmarks/results/lookup_cpu_<machine>_<date>.json; see _results.py).

Usage:
    PYTHONPATH=helpers python helpers/benchmarks/lookup_cpu.py --dims 16 64 128 --repeats 20
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _results  # noqa: E402
_STREAM_FLOATS = 2**28  # 1 GiB of float32 for the streaming-read rate


def _parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dims", type=int, nargs="+", default=[16, 64, 128])
    p.add_argument("--repeats", type=int, default=20, help="timed calls per measurement (median)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows per table")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--max-keys", type=int, default=3, help="keys per row drawn from 1..max")
    p.add_argument("--keys", choices=["uniform", "zipf"], default="uniform",
                   help="key distribution: uniform over the rows (cache-unfriendly) or Zipf(1.1) "
                        "power law like Criteo's categories (hot rows stay in cache)")
    p.add_argument("--steps-per-call", type=int, default=8,
                   help="steps per tf.function call in the in-graph measurement (like Keras' "
                        "steps_per_execution); each step takes the next of this many batches")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", choices=["auto", "only", "off"], default="auto",
                   help="the peers block (torch's EmbeddingBag beside EmbedLab's framework-free core and its "
                        "TensorFlow op on the same tables): auto = when torch imports, only = skip the "
                        "TensorFlow-vs-TensorFlow block, off = never")
    p.add_argument("--peer-pages", choices=["huge", "4k"], default="huge",
                   help="pages of the peers block's tables (one buffer per table, read by every side): "
                        "2 MiB transparent huge pages (MADV_HUGEPAGE) or 4 KiB pages (MADV_NOHUGEPAGE, "
                        "and EMBEDLAB_HUGE_PAGES=0 for the TensorFlow copies)")
    p.add_argument("--peer-lead-ms", type=float, default=None,
                   help="peers block: untimed calls of a case for this long before each of its timed calls "
                        "(default: twice the longest time any case leaves threads running after it returns, "
                        "at least 10 ms; 0 = one call per case in turn, each right after the case before)")
    p.add_argument("--peer-gap-ms", type=float, default=0.0,
                   help="peers block: sleep this long before each timed call (after the lead-in)")
    p.add_argument("--out", type=Path, default=None,
                   help="JSON path (default results/lookup_cpu_<machine>_<date>.json)")
    return p.parse_args()


def _interleaved_ms(cases, warmup, repeats, lead_ms=0.0, gap_ms=0.0):
    """Median ms per case, the cases timed in turn within each repeat.

    On a shared machine, load that comes and goes then hits every case alike, so the ratios
    stay meaningful even when the absolute times move.

    lead_ms > 0: before its timed call, each case runs untimed calls of itself until lead_ms have
    passed since its turn began (at least one), so that threads the case before it left running
    (torch's OpenMP workers keep spinning for milliseconds after a call) have gone quiet, and the
    timed call finds the machine as a loop of that case alone would leave it: its own threads in
    their steady state, no one else's. gap_ms > 0: a sleep before each timed call instead (on a
    VM an idle gap is no neutral start either: see docs/benchmarks/index.md, peers).
    """
    for fn, arg in cases.values():
        for _ in range(warmup):
            _block(fn(arg))
    times = {name: [] for name in cases}
    for _ in range(repeats):
        for name, (fn, arg) in cases.items():
            if lead_ms > 0:
                t_lead = time.perf_counter()
                _block(fn(arg))
                while (time.perf_counter() - t_lead) * 1e3 < lead_ms:
                    _block(fn(arg))
            if gap_ms > 0:
                time.sleep(gap_ms / 1e3)
            t0 = time.perf_counter()
            _block(fn(arg))
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}, \
           {name: min(t) for name, t in times.items()}


class _Cycle:
    """Calls fn with the next of several inputs on every call (fresh keys each step)."""

    def __init__(self, fn, inputs):
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self, _):
        x = self.inputs[self.i % len(self.inputs)]
        self.i += 1
        return self.fn(x)


def _block(res):
    # Waits until the first result tensor is computed (no async executor hides time), without
    # copying it: `memoryview` of a CPU tensor is a view, where `.numpy()` would copy the whole
    # tensor into a fresh NumPy array (at dim 128 a 2 MiB copy per call, which the eager cases
    # would pay and the in-graph ones, returning a scalar, would not).
    import tensorflow as tf
    flat = tf.nest.flatten(res)
    if flat and isinstance(flat[0], tf.Tensor):  # the peers' cases (torch, NumPy) return None: synchronous
        memoryview(flat[0])


def _available_bytes():
    try:
        import psutil
        return psutil.virtual_memory().available
    except ImportError:
        return None


def _cpu_name():
    return _results.cpu_name()


def run_dim(dim, a, tf, keras, ops, eopt, embedlab):
    rng = np.random.default_rng(a.seed + dim)
    T, B = a.tables, a.batch
    print(f"[dim {dim}] creating {T} tables of {a.rows:,} x {dim} "
          f"({T * a.rows * dim * 4 / 2**30:.2f} GiB)...", flush=True)
    from embedlab import tables as _tables  # built as EmbedLab builds its layers' tables: 2 MiB-aligned, huge pages
    tables = [tf.Variable(_tables.aligned(tf.random.uniform([a.rows, dim], -0.05, 0.05, seed=a.seed + t)),
                          name=f"table_{t}") for t in range(T)]
    perm = rng.permutation(a.rows).astype(np.int64) if a.keys == "zipf" else None
    K = a.steps_per_call
    batches = []  # K batches of fresh keys: consecutive steps do not find their rows in cache
    for _ in range(K):
        sp_ids, rg_ids = [], []
        nkeys = 0
        for _ in range(T):
            counts = rng.integers(1, a.max_keys + 1, size=B)
            nkeys += int(counts.sum())
            if a.keys == "uniform":
                keys = rng.integers(0, a.rows, size=int(counts.sum()), dtype=np.int64)
            else:  # power law over ranks, ranks scattered over the table by a fixed permutation
                ranks = (rng.zipf(1.1, size=int(counts.sum())) - 1) % a.rows
                keys = perm[ranks]
            rows = np.repeat(np.arange(B, dtype=np.int64), counts)
            cols = np.concatenate([np.arange(c) for c in counts]).astype(np.int64)
            sp_ids.append(tf.SparseTensor(np.stack([rows, cols], 1), keys, [B, a.max_keys]))
            rg_ids.append(tf.RaggedTensor.from_row_lengths(keys, counts.astype(np.int64)))
        batches.append((sp_ids, rg_ids))
    sp_ids, rg_ids = batches[0]
    r = [tf.constant(rng.standard_normal((B, dim)).astype(np.float32)) for _ in range(T)]
    # For the streaming-read rate: a variable no sparse op ever touches (see stream_read).
    stream_buf = tf.Variable(tf.fill([_STREAM_FLOATS], 1.0), name="stream_buf")

    @tf.function(reduce_retracing=True)
    def fwd_native(ids):
        return [tf.nn.safe_embedding_lookup_sparse(tables[t], ids[t], combiner="sum") for t in range(T)]

    @tf.function(reduce_retracing=True)
    def fwd_embedlab(ids):
        return ops.fused_embedding_lookup(tables, ids, "sum")

    def _loss(outs):
        return tf.add_n([tf.reduce_sum(o * r[t]) for t, o in enumerate(outs)])

    @tf.function(reduce_retracing=True)
    def grad_native(ids):
        with tf.GradientTape() as tape:
            loss = _loss([tf.nn.safe_embedding_lookup_sparse(tables[t], ids[t], combiner="sum")
                          for t in range(T)])
        g = tape.gradient(loss, tables)
        return [x.values for x in g]

    @tf.function(reduce_retracing=True)
    def grad_embedlab(ids):
        with tf.GradientTape() as tape:
            loss = _loss(ops.fused_embedding_lookup(tables, ids, "sum"))
        g = tape.gradient(loss, tables)
        return [x.values for x in g]

    k_sgd = keras.optimizers.SGD(learning_rate=0.01)
    k_sgd.build(tables)
    e_sgd = eopt.SGD(learning_rate=0.01)
    e_sgd.build(tables)

    @tf.function(reduce_retracing=True)
    def step_native(ids):
        with tf.GradientTape() as tape:
            loss = _loss([tf.nn.safe_embedding_lookup_sparse(tables[t], ids[t], combiner="sum")
                          for t in range(T)])
        k_sgd.apply_gradients(zip(tape.gradient(loss, tables), tables))
        return loss

    def step_with(opt):
        @tf.function(reduce_retracing=True)
        def step(ids):
            with tf.GradientTape() as tape:
                loss = _loss(ops.fused_embedding_lookup(tables, ids, "sum"))
            opt.apply_gradients(zip(tape.gradient(loss, tables), tables))
            return loss
        return step

    f_sgd = eopt.SGD(learning_rate=0.01)
    f_sgd.build(tables)
    u_sgd = eopt.SGD(learning_rate=0.01, fuse_lookup_backward=False)
    u_sgd.build(tables)
    step_embedlab = step_with(e_sgd)  # apply_gradients fuses the update into the backward
    # The same code with the fusion turned off: the backward writes IndexedSlices tensors and a
    # second op applies them.
    step_embedlab_unfused = step_with(u_sgd)

    @tf.function(reduce_retracing=True)
    def step_embedlab_fused(ids):
        # The optimizer inside the backward: one op sums the gradient rows and updates the tables.
        with tf.GradientTape() as tape:
            loss = _loss(ops.fused_embedding_lookup(tables, ids, "sum", optimizer=f_sgd))
        tape.gradient(loss, tables)
        return loss

    @tf.function(reduce_retracing=True)
    def call_overhead(ids):
        # Nothing but the call: what TensorFlow charges a Python loop for passing the 26
        # SparseTensors into a tf.function, paid alike by both sides of every per-call case.
        return tf.constant(0.0)

    @tf.function
    def stream_read(_):
        # The buffer read once, front to back, and nothing else worth timing: the rate at which
        # this machine, in this run, streams memory in with TensorFlow's threads.
        return tf.reduce_max(stream_buf)

    def in_graph(step, kind="sp"):
        """K steps in one tf.function call, step b on batch b (ids captured, not passed; "sp":
        the COO SparseTensors, "rg": the same ids pre-built as CSR RaggedTensors).

        Like Keras' steps_per_execution: TensorFlow's per-call Python overhead (milliseconds
        for 26 SparseTensor arguments, the same for both sides) is paid once per K
        steps. Each step starts after the previous one finished (control dependency), so
        neither side overlaps steps.
        """
        def run(_):
            dep = tf.constant(0.0)
            for b in range(K):
                # Every component of the ids (indices, values, shape; or values and row splits)
                # goes through an identity under the dependency: an op that reads only the
                # values (TensorFlow's unique and gather) must not start step b before step
                # b - 1 has finished either.
                with tf.control_dependencies([dep]):
                    ids = [tf.nest.map_structure(tf.identity, x, expand_composites=True)
                           for x in batches[b][0 if kind == "sp" else 1]]
                res = step(ids)
                if isinstance(res, tf.Tensor):
                    dep = res
                else:  # wait for every output without ops that read them (same for both sides)
                    with tf.control_dependencies(res):
                        dep = tf.identity(dep)
            return dep
        return tf.function(run)

    # Same answer first (a benchmark of a wrong result is worthless).
    vals = [tf.convert_to_tensor(t) for t in tables]
    for t in range(T):
        want = tf.nn.safe_embedding_lookup_sparse(vals[t], sp_ids[t], combiner="sum")
        got = ops.embedding_lookup(tables[t], sp_ids[t], "sum")
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    del vals

    # The pieces of EmbedLab's train step, each alone (for "where does the time go").
    lib = embedlab.tf_ops()
    splits = [x.row_splits for x in rg_ids]
    flat = [x.values for x in rg_ids]
    comb = ["sum"] * T
    uniq = [tf.constant(np.unique(x.values.numpy())) for x in rg_ids]
    urows = [tf.constant(rng.standard_normal((int(u.shape[0]), dim)).astype(np.float32)) for u in uniq]
    pieces = {
        "piece_coo_to_csr_ms": (tf.function(lambda ids: [ops.to_csr(x)[1] for x in ids]), sp_ids),
        "piece_fwd_kernel_ms": (tf.function(lambda _: lib.embed_lab_fused_resource_lookup(
            [t.handle for t in tables], splits, flat, [], combiners=comb)), 0),
        "piece_bwd_kernel_ms": (tf.function(lambda _: lib.embed_lab_fused_lookup_grad(
            r, splits, flat, [], combiners=comb).rows), 0),
        "piece_sgd_apply_ms": (tf.function(lambda _: [lib.embed_lab_sparse_apply_sgd(
            [t.handle for t in tables], uniq, urows, tf.constant(1e-6)), tf.constant(0)][1]), 0),
    }

    res = {"dim": dim, "keys_per_batch": nkeys, "load_average_before": os.getloadavg()[0]}
    w, r_ = a.warmup, a.repeats
    print(f"[dim {dim}] timing (all cases interleaved)...", flush=True)
    # Per call: one step per tf.function call, the ids passed as arguments (cycling through
    # the K batches), as a Python training loop calls its step.
    ring = {"sp": [b[0] for b in batches], "rg": [b[1] for b in batches]}
    cyc = lambda fn, kind: (_Cycle(fn, ring[kind]), None)  # noqa: E731
    med, mins = _interleaved_ms({
        "fwd_native_ms": cyc(fwd_native, "sp"), "fwd_embedlab_coo_ms": cyc(fwd_embedlab, "sp"),
        "fwd_embedlab_csr_ms": cyc(fwd_embedlab, "rg"),
        "fwdbwd_native_ms": cyc(grad_native, "sp"), "fwdbwd_embedlab_coo_ms": cyc(grad_embedlab, "sp"),
        "step_native_ms": cyc(step_native, "sp"), "step_embedlab_coo_ms": cyc(step_embedlab, "sp"),
        "step_embedlab_csr_ms": cyc(step_embedlab, "rg"), "step_embedlab_fused_ms": cyc(step_embedlab_fused, "sp"),
        "call_overhead_ms": cyc(call_overhead, "sp"),
        "stream_read_ms": (stream_read, 0),
        # In graph: K steps per call (see in_graph); reported per step below.
        "graph_fwd_native_ms": (in_graph(fwd_native.python_function), 0),
        "graph_fwd_embedlab_ms": (in_graph(fwd_embedlab.python_function), 0),
        "graph_fwd_embedlab_csr_ms": (in_graph(fwd_embedlab.python_function, "rg"), 0),
        "graph_step_native_ms": (in_graph(step_native.python_function), 0),
        "graph_step_embedlab_ms": (in_graph(step_embedlab.python_function), 0),
        "graph_step_embedlab_unfused_ms": (in_graph(step_embedlab_unfused.python_function), 0),
        "graph_step_embedlab_fused_ms": (in_graph(step_embedlab_fused.python_function), 0),
        "graph_step_embedlab_fused_csr_ms": (in_graph(step_embedlab_fused.python_function, "rg"), 0),
        **pieces}, w, r_)
    for d in (med, mins):
        for k in d:
            if k.startswith("graph_"):
                d[k] /= K
    res.update(med)
    res["min"] = dict(mins)
    # Other processes on a shared machine show up here (1-minute load average vs cores).
    res["load_average_after"] = os.getloadavg()[0]
    res["fwd_ratio_coo"] = res["fwd_native_ms"] / res["fwd_embedlab_coo_ms"]
    res["fwd_ratio_csr"] = res["fwd_native_ms"] / res["fwd_embedlab_csr_ms"]
    res["step_ratio_coo"] = res["step_native_ms"] / res["step_embedlab_coo_ms"]
    res["step_ratio_csr"] = res["step_native_ms"] / res["step_embedlab_csr_ms"]
    res["step_ratio_fused"] = res["step_native_ms"] / res["step_embedlab_fused_ms"]
    res["graph_fwd_ratio"] = res["graph_fwd_native_ms"] / res["graph_fwd_embedlab_ms"]
    res["graph_step_ratio"] = res["graph_step_native_ms"] / res["graph_step_embedlab_ms"]
    res["graph_step_ratio_unfused"] = res["graph_step_native_ms"] / res["graph_step_embedlab_unfused_ms"]
    res["graph_step_ratio_fused"] = res["graph_step_native_ms"] / res["graph_step_embedlab_fused_ms"]
    res["graph_fwd_ratio_csr"] = res["graph_fwd_native_ms"] / res["graph_fwd_embedlab_csr_ms"]
    res["graph_step_ratio_fused_csr"] = res["graph_step_native_ms"] / res["graph_step_embedlab_fused_csr_ms"]
    # A per-call ratio cannot exceed (native time) / (call overhead), even with a kernel of zero
    # time: the ceiling the per-call cases are measured against.
    res["fwd_ratio_per_call_ceiling"] = res["fwd_native_ms"] / res["call_overhead_ms"]
    res["step_ratio_per_call_ceiling"] = res["step_native_ms"] / res["call_overhead_ms"]
    # The streaming-read bound on the forward: the batch's rows read at the best streaming rate
    # seen in this run (a generous floor: random rows are slower), against TensorFlow's forward.
    res["stream_read_gbps"] = _STREAM_FLOATS * 4 / res["stream_read_ms"] / 1e6
    res["stream_read_best_gbps"] = _STREAM_FLOATS * 4 / res["min"]["stream_read_ms"] / 1e6
    res["fwd_floor_stream_ms"] = nkeys * dim * 4 / res["stream_read_best_gbps"] / 1e6
    res["graph_fwd_ratio_stream_ceiling"] = res["graph_fwd_native_ms"] / res["fwd_floor_stream_ms"]
    res["fwd_embedlab_mkeys_s"] = nkeys / res["fwd_embedlab_coo_ms"] / 1e3
    res["fwd_native_mkeys_s"] = nkeys / res["fwd_native_ms"] / 1e3
    del tables, stream_buf
    return res


def _page_buffer(shape, huge):
    """A float32 NumPy array on its own anonymous mapping, advised onto 2 MiB huge pages or kept
    on 4 KiB pages before anything touches it (so every page is of that kind)."""
    import mmap
    n = int(np.prod(shape)) * 4
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, np.float32).reshape(shape)


def _thread_cpu_ns():
    """CPU time so far (ns) of every thread of this process, from /proc/self/task/*/schedstat."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _linger_ms(fn, window_ms=100.0, poll_ms=0.5, calls=3):
    """How long other threads of this process keep running after fn returns, in ms: fn is called
    `calls` times (its threads in their steady state), then every thread's CPU time is sampled
    every poll_ms for window_ms; the result is the time after the return of the last sample in
    which a thread other than the caller's gained more than a tenth of the interval (a spinning
    or still-working thread), 0 if none did; and how many threads did. Median of 5 tries."""
    import threading
    me = threading.get_native_id()
    tries = []
    for _ in range(5):
        time.sleep(window_ms / 1e3)  # everyone's leftovers from before have finished
        for _ in range(calls):
            _block(fn(None))
        base, t0, last, busy = _thread_cpu_ns(), time.perf_counter(), 0.0, set()
        while (el := (time.perf_counter() - t0) * 1e3) < window_ms:
            time.sleep(poll_ms / 1e3)
            now = _thread_cpu_ns()
            for tid, ns in now.items():
                if tid != me and ns - base.get(tid, ns) > poll_ms * 1e5:
                    last = (time.perf_counter() - t0) * 1e3
                    busy.add(tid)
            base = now
        tries.append((last, len(busy)))
    tries.sort()
    return tries[len(tries) // 2]


def _process_huge_kb():
    """KiB of this process's memory on transparent huge pages (/proc/self/smaps_rollup)."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _huge_kb(arrays):
    """KiB of the arrays' address ranges that sit on transparent huge pages (/proc/self/smaps)."""
    ranges = [(x.__array_interface__["data"][0], x.__array_interface__["data"][0] + x.nbytes) for x in arrays]
    total, cur = 0, None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split()
                if "-" in head[0] and len(head) >= 5:
                    lo, hi = (int(v, 16) for v in head[0].split("-"))
                    cur = (lo, hi) if any(lo < e and b < hi for b, e in ranges) else None
                elif cur and head[0] == "AnonHugePages:":
                    total += int(head[1])
    except OSError:
        return None
    return total


def run_peers(dim, a, tf, ops, eopt, embedlab, torch):
    """torch.nn.EmbeddingBag (FBGEMM's JIT EmbeddingSpMDM on the CPU) against EmbedLab on the same
    tables: one NumPy buffer per table that torch wraps without a copy (`from_pretrained`), so
    both sides read the very same pages; EmbedLab's framework-free core (`embedlab.core()`) on
    those arrays, and, where memory allows a second copy, EmbedLab's TensorFlow op on variables
    holding the same values, in graph (K steps per call) and eagerly. All cases interleaved.

    Forward: sum pooling, torch under no_grad. Step: forward, the gradient of
    sum_t sum(out_t * r_t), SGD lr 0.01. torch: EmbeddingBag(sparse=True) + torch.optim.SGD;
    core: lookup_forward into reused output arrays, then lookup_backward_apply_many (sums each
    key's gradient and updates its row, no gradient tensors); TensorFlow:
    fused_embedding_lookup(optimizer=SGD). The core's forward is also timed into fresh output
    arrays every call (as torch allocates), with the page faults that costs.
    """
    core = embedlab.core()
    rng = np.random.default_rng(a.seed + 7 * dim)
    T, B, K = a.tables, a.batch, a.steps_per_call
    huge = a.peer_pages == "huge"
    torch.set_num_threads(os.cpu_count() or 1)
    print(f"[dim {dim}] peers: {T} tables of {a.rows:,} x {dim} on {'2 MiB huge' if huge else '4 KiB'} pages, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)...", flush=True)
    arrays = []
    for t in range(T):
        x = _page_buffer((a.rows, dim), huge)
        for r0 in range(0, a.rows, 1 << 18):  # filled in slices: no table-sized temporary
            r1 = min(a.rows, r0 + (1 << 18))
            x[r0:r1] = rng.uniform(-0.05, 0.05, size=(r1 - r0, dim)).astype(np.float32)
        arrays.append(x)
    huge_kb = _huge_kb(arrays)
    bags = [torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(x), freeze=False, mode="sum", sparse=True,
                                                  include_last_offset=True) for x in arrays]
    assert all(b.weight.data_ptr() == x.__array_interface__["data"][0] for b, x in zip(bags, arrays))
    t_opt = torch.optim.SGD([b.weight for b in bags], lr=0.01)
    batches = []
    for _ in range(K):
        offs, keys = [], []
        for _ in range(T):
            c = rng.integers(1, a.max_keys + 1, size=B)
            o = np.zeros(B + 1, np.int64)
            np.cumsum(c, out=o[1:])
            offs.append(o)
            keys.append(rng.integers(0, a.rows, size=int(o[-1]), dtype=np.int64))
        batches.append((offs, keys, [torch.from_numpy(o) for o in offs], [torch.from_numpy(k) for k in keys]))
    nkeys = sum(len(k) for k in batches[0][1])
    r_np = [rng.standard_normal((B, dim)).astype(np.float32) for _ in range(T)]
    r_t = [torch.from_numpy(x) for x in r_np]
    comb = ["sum"] * T

    phases = itertools.count()

    class Ring:
        """The next of the K batches on every call. Each case starts at its own batch (its phase),
        so that within one repeat no two cases read the same keys: at dim 16 one batch's rows
        (26 x ~8k x 64 B, 13.6 MB) fit in an L3 of 32 MiB, and a case that read the rows the
        case before it had just read would find them in cache (with fewer batches than cases, some share one)."""

        def __init__(self):
            self.i = next(phases)

        def next(self):
            self.i += 1
            return batches[self.i % K]

    def torch_fwd(_, ring=Ring()):
        _, _, o, k = ring.next()
        with torch.no_grad():
            [bags[t](k[t], o[t]) for t in range(T)]

    def torch_step(_, ring=Ring()):
        _, _, o, k = ring.next()
        t_opt.zero_grad(set_to_none=True)
        loss = sum((bags[t](k[t], o[t]) * r_t[t]).sum() for t in range(T))
        loss.backward()
        t_opt.step()

    core_outs = [np.empty((B, dim), np.float32) for _ in range(T)]

    def core_fwd(_, ring=Ring()):
        # Into the same output arrays every call, as the core's API is meant to be used.
        offs, keys, _, _ = ring.next()
        core.lookup_forward(arrays, offs, keys, None, comb, core_outs)

    def core_fwd_fresh(_, ring=Ring()):
        # Into fresh arrays every call, as torch's forward allocates: NumPy's (malloc's) fresh
        # memory is faulted in page by page on first write.
        offs, keys, _, _ = ring.next()
        core.lookup_forward(arrays, offs, keys, None, comb, [np.empty((B, dim), np.float32) for _ in range(T)])

    def core_step(_, ring=Ring()):
        offs, keys, _, _ = ring.next()
        core.lookup_forward(arrays, offs, keys, None, comb, core_outs)
        # d(sum(out * r))/d(out) = r; every table's backward + SGD in one call
        core.lookup_backward_apply_many(arrays, offs, keys, None, comb, r_np, "sgd", 0.01)

    # The same answer first: torch's forward and the core's, bit for bit.
    offs, keys, o_t, k_t = batches[0]
    outs = [np.empty((B, dim), np.float32) for _ in range(T)]
    core.lookup_forward(arrays, offs, keys, None, comb, outs)
    with torch.no_grad():
        same_bits = all(bags[t](k_t[t], o_t[t]).numpy().tobytes() == outs[t].tobytes() for t in range(T))
        for t in range(T):
            np.testing.assert_allclose(bags[t](k_t[t], o_t[t]).numpy(), outs[t], rtol=1e-5, atol=1e-6)

    import resource

    def faults(fn, calls=8):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(calls):
            fn(None)
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / calls

    faults(core_fwd)
    faults(core_fwd_fresh)
    page_faults = {"reused": faults(core_fwd), "fresh": faults(core_fwd_fresh), "torch": faults(torch_fwd)}

    cases = {"peer_fwd_torch_ms": (torch_fwd, None), "peer_fwd_core_ms": (core_fwd, None),
             "peer_fwd_core_fresh_ms": (core_fwd_fresh, None),
             "peer_step_torch_ms": (torch_step, None), "peer_step_core_ms": (core_step, None)}
    need = T * a.rows * dim * 4 * 1.3
    avail = _available_bytes()
    with_tf = avail is None or need < avail
    if with_tf:
        print(f"[dim {dim}] peers: TensorFlow variables with the same values (a second copy)...", flush=True)
        # Built as EmbedLab builds its layers' tables (embedlab.tables.aligned: each its own
        # 2 MiB-aligned mapping on huge pages; EMBEDLAB_ALIGNED_TABLES=0 leaves them in TensorFlow's
        # allocator's buffers, 64 bytes into a page).
        from embedlab import tables as _tables
        tables = [tf.Variable(_tables.aligned(x)) for x in arrays]
        addr_created = [_tables.address(v) for v in tables]
        rg = [[tf.RaggedTensor.from_row_splits(tf.constant(k), tf.constant(o), validate=False)
               for o, k in zip(b[0], b[1])] for b in batches]
        sgd = eopt.SGD(learning_rate=0.01)
        sgd.build(tables)

        def tf_loss(outs):
            return tf.add_n([tf.reduce_sum(x * r) for x, r in zip(outs, r_np)])

        def graph(step):
            @tf.function
            def run(_):
                dep = tf.constant(0.0)
                for b in range(K):
                    with tf.control_dependencies([dep]):
                        ids = [tf.nest.map_structure(tf.identity, x, expand_composites=True) for x in rg[b]]
                    res = step(ids)
                    with tf.control_dependencies(tf.nest.flatten(res)):
                        dep = tf.identity(dep)
                return dep
            return run

        def fwd(ids):
            return ops.fused_embedding_lookup(tables, ids, "sum")

        def step(ids):
            with tf.GradientTape() as tape:
                loss = tf_loss(ops.fused_embedding_lookup(tables, ids, "sum", optimizer=sgd))
            tape.gradient(loss, tables)
            return loss

        def eager_fwd(_, ring=Ring()):
            ring.next()
            return ops.fused_embedding_lookup(tables, rg[ring.i % K], "sum")

        # The same op called eagerly on inputs taken apart once, outside the timing: what
        # TensorFlow's eager dispatch of one op with 3 x 26 inputs costs, without EmbedLab's
        # Python wrapper (argument checks, conversions, the tape's notification).
        lib = embedlab.tf_ops()
        raw_in = [([x.row_splits for x in b], [x.values for x in b]) for b in rg]

        def eager_op(_, ring=Ring()):
            ring.next()
            splits, keys = raw_in[ring.i % K]
            return lib.embed_lab_fused_resource_lookup([v.handle for v in tables], splits, keys, [],
                                                       combiners=comb)

        got = ops.fused_embedding_lookup(tables, rg[0], "sum")
        same_bits_tf = all(g.numpy().tobytes() == x.tobytes() for g, x in zip(got, outs))
        cases.update({"peer_fwd_graph_ms": (graph(fwd), 0), "peer_step_graph_ms": (graph(step), 0),
                      "peer_fwd_eager_ms": (eager_fwd, None), "peer_fwd_eager_op_ms": (eager_op, None)})
        g_fwd = cases["peer_fwd_graph_ms"][0]
        _block(g_fwd(0))
        page_faults["graph"] = faults(lambda _: _block(g_fwd(0))) / K  # per step, as the graph's times
    else:
        print(f"[dim {dim}] peers: no TensorFlow copy of the tables (needs ~{need / 2**30:.1f} GiB, "
              f"{avail / 2**30:.1f} GiB available)", flush=True)
    # Which side leaves threads running after its call returns, and for how long (see _linger_ms).
    linger = {name: _linger_ms(lambda _, fn=fn, arg=arg: fn(arg)) for name, (fn, arg) in cases.items()}
    for name, (ms, n) in linger.items():
        print(f"[dim {dim}] peers: after {name[5:-3]}: {n} other thread(s) ran on for {ms:.1f} ms", flush=True)
    lead = a.peer_lead_ms if a.peer_lead_ms is not None else max(10.0, 2 * max(ms for ms, _ in linger.values()))
    print(f"[dim {dim}] peers: timing (all cases interleaved, each timed call after {lead:.0f} ms of lead-in "
          f"calls of its own{f' and a {a.peer_gap_ms:g} ms sleep' if a.peer_gap_ms else ''})...", flush=True)
    med, mins = _interleaved_ms(cases, a.warmup, a.repeats, lead_ms=lead, gap_ms=a.peer_gap_ms)
    if with_tf:
        addr_timed = [_tables.address(v) for v in tables]  # where the timed calls read them
        # The TensorFlow copies' huge pages, as the timed calls had them (the op advises its tables
        # on their second sighting): the process's AnonHugePages beyond the NumPy tables' (an upper
        # bound: other huge-page-backed allocations of the process count too).
        tf_huge_kb = _process_huge_kb()
        if tf_huge_kb is not None:
            tf_huge_kb -= _huge_kb(arrays) or 0
    for d in (med, mins):
        for k in ("peer_fwd_graph_ms", "peer_step_graph_ms"):
            if k in d:
                d[k] /= K
    res = {"peer_dim": dim, "peer_pages": a.peer_pages, "peer_table_huge_kib": huge_kb,
           "peer_table_kib": T * a.rows * dim * 4 // 1024, "peer_keys_per_batch": nkeys,
           "peer_torch": torch.__version__, "peer_fwd_bits_equal_torch_core": same_bits,
           "peer_fwd_page_faults_per_call": page_faults, "peer_lead_ms": lead, "peer_gap_ms": a.peer_gap_ms,
           "peer_omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
           "peer_linger_ms": {k: v[0] for k, v in linger.items()},
           "peer_linger_threads": {k: v[1] for k, v in linger.items()}, **med,
           "peer_min": mins}
    res["peer_fwd_ratio_core"] = med["peer_fwd_torch_ms"] / med["peer_fwd_core_ms"]
    res["peer_step_ratio_core"] = med["peer_step_torch_ms"] / med["peer_step_core_ms"]
    if with_tf:
        res["peer_fwd_bits_equal_tf_core"] = same_bits_tf
        res["peer_tf_table_huge_kib"] = tf_huge_kb
        res["peer_aligned_tables"] = os.environ.get("EMBEDLAB_ALIGNED_TABLES", "on")
        res["peer_tf_table_addr_mod_4096_created"] = [x % 4096 for x in addr_created]
        res["peer_tf_table_addr_mod_4096"] = [x % 4096 for x in addr_timed]
        res["peer_tf_table_addr_mod_2mib"] = [x % (2 << 20) for x in addr_timed]
        res["peer_fwd_ratio_graph"] = med["peer_fwd_torch_ms"] / med["peer_fwd_graph_ms"]
        res["peer_step_ratio_graph"] = med["peer_step_torch_ms"] / med["peer_step_graph_ms"]
        res["peer_core_over_graph_fwd"] = med["peer_fwd_core_ms"] / med["peer_fwd_graph_ms"]
        res["peer_core_over_graph_step"] = med["peer_step_core_ms"] / med["peer_step_graph_ms"]
        res["peer_eager_overhead_ms"] = med["peer_fwd_eager_ms"] - med["peer_fwd_graph_ms"]
        # split: TensorFlow's eager dispatch of the op, then EmbedLab's Python wrapper around it
        res["peer_eager_dispatch_ms"] = med["peer_fwd_eager_op_ms"] - med["peer_fwd_graph_ms"]
        res["peer_eager_wrapper_ms"] = med["peer_fwd_eager_ms"] - med["peer_fwd_eager_op_ms"]
        del tables
    res["peer_load_average_after"] = os.getloadavg()[0]
    del bags, t_opt, arrays
    return res


def main():
    a = _parse()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if a.peer_pages == "4k":  # the TensorFlow copies of the peers block stay on 4 KiB pages too
        os.environ["EMBEDLAB_HUGE_PAGES"] = "0"
    try:
        import embedlab  # the installed package (make setup), or the source tree on PYTHONPATH
    except ImportError:
        sys.path.insert(0, str(HERE.parent))
    import keras
    import tensorflow as tf

    import embedlab
    from embedlab import ops
    from embedlab import optimizers as eopt

    torch = None
    if a.peers != "off":
        try:
            import torch
        except ImportError:
            if a.peers == "only":
                sys.exit("--peers only needs torch: `make bench-peers` creates an environment with its CPU build")
            print("torch is not importable: no peers block (`make bench-peers` runs this script with it)", flush=True)

    import gc
    results, peer_results = [], []
    for d in a.dims:
        need = a.tables * a.rows * d * 4 * 1.25 + _STREAM_FLOATS * 4  # tables + temporaries, the read buffer
        avail = _available_bytes()
        if a.peers != "only":
            if avail is not None and need > avail:
                print(f"[dim {d}] skipped: needs ~{need / 2**30:.1f} GiB, {avail / 2**30:.1f} GiB available "
                      f"(lower --rows or drop this dim)", flush=True)
            else:
                results.append(run_dim(d, a, tf, keras, ops, eopt, embedlab))
                gc.collect()          # free this dim's tables (captured by its tf.functions) before the next
        if torch is not None:
            avail = _available_bytes()
            if avail is not None and a.tables * a.rows * d * 4 * 1.1 > avail:
                print(f"[dim {d}] peers skipped: {avail / 2**30:.1f} GiB available", flush=True)
            else:
                peer_results.append(run_peers(d, a, tf, ops, eopt, embedlab, torch))
                gc.collect()
        try:
            import psutil
            print(f"[dim {d}] done; process RSS {psutil.Process().memory_info().rss / 2**30:.1f} GiB", flush=True)
        except ImportError:
            pass
    if not results and not peer_results:
        sys.exit("no dimension fitted in memory; nothing measured")
    machine = {"cpu": _cpu_name(), "cpu_family_model": _results.cpu_family_model(), "cores": os.cpu_count(),
               "python": platform.python_version(),
               "tensorflow": tf.__version__, "keras": keras.__version__,
               "embedlab": embedlab.__version__, "embedlab_cpu_isa": embedlab.build_info().get("cpu_isa"),
               "torch": torch.__version__ if torch is not None else None}
    cmd = "PYTHONPATH=helpers python helpers/benchmarks/lookup_cpu.py " + " ".join(sys.argv[1:])
    if results:
        hdr = (f"{'dim':>4} | {'fwd TF ms':>9} | {'fwd EL coo':>10} | {'fwd EL csr':>10} | {'fwd x (coo/csr)':>15} | "
               f"{'f+b TF':>7} | {'f+b EL':>7} | {'step TF ms':>10} | {'step EL coo':>11} | {'step EL csr':>11} | "
               f"{'step x (coo/csr)':>16}")
        print()
        print(f"{a.tables} tables x {a.rows:,} rows, batch {a.batch}, 1-{a.max_keys} keys/row ({a.keys} keys), "
              f"median of {a.repeats}; machine: {machine['cpu']}, {machine['cores']} cores, TF {tf.__version__}")
        print(hdr)
        print("-" * len(hdr))
        for r in results:
            print(f"{r['dim']:>4} | {r['fwd_native_ms']:>9.2f} | {r['fwd_embedlab_coo_ms']:>10.2f} | "
                  f"{r['fwd_embedlab_csr_ms']:>10.2f} | {r['fwd_ratio_coo']:>6.2f} / {r['fwd_ratio_csr']:<6.2f} | "
                  f"{r['fwdbwd_native_ms']:>7.2f} | {r['fwdbwd_embedlab_coo_ms']:>7.2f} | "
                  f"{r['step_native_ms']:>10.2f} | {r['step_embedlab_coo_ms']:>11.2f} | "
                  f"{r['step_embedlab_csr_ms']:>11.2f} | {r['step_ratio_coo']:>7.2f} / {r['step_ratio_csr']:<6.2f}"
                  f"  (load avg {r['load_average_before']:.1f} -> {r['load_average_after']:.1f})")
        print()
        print(f"In graph, {a.steps_per_call} steps per tf.function call (ms per step): forward TF | forward EmbedLab "
              "COO / CSR | ratios || step TF | step EmbedLab (apply_gradients) | ratio | the same unfused | ratio | "
              "optimizer in backward COO / CSR | ratios; "
              "per call: step with optimizer in backward | ratio")
        for r in results:
            print(f"{r['dim']:>4} | {r['graph_fwd_native_ms']:7.2f} | {r['graph_fwd_embedlab_ms']:7.2f} / "
                  f"{r['graph_fwd_embedlab_csr_ms']:7.2f} | {r['graph_fwd_ratio']:5.2f}x / {r['graph_fwd_ratio_csr']:5.2f}x || "
                  f"{r['graph_step_native_ms']:7.2f} | {r['graph_step_embedlab_ms']:7.2f} | {r['graph_step_ratio']:5.2f}x | "
                  f"{r['graph_step_embedlab_unfused_ms']:7.2f} | {r['graph_step_ratio_unfused']:5.2f}x | "
                  f"{r['graph_step_embedlab_fused_ms']:7.2f} / {r['graph_step_embedlab_fused_csr_ms']:7.2f} | "
                  f"{r['graph_step_ratio_fused']:5.2f}x / {r['graph_step_ratio_fused_csr']:5.2f}x; "
                  f"{r['step_embedlab_fused_ms']:7.2f} | {r['step_ratio_fused']:5.2f}x")
        print()
        print("Per call, TensorFlow's cost of calling a tf.function with the 26 SparseTensors (a no-op body) "
              "and the ceiling it puts on the per-call ratios (native time / that cost): ms | forward | step")
        for r in results:
            print(f"{r['dim']:>4} | {r['call_overhead_ms']:5.2f} | {r['fwd_ratio_per_call_ceiling']:5.2f}x | "
                  f"{r['step_ratio_per_call_ceiling']:5.2f}x")
        print()
        print("Streaming read of a 1 GiB buffer (GB/s, median / best), the batch's rows at the best rate (ms: a "
              "floor under any forward) and the highest in-graph forward ratio that floor allows:")
        for r in results:
            print(f"{r['dim']:>4} | {r['stream_read_gbps']:5.1f} / {r['stream_read_best_gbps']:5.1f} | "
                  f"{r['fwd_floor_stream_ms']:6.2f} | {r['graph_fwd_ratio_stream_ceiling']:5.2f}x")
        print()
        print("EmbedLab step pieces, each timed alone (ms, median): COO->CSR | forward kernel (CSR) | "
              "backward kernel | SGD apply kernel | sum | full CSR step")
        for r in results:
            ps = [r["piece_coo_to_csr_ms"], r["piece_fwd_kernel_ms"], r["piece_bwd_kernel_ms"], r["piece_sgd_apply_ms"]]
            print(f"{r['dim']:>4} | " + " | ".join(f"{p:7.2f}" for p in ps)
                  + f" | {sum(ps[1:]):7.2f} | {r['step_embedlab_csr_ms']:7.2f}")
    if peer_results:
        print()
        print("Peers, the same tables (one buffer each, read by every side), interleaved, ms per batch (median): "
              "forward torch EmbeddingBag | EmbedLab core from NumPy | EmbedLab in graph | ratios torch/core, "
              "torch/graph || step (fwd + bwd + SGD) the same || core / graph (fwd, step) | eager forward "
              "overhead (eager - in graph; split: the op dispatched eagerly - in graph, the wrapper around it) | pages (huge KiB / table KiB)")
        for r in peer_results:
            g = lambda k, f="7.2f": format(r[k], f) if k in r else "   -   "  # noqa: E731
            print(f"{r['peer_dim']:>4} | {r['peer_fwd_torch_ms']:7.2f} | {r['peer_fwd_core_ms']:7.2f} | "
                  f"{g('peer_fwd_graph_ms')} | {r['peer_fwd_ratio_core']:5.2f}x / {g('peer_fwd_ratio_graph', '5.2f')}x || "
                  f"{r['peer_step_torch_ms']:7.2f} | {r['peer_step_core_ms']:7.2f} | {g('peer_step_graph_ms')} | "
                  f"{r['peer_step_ratio_core']:5.2f}x / {g('peer_step_ratio_graph', '5.2f')}x || "
                  f"{g('peer_core_over_graph_fwd', '5.2f')} , {g('peer_core_over_graph_step', '5.2f')} | "
                  f"{g('peer_eager_overhead_ms', '6.3f')} (dispatch {g('peer_eager_dispatch_ms', '6.3f')}, "
                  f"wrapper {g('peer_eager_wrapper_ms', '6.3f')}) | {r['peer_table_huge_kib']} / {r['peer_table_kib']}"
                  f"  (forward bits equal torch/core: {r['peer_fwd_bits_equal_torch_core']}; core forward into fresh "
                  f"arrays {r['peer_fwd_core_fresh_ms']:.2f} ms; page faults per forward: "
                  f"{r['peer_fwd_page_faults_per_call']})")
    out = {"command": cmd, "machine": machine, "config": {k: (str(v) if isinstance(v, Path) else v)
                                                           for k, v in vars(a).items()},
           "results": results, "peers": peer_results, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if a.out is None:
        a.out = _results.default_out("lookup_cpu", _results.cpu_machine())
    from embedlab._io import atomic_file
    with atomic_file(a.out) as tmp:
        tmp.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()
