"""embedlab.sok benchmark, Criteo shape: 26 tables, dim 16, batch 4,096 per worker, 1-3 keys per
sample drawn uniformly.

Modes (one JSON per run under docs/benchmarks/results/sok_<mode>_<machine>_<date>.json):

* `--mode local` (1 worker, one process): a train step (forward, backward, SGD) of
  `sok.lookup_sparse` over 26 `sok.Variable`s updated by `sok.OptimizerWrapper(embedlab SGD)`, vs
  TensorFlow's own step on the same tables and batches (`tf.nn.embedding_lookup_sparse` per
  table (safe_ variant), GradientTape, `keras.optimizers.SGD`), both in `tf.function`, timed
  alternately in one run (medians).
* `--mode workers -n 2`: starts the launcher with N workers (this script again, `--worker`); each
  times, in one run: the whole sharded step, the same step with the exchange replaced by a local
  lookup of the worker's own shards (no communication: what the step would cost without
  the exchange), and the two float all-to-alls alone at the step's sizes. Reports the
  exchange's share of the step and the bytes one worker sends per step.
* `--mode gpu-routing` (needs only `_embedlab_core` built with CUDA, and PyTorch): the CUDA
  routing pair (route_count_cuda with a device status array + route_scatter_cuda(check=False)
  into a compact send array of nnz entries: no host synchronization) at 26 x 65,536 keys for 8
  and 64 owners, against a PyTorch argsort bucketing with the same output (counts, send,
  inverse; checked equal to route_keys first), the padded layout with the busiest owner's count
  read back, and the memory floor (keys read, send and inverse written once, at the measured
  device-copy bandwidth), CUDA events, medians.

Usage:
    python helpers/benchmarks/sok.py --mode local --rows 1000000 --repeats 15
    python helpers/benchmarks/sok.py --mode workers -n 2 --rows 1000000 --repeats 15
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import _results  # this folder: where results are written

HERE = Path(__file__).resolve().parent
T, DIM, BATCH = 26, 16, 4096


def _out_path(mode, machine):
    d = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")
    return _results.RESULTS_DIR / f"sok_{mode}_{machine}_{d}.json"


def make_batches(rng, rows, count, batch=BATCH):
    out = []
    for _ in range(count):
        tabs = []
        for _t in range(T):
            lens = rng.integers(1, 4, size=batch)
            keys = rng.integers(0, rows, size=int(lens.sum())).astype(np.int64)
            tabs.append((lens, keys))
        out.append(tabs)
    return out


def to_sparse(tf, lens, keys):
    rows = np.repeat(np.arange(len(lens)), lens)
    cols = np.concatenate([np.arange(l) for l in lens])
    return tf.SparseTensor(np.stack([rows, cols], 1).astype(np.int64), keys, [len(lens), 3])


def load_avg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def run_local(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import embedlab
    tf = embedlab.import_tensorflow()
    import keras
    import embedlab.sok as sok
    import embedlab.optimizers as eo

    sok.init()
    rng = np.random.default_rng(0)
    init = [rng.uniform(-0.05, 0.05, size=(args.rows, DIM)).astype(np.float32) for _ in range(T)]
    svars = [sok.Variable(x, name=f"t{i}") for i, x in enumerate(init)]
    tvars = [tf.Variable(x) for x in init]
    del init
    sopt = sok.OptimizerWrapper(eo.SGD(learning_rate=0.01))
    topt = keras.optimizers.SGD(learning_rate=0.01)
    r = [tf.constant(rng.normal(size=(BATCH, DIM)).astype(np.float32)) for _ in range(T)]
    batches = [[to_sparse(tf, l, k) for l, k in b] for b in make_batches(rng, args.rows, 4)]

    @tf.function
    def sok_step(ids):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(svars, ids, combiners=["sum"] * T)
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        sopt.apply_gradients(zip(tape.gradient(loss, svars), svars))
        return loss

    @tf.function
    def tf_step(ids):
        with tf.GradientTape() as tape:
            embs = [tf.nn.safe_embedding_lookup_sparse(v, x, combiner="sum") for v, x in zip(tvars, ids)]
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        topt.apply_gradients(zip(tape.gradient(loss, tvars), tvars))
        return loss

    # same numbers first (one step each on equal tables), then time
    a, b = float(sok_step(batches[0])), float(tf_step(batches[0]))
    assert abs(a - b) <= 1e-3 * max(1.0, abs(b)), (a, b)
    for _ in range(2):
        sok_step(batches[1]); tf_step(batches[1])
    ts, tt = [], []
    for i in range(args.repeats):
        ids = batches[i % len(batches)]
        t0 = time.perf_counter(); sok_step(ids).numpy(); ts.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); tf_step(ids).numpy(); tt.append(time.perf_counter() - t0)
    res = {"mode": "local", "tables": T, "rows": args.rows, "dim": DIM, "batch": BATCH, "repeats": args.repeats,
           "sok_step_ms": 1e3 * statistics.median(ts), "tf_step_ms": 1e3 * statistics.median(tt),
           "load_avg_1min": load_avg()}
    res["speedup"] = res["tf_step_ms"] / res["sok_step_ms"]
    print(f"1 worker, {T} tables x {args.rows:,} x {DIM}, batch {BATCH}: sok.lookup_sparse step "
          f"{res['sok_step_ms']:.1f} ms, TF embedding_lookup_sparse step {res['tf_step_ms']:.1f} ms, "
          f"ratio {res['speedup']:.2f}x")
    return res


def run_worker(args):
    """One worker of `--mode workers`; rank 0 prints and writes the JSON (path in args.json)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import embedlab
    tf = embedlab.import_tensorflow()
    import embedlab.sok as sok
    import embedlab.optimizers as eo
    from embedlab import ops
    from embedlab.sok import exchange, _context

    ctx = sok.init()
    n, rank = ctx.world_size, ctx.rank
    full_rows = args.rows
    svars = []
    for i in range(T):
        shard = np.random.default_rng(i).uniform(-0.05, 0.05, size=((full_rows - rank + n - 1) // n, DIM)).astype(np.float32)
        svars.append(sok.Variable(lambda shape, dtype, s=shard: tf.constant(s), shape=[full_rows, DIM], name=f"t{i}"))
    opt = sok.OptimizerWrapper(eo.SGD(learning_rate=0.01))
    wrng = np.random.default_rng(99 + rank)
    batches = [[to_sparse(tf, l, k) for l, k in b] for b in make_batches(wrng, full_rows, 4)]
    r = [tf.constant(wrng.normal(size=(BATCH, DIM)).astype(np.float32)) for _ in range(T)]
    strategy = ctx.strategy

    def body(ids):
        with tf.GradientTape() as tape:
            embs = sok.lookup_sparse(svars, ids, combiners=["sum"] * T)
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        opt.apply_gradients(zip(tape.gradient(loss, svars), svars))
        return loss

    def body_local(ids):
        # the same work on this worker's own shards with keys folded into its rows: no exchange
        with tf.GradientTape() as tape:
            local = [tf.SparseTensor(x.indices, x.values // n, x.dense_shape) for x in ids]
            embs = ops.fused_embedding_lookup(svars, local, ["sum"] * T)
            loss = tf.add_n([tf.reduce_sum(e * w) for e, w in zip(embs, r)])
        opt.apply_gradients(zip(tape.gradient(loss, svars), svars))
        return loss

    @tf.function
    def step(ids):
        return strategy.run(body, args=(ids,))

    @tf.function
    def step_local(ids):
        return body_local(ids)

    nnz = sum(int(x.values.shape[0]) for x in batches[0])
    # the padded per-owner slot count of a uniform batch (the same on every worker: the largest)
    nnz_max = int(exchange.all_gather(tf.constant([nnz], tf.int64)).numpy().max())
    p_rows = int(np.ceil(nnz_max / n * 1.1))

    @tf.function
    def a2a_only(x):
        return exchange.all_to_all(x)

    payload = tf.constant(np.zeros((n, p_rows, DIM), np.float32))
    for _ in range(2):
        step(batches[0]); step_local(batches[0]); a2a_only(payload); a2a_only(payload)
    tw, tl, ta = [], [], []
    for i in range(args.repeats):
        ids = batches[i % len(batches)]
        t0 = time.perf_counter(); tf.nest.map_structure(lambda t: t.numpy(), step(ids)); tw.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); step_local(ids).numpy(); tl.append(time.perf_counter() - t0)
        t0 = time.perf_counter(); a2a_only(payload).numpy(); a2a_only(payload).numpy(); ta.append(time.perf_counter() - t0)
    med = lambda x: 1e3 * statistics.median(x)  # noqa: E731
    # bytes one worker sends per step to the others: keys (8 B) out, rows (4*DIM B) back,
    # gradient rows (4*DIM B) in the backward; a share (n-1)/n of the padded buffers leaves.
    frac = (n - 1) / n
    sent = {"keys_bytes": int(frac * n * p_rows * 8), "rows_bytes": int(frac * n * p_rows * DIM * 4),
            "grad_bytes": int(frac * n * p_rows * DIM * 4)}
    res = {"mode": "workers", "workers": n, "tables": T, "rows": full_rows, "dim": DIM, "batch_per_worker": BATCH,
           "keys_per_worker": nnz, "repeats": args.repeats, "step_ms": med(tw), "step_no_exchange_ms": med(tl),
           "float_all_to_alls_ms": med(ta), "bytes_sent_per_step": sent, "load_avg_1min": load_avg()}
    res["exchange_ms"] = res["step_ms"] - res["step_no_exchange_ms"]
    res["exchange_share"] = res["exchange_ms"] / res["step_ms"]
    all_res = exchange.all_gather(tf.constant([res["step_ms"], res["step_no_exchange_ms"]], tf.float64)).numpy()
    if rank == 0:
        res["per_rank_step_ms"] = all_res[:, 0].tolist()
        res["per_rank_no_exchange_ms"] = all_res[:, 1].tolist()
        print(f"{n} workers: step {res['step_ms']:.1f} ms, without exchange {res['step_no_exchange_ms']:.1f} ms, "
              f"exchange {res['exchange_ms']:.1f} ms ({100 * res['exchange_share']:.0f} %), two float all-to-alls "
              f"alone {res['float_all_to_alls_ms']:.1f} ms; bytes sent per step {sum(sent.values()) / 1e6:.2f} MB {sent}")
        Path(args.json).write_text(json.dumps(res, indent=1))


def run_workers(args):
    path = _out_path(f"workers{args.n}", args.machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", str(args.n), "--timeout", "1800", __file__,
           "--worker", "--rows", str(args.rows), "--repeats", str(args.repeats), "--json", str(path)]
    rc = subprocess.call(cmd)
    if rc != 0:
        raise SystemExit(rc)
    return json.loads(path.read_text())


def run_gpu_routing(args):
    """The CUDA routing pair (count + scatter) against a PyTorch argsort bucketing with the same
    output, and the memory floor of the bytes it must move, in one run."""
    import torch
    sys.path.insert(0, str(HERE))
    from _gpu import events_ms, gpu_info, load_core
    core = load_core()
    info = gpu_info(torch)
    res = {"mode": "gpu-routing", "device": torch.cuda.get_device_name(), "info": info, "runs": []}
    rng = np.random.default_rng(0)
    stream = torch.cuda.current_stream().cuda_stream
    n_copy = 1 << 28
    src = torch.randn(n_copy, device="cuda")
    dst = torch.empty_like(src)
    copy_gbs = 2 * 4 * n_copy / (events_ms(torch, lambda: dst.copy_(src), args.repeats, inner=3) * 1e-3) / 1e9
    del src, dst
    res["copy_gb_per_s"] = copy_gbs
    print(f"{info['gpu']}: device copy {copy_gbs:,.0f} GB/s (read + write)")
    per, rows_t = 65536, 10_000_000
    try:  # does this build count without a host synchronization?
        st = torch.empty(8, dtype=torch.int64, device="cuda")
        core.route_count_cuda(torch.zeros(1, dtype=torch.int64, device="cuda"), np.array([0, 1], np.int64), [0], [1],
                              [0], 1, torch.empty((1, 1), dtype=torch.int64, device="cuda"), stream, status=st)
        asynchronous = True
    except TypeError:
        asynchronous = False
    for n in (8, 64):
        keys = rng.integers(0, rows_t, size=T * per).astype(np.int64)
        keys[rng.random(keys.size) < 0.01] = -1  # some padding
        offsets = (np.arange(T + 1) * per).astype(np.int64)
        modes, rows, ranks = [0] * T, [rows_t] * T, [0] * T
        nnz = keys.size
        dk = torch.from_numpy(keys).cuda()
        counts = torch.empty((n, T), dtype=torch.int64, device="cuda")
        status = torch.empty(8, dtype=torch.int64, device="cuda")
        send = torch.empty(nnz, dtype=torch.int64, device="cuda")  # compact, bounded by nnz: no size needed
        inv = torch.empty_like(dk)
        wkw = {}
        if hasattr(core, "route_cuda_workspace_size"):  # scratch allocated once, outside the timed pair
            wkw = {"workspace": torch.empty(core.route_cuda_workspace_size(offsets, n), dtype=torch.uint8,
                                            device="cuda")}

        def ours():
            if asynchronous:
                core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts, stream, status=status, **wkw)
                core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts, 0, send, inv, stream,
                                        check=False, status=status, **wkw)
            else:  # the count reads the total back (one synchronization)
                total, _ = core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts, stream)
                core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts, 0, send[:total], inv, stream)

        # PyTorch: bucket = owner * T + table (padding last), a stable argsort, a gather, a scatter.
        table_of = torch.repeat_interleave(torch.arange(T, device="cuda"), per)
        ar = torch.arange(nnz, device="cuda")
        t_send = torch.empty(nnz, dtype=torch.int64, device="cuda")
        t_inv = torch.empty(nnz, dtype=torch.int64, device="cuda")

        def theirs():
            pad = dk == -1
            bucket = torch.where(pad, n * T, (dk % n) * T + table_of)
            t_counts = torch.bincount(bucket, minlength=n * T + 1)[: n * T].view(n, T)
            perm = torch.argsort(bucket, stable=True)
            torch.index_select(torch.where(pad, -1, dk // n), 0, perm, out=t_send)
            t_inv.index_copy_(0, perm, ar)
            t_inv.masked_fill_(pad, -1)
            return t_counts

        # same output first: ours == route_keys (CPU) == PyTorch's
        send.fill_(-7)
        ours()
        t_counts = theirs()
        torch.cuda.synchronize()
        cpu = core.route_keys(keys, offsets, modes, rows, ranks, n, 0, 0)
        total = int(cpu[0].sum())
        if asynchronous:
            st = status.cpu().numpy()
            assert st[5] == 0 and st[0] == total and st[2] == -1, st
        ok = (np.array_equal(counts.cpu().numpy(), cpu[0]) and np.array_equal(send[:total].cpu().numpy(), cpu[1])
              and np.array_equal(inv.cpu().numpy(), cpu[2]) and np.array_equal(t_counts.cpu().numpy(), cpu[0])
              and np.array_equal(t_send[:total].cpu().numpy(), cpu[1]) and np.array_equal(t_inv.cpu().numpy(), cpu[2]))
        if not ok:
            raise SystemExit(f"sok gpu-routing: outputs differ at {n} owners; no timings reported")
        # the padded layout with the busiest owner's count read back (a synchronization)
        mx = int(cpu[0].sum(axis=1).max())
        send_p = torch.empty(n * mx, dtype=torch.int64, device="cuda")

        def ours_padded():
            _, m = core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts, stream, **wkw)
            core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts, m, send_p, inv, stream, **wkw)

        ms = events_ms(torch, ours, args.repeats)
        ms_torch = events_ms(torch, theirs, args.repeats)
        ms_padded = events_ms(torch, ours_padded, args.repeats)
        ms2 = events_ms(torch, ours, args.repeats)  # again: the spread between two timings of the same code
        floor_bytes = nnz * 8 * 3  # keys read, send and inverse written, once each
        floor_ms = floor_bytes / (copy_gbs * 1e9) * 1e3
        run = {"owners": n, "tables": T, "keys": int(nnz), "routed": total, "asynchronous_pair": asynchronous,
               "pair_ms": ms, "pair_ms_again": ms2, "torch_argsort_ms": ms_torch, "speedup_vs_torch": ms_torch / ms,
               "padded_with_sync_ms": ms_padded, "memory_floor_ms": floor_ms, "of_floor": floor_ms / ms,
               "keys_per_s": nnz / (ms * 1e-3)}
        res["runs"].append(run)
        print(f"GPU routing, {n} owners, {nnz:,} keys ({T} tables): count + scatter {ms:.4f} / {ms2:.4f} ms "
              f"({'no host sync' if asynchronous else 'count reads the total back'}; {run['keys_per_s'] / 1e9:.2f} G "
              f"keys/s); PyTorch argsort bucketing {ms_torch:.4f} ms -> {run['speedup_vs_torch']:.2f}x; padded layout "
              f"with the stride read back {ms_padded:.4f} ms; memory floor (keys read, send and inverse written at "
              f"the copy bandwidth) {floor_ms:.4f} ms -> {100 * run['of_floor']:.0f}% of it", flush=True)
    out = os.environ.get("OUT")
    if out:
        args.json = str(Path(out) / f"sok_gpu_routing_{args.machine}.json")
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["local", "workers", "gpu-routing"], default="local")
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--machine", default=platform.node().split(".")[0] or "host")
    ap.add_argument("--json", help="output path (default results/sok_<mode>_<machine>_<date>.json)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return run_worker(args)
    res = {"local": run_local, "workers": run_workers, "gpu-routing": run_gpu_routing}[args.mode](args)
    res["date_utc"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes")
    res["machine"] = args.machine
    res["cpus"] = os.cpu_count()
    mode = f"workers{args.n}" if args.mode == "workers" else args.mode.replace("-", "_")
    path = Path(args.json) if args.json else _out_path(mode, args.machine)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
