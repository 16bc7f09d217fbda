"""GPU benchmark of EmbedLab's CUDA embedding kernels against the PyTorch a user would pick.

Run on a CUDA machine with PyTorch, after building the module (standalone is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    PYTHONPATH=/tmp/b python3 helpers/benchmarks/lookup_gpu.py

What it does, in one run on one GPU:
  1. measures the device-copy ceiling (a large device-to-device copy, bytes read + written);
  2. checks correctness first, on every workload: our forward against
     torch.nn.functional.embedding_bag, and our fused backward+SGD / backward+Adam against
     embedding_bag(sparse=True).backward() + torch.optim.SGD / SparseAdam, on a slice of the lookups;
  3. times (CUDA events, median of --reps after warm-up): the forward (sum, mean), our fused
     backward+optimizer, our plain backward, and the PyTorch baselines, on
       10M x 128 fp32, 65,536 x 26 lookups of 1 key; the same with 10 keys per lookup;
       10M x 16 with 1 key; uniform and Zipf(1.05) keys; and 26 tables of different sizes.
For the workloads of one key per lookup, the floor is the same rows gathered with the indices
known (`_gather_rows_cuda`: one thread per 16-byte chunk, no offsets, no combiner); "of floor" is
its time over ours, and the forward and the floor are timed in turn 7 times more (the spread
over those runs, in one process, is printed).
Bandwidth is reported the FBGEMM way: bytes that must move (each looked-up row read once per
lookup, keys and offsets, outputs written; for backward+optimizer: the output gradient read,
keys, and each touched row's weights and optimizer state read and written once) over time,
and as a fraction of the measured copy bandwidth. Our kernels are timed with check=False (the
device-side key check syncs the stream); one row shows what check=True costs.

Prints a table and writes JSON to $OUT/lookup_gpu_<gpu>_<date>.json if OUT is set, else to
docs/benchmarks/results/lookup_gpu_<gpu>_<date>.json (e.g. lookup_gpu_nvidia-h100_2026-11-22T0057Z.json).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu import events_ms, gpu_info, load_core, out_path  # noqa: E402


class Timer:
    def __init__(self, torch, reps, warmup):
        self.torch, self.reps, self.warmup = torch, reps, warmup

    def median_ms(self, fn, setup=None, inner=None):
        """_gpu.events_ms with this run's reps and warm-up; inner is 10 back-to-back calls, or 1
        with setup() (run untimed before each rep)."""
        inner = inner or (1 if setup is not None else 10)
        return events_ms(self.torch, fn, self.reps, inner=inner, warmup=self.warmup, setup=setup)


def zipf_keys(rng, n, rows, alpha=1.05):
    z = rng.zipf(alpha, size=n).astype(np.int64) - 1
    z %= rows
    # Scatter the hot keys over the table (rank r -> a pseudo-random row), as real ids are.
    return (z * 2654435761) % rows


def make_keys(rng, n, rows, dist):
    return rng.integers(0, rows, size=n, dtype=np.int64) if dist == "uniform" else zipf_keys(rng, n, rows)


# (rows per thread group, key steps unrolled, min blocks per SM): the compiled forward variants.
FORWARD_VARIANTS = [(1, 4, 1), (1, 4, 8), (1, 1, 8), (2, 1, 8), (2, 2, 4), (2, 2, 6), (4, 1, 4), (4, 1, 6)]


# (state prefetch, min blocks per SM): the compiled backward-reduction variants.
BACKWARD_VARIANTS = [(True, 4), (True, 1), (False, 4), (False, 1)]


def copy_bandwidth(torch, timer):
    n = 1 << 28  # 1 GiB of float32 each way
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    del src, dst
    return 2 * 4 * n / (ms * 1e-3) / 1e9, ms


def fwd_bytes(nnz_valid, nnz, batch, dim):
    return nnz_valid * dim * 4 + nnz * 8 + (batch + 1) * 8 + batch * dim * 4


def bwd_bytes(nnz, batch, dim, n_unique, state_rows):
    # grad_out read, keys + offsets read, each touched row (+ its optimizer state) read and written.
    return batch * dim * 4 + nnz * 8 + (batch + 1) * 8 + 2 * n_unique * dim * 4 * (1 + state_rows)


class Bench:
    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.core = load_core()
        if not getattr(self.core, "cuda_built", False):
            raise SystemExit("lookup_gpu: _embedlab_core was built without CUDA; build with -DEMBEDLAB_CUDA=ON")
        if not torch.cuda.is_available():
            raise SystemExit("lookup_gpu: no CUDA device visible to PyTorch")
        self.args = args
        self.timer = Timer(torch, args.reps, args.warmup)
        self.rng = np.random.default_rng(args.seed)
        self.rows = []
        self.checks = []

    @property
    def stream(self):
        return self.torch.cuda.current_stream().cuda_stream

    def record(self, **row):
        self.rows.append(row)
        fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else (  # noqa: E731
            "[" + ", ".join(f"{x:.4g}" for x in v) + "]" if isinstance(v, list) else f"{v}")
        print("  " + ", ".join(f"{k}={fmt(v)}" for k, v in row.items()), flush=True)

    def check(self, name, ok, detail):
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"  check {name}: {'ok' if ok else 'FAILED'} ({detail})", flush=True)
        if not ok:
            raise SystemExit(f"lookup_gpu: correctness check {name} failed ({detail}); no timings reported")

    # ---- one table, one workload ----------------------------------------------------------
    def single_table(self, name, num_rows, dim, batch, per_lookup, dist):
        torch, F, core = self.torch, self.F, self.core
        print(f"\n== {name} / {dist}: table {num_rows:,} x {dim}, {batch:,} lookups x {per_lookup} key(s)", flush=True)
        nnz = batch * per_lookup
        keys = torch.from_numpy(make_keys(self.rng, nnz, num_rows, dist)).cuda()
        offsets = torch.arange(0, nnz + 1, per_lookup, dtype=torch.int64, device="cuda")
        table = torch.randn(num_rows, dim, device="cuda")
        out = torch.full((batch, dim), float("nan"), device="cuda")
        n_unique = int(torch.unique(keys).numel())
        base = dict(workload=name, dist=dist, rows=num_rows, dim=dim, lookups=batch, keys_per_lookup=per_lookup,
                    unique=n_unique)

        # -- forward: correctness, then time
        for comb in ("sum", "mean"):
            core.lookup_forward_cuda([table], [offsets], [keys], None, [comb], [out], stream=self.stream, check=True)
            ref = F.embedding_bag(keys, table, offsets, mode=comb, include_last_offset=True)
            err = float((out - ref).abs().max())
            scale = float(ref.abs().max())
            self.check(f"{name}/{dist}/forward-{comb}", bool(torch.isfinite(out).all()) and err <= 1e-5 * scale + 1e-6,
                       f"max |ours - embedding_bag| = {err:.3g}, max |ref| = {scale:.3g}")
            del ref
        nbytes = fwd_bytes(nnz, nnz, batch, dim)
        floor_ms = float("nan")
        if per_lookup == 1:
            # the floor: the same rows gathered with the indices known (no offsets, no combiner)
            fl = torch.empty(batch, dim, device="cuda")
            core._gather_rows_cuda(table, keys, fl, stream=self.stream)
            core.lookup_forward_cuda([table], [offsets], [keys], None, ["sum"], [out], stream=self.stream, check=False)
            self.check(f"{name}/{dist}/gather floor", bool(torch.equal(fl, out)), "floor rows == forward rows")
            floor = lambda: core._gather_rows_cuda(table, keys, fl, stream=self.stream)  # noqa: E731
            floor_ms = self.timer.median_ms(floor)
        for comb in ("sum", "mean"):
            ours = self.timer.median_ms(lambda: core.lookup_forward_cuda(
                [table], [offsets], [keys], None, [comb], [out], stream=self.stream, check=False))
            theirs = self.timer.median_ms(lambda: F.embedding_bag(keys, table, offsets, mode=comb,
                                                                  include_last_offset=True))
            self.record(**base, op=f"forward-{comb}", ours_ms=ours, torch_ms=theirs, bytes=nbytes,
                        ours_GBps=nbytes / ours / 1e6, torch_GBps=nbytes / theirs / 1e6,
                        ours_frac_copy=nbytes / ours / 1e6 / self.copy_GBps, speedup=theirs / ours,
                        floor_ms=floor_ms, of_floor=floor_ms / ours)
        if per_lookup == 1:
            # stability: the forward and the floor, timed in turn, 7 times in this process
            fwd = lambda: core.lookup_forward_cuda([table], [offsets], [keys], None, ["sum"], [out],  # noqa: E731
                                                   stream=self.stream, check=False)
            runs, floors = [], []
            for _ in range(7):
                runs.append(self.timer.median_ms(fwd))
                floors.append(self.timer.median_ms(floor))
            self.record(**base, op="forward-sum x7 (spread)", ours_ms=float(np.median(runs)), torch_ms=float("nan"),
                        bytes=nbytes, ours_GBps=nbytes / float(np.median(runs)) / 1e6, torch_GBps=float("nan"),
                        ours_frac_copy=nbytes / float(np.median(runs)) / 1e6 / self.copy_GBps, speedup=float("nan"),
                        floor_ms=float(np.median(floors)), of_floor=float(np.median(floors)) / float(np.median(runs)),
                        runs_ms=runs, floor_runs_ms=floors, spread=(max(runs) - min(runs)) / min(runs),
                        floor_spread=(max(floors) - min(floors)) / min(floors))
            del fl
        if self.args.variant_sweep:
            self.variant_sweep(table, offsets, keys, out, nbytes, base)
        if name == "128d-1key" and dist == "uniform":
            self.forward_experiments(table, offsets, keys, out, nbytes, base)
        if self.args.forward_only:
            del table, out, keys, offsets
            torch.cuda.empty_cache()
            return

        # -- backward + optimizer
        dy = torch.randn(batch, dim, device="cuda")
        ws = torch.empty(core.lookup_backward_cuda_workspace_size(batch, nnz, dim, num_rows), dtype=torch.uint8,
                         device="cuda")
        self.check_backward(name, dist, table, offsets, keys, dy, per_lookup)
        lr = 0.01
        for opt in ("sgd", "adam"):
            state_rows = 2 if opt == "adam" else 0
            nbytes_b = bwd_bytes(nnz, batch, dim, n_unique, state_rows)
            # ours: fused, in place on a copy of the table
            mine = table.clone()
            m = torch.zeros_like(table) if opt == "adam" else None
            v = torch.zeros_like(table) if opt == "adam" else None
            step = [0]

            def ours_step():
                step[0] += 1
                core.lookup_backward_apply_cuda(mine, offsets, keys, None, "sum", dy, opt, lr, m=m, v=v,
                                                epsilon=1e-8, beta_1=0.9, beta_2=0.999, step=step[0],
                                                stream=self.stream, check=False, workspace=ws)
            ours = self.timer.median_ms(ours_step, inner=1)
            del mine, m, v
            torch.cuda.empty_cache()
            # PyTorch: forward (untimed) builds the graph; time backward + optimizer step.
            p = torch.nn.Parameter(table.clone())
            o = torch.optim.SGD([p], lr=lr) if opt == "sgd" else torch.optim.SparseAdam([p], lr=lr, eps=1e-8)
            holder = {}

            def setup():
                o.zero_grad(set_to_none=True)
                holder["y"] = F.embedding_bag(keys, p, offsets, mode="sum", include_last_offset=True, sparse=True)

            def theirs_step():
                holder["y"].backward(dy)
                o.step()
            theirs = self.timer.median_ms(theirs_step, setup=setup)
            del p, o, holder
            torch.cuda.empty_cache()
            self.record(**base, op=f"backward+{opt}", ours_ms=ours, torch_ms=theirs, bytes=nbytes_b,
                        ours_GBps=nbytes_b / ours / 1e6, torch_GBps=nbytes_b / theirs / 1e6,
                        ours_frac_copy=nbytes_b / ours / 1e6 / self.copy_GBps, speedup=theirs / ours)
        if self.args.variant_sweep:
            self.backward_sweep(table, offsets, keys, dy, ws, base, n_unique)
        # plain backward (unique keys + summed rows), for reference
        uk = torch.empty(nnz, dtype=torch.int64, device="cuda")
        rows = torch.empty(nnz, dim, device="cuda") if nnz * dim * 4 <= 4e9 else None
        if rows is not None:
            nu = torch.empty(1, dtype=torch.int64, device="cuda")
            ours = self.timer.median_ms(lambda: core.lookup_backward_cuda(
                offsets, keys, None, "sum", dy, num_rows, uk, rows, nu, stream=self.stream, check=False, workspace=ws))
            nbytes_g = batch * dim * 4 + nnz * 8 + (batch + 1) * 8 + n_unique * (dim * 4 + 8)
            self.record(**base, op="backward-only", ours_ms=ours, torch_ms=float("nan"), bytes=nbytes_g,
                        ours_GBps=nbytes_g / ours / 1e6, torch_GBps=float("nan"),
                        ours_frac_copy=nbytes_g / ours / 1e6 / self.copy_GBps, speedup=float("nan"))
        del table, out, dy, ws, uk, rows, keys, offsets
        torch.cuda.empty_cache()

    def variant_sweep(self, table, offsets, keys, out, nbytes, base):
        """Every compiled forward variant (same bits, different speed) on this workload."""
        core = self.core
        default = tuple(core._cuda_forward_variant())
        for variant in FORWARD_VARIANTS:
            core._set_cuda_forward_variant(*variant)
            ms = self.timer.median_ms(lambda: core.lookup_forward_cuda([table], [offsets], [keys], None, ["sum"], [out],
                                                                       stream=self.stream, check=False))
            self.record(**base, op="exp:fwd-sum R=%d U=%d minblk=%d%s" % (variant + ("*" if variant == default else "",)),
                        ours_ms=ms, torch_ms=float("nan"), bytes=nbytes, ours_GBps=nbytes / ms / 1e6,
                        torch_GBps=float("nan"), ours_frac_copy=nbytes / ms / 1e6 / self.copy_GBps,
                        speedup=float("nan"))
        core._set_cuda_forward_variant(*default)

    def backward_sweep(self, table, offsets, keys, dy, ws, base, n_unique):
        """Every backward variant (same bits): optimizer-state prefetch x register cap."""
        torch, core = self.torch, self.core
        default = tuple(core._cuda_backward_variant())
        batch, dim = dy.shape
        nnz = keys.numel()
        for opt in ("sgd", "adam"):
            mine = table.clone()
            m = torch.zeros_like(table) if opt == "adam" else None
            v = torch.zeros_like(table) if opt == "adam" else None
            nbytes = bwd_bytes(nnz, batch, dim, n_unique, 2 if opt == "adam" else 0)
            for variant in BACKWARD_VARIANTS:
                core._set_cuda_backward_variant(*variant)
                ms = self.timer.median_ms(lambda: core.lookup_backward_apply_cuda(
                    mine, offsets, keys, None, "sum", dy, opt, 0.01, m=m, v=v, epsilon=1e-8, step=1,
                    stream=self.stream, check=False, workspace=ws), inner=1)
                self.record(**base, op="exp:bwd-%s prefetch=%d minblk=%d%s" % (
                                opt, variant[0], variant[1], "*" if variant == default else ""),
                            ours_ms=ms, torch_ms=float("nan"), bytes=nbytes, ours_GBps=nbytes / ms / 1e6,
                            torch_GBps=float("nan"), ours_frac_copy=nbytes / ms / 1e6 / self.copy_GBps,
                            speedup=float("nan"))
            del mine, m, v
        core._set_cuda_backward_variant(*default)
        torch.cuda.empty_cache()

    def forward_experiments(self, table, offsets, keys, out, nbytes, base):
        """Ideas tried on the headline shape, kept measurable: the knobs and their effect."""
        torch, core = self.torch, self.core
        fwd = lambda tab: core.lookup_forward_cuda([tab], [offsets], [keys], None, ["sum"], [out],  # noqa: E731
                                                   stream=self.stream, check=False)
        if not self.args.variant_sweep:
            self.variant_sweep(table, offsets, keys, out, nbytes, base)
        # A table view 4 bytes off 16-byte alignment takes the scalar (4-byte load) path.
        flat = torch.empty(table.numel() + 1, device="cuda")
        flat[1:].copy_(table.view(-1))
        mis = flat[1:].view(table.shape)
        ms = self.timer.median_ms(lambda: fwd(mis))
        self.record(**base, op="exp:forward-sum 4-byte loads", ours_ms=ms, torch_ms=float("nan"), bytes=nbytes,
                    ours_GBps=nbytes / ms / 1e6, torch_GBps=float("nan"),
                    ours_frac_copy=nbytes / ms / 1e6 / self.copy_GBps, speedup=float("nan"))
        del flat, mis
        ms = self.timer.median_ms(lambda: core.lookup_forward_cuda([table], [offsets], [keys], None, ["sum"], [out],
                                                                   stream=self.stream, check=True))
        self.record(**base, op="exp:forward-sum check=True", ours_ms=ms, torch_ms=float("nan"), bytes=nbytes,
                    ours_GBps=nbytes / ms / 1e6, torch_GBps=float("nan"),
                    ours_frac_copy=nbytes / ms / 1e6 / self.copy_GBps, speedup=float("nan"))
        torch.cuda.empty_cache()

    def check_backward(self, name, dist, table, offsets, keys, dy, per_lookup):
        """Fused backward+SGD/Adam vs PyTorch's sparse backward + SGD/SparseAdam on a slice of the lookups."""
        torch, F, core = self.torch, self.F, self.core
        nb = min(65536, dy.shape[0])
        off = offsets[: nb + 1].contiguous()
        k = keys[: nb * per_lookup].contiguous()
        g = dy[:nb].contiguous()
        touched = torch.unique(k)
        probe = torch.arange(1000, device="cuda")
        probe = probe[~torch.isin(probe, touched)]  # rows the slice does not touch
        for opt in ("sgd", "adam"):
            mine = table.clone()
            m = torch.zeros_like(table) if opt == "adam" else None
            v = torch.zeros_like(table) if opt == "adam" else None
            core.lookup_backward_apply_cuda(mine, off, k, None, "mean", g, opt, 0.05, m=m, v=v, epsilon=1e-8,
                                            step=1, stream=self.stream)
            mine_rows = mine[touched]
            mine_m = m[touched] if opt == "adam" else None
            same_elsewhere = bool(torch.equal(mine[probe], table[probe]))
            del mine, m, v
            p = torch.nn.Parameter(table.clone())
            o = torch.optim.SGD([p], lr=0.05) if opt == "sgd" else torch.optim.SparseAdam([p], lr=0.05, eps=1e-8)
            F.embedding_bag(k, p, off, mode="mean", include_last_offset=True, sparse=True).backward(g)
            o.step()
            ref_rows = p.detach()[touched]
            # Hot keys sum up to ~10^5 terms in different orders on the two sides: compare with
            # a relative tolerance (|ours - torch| <= 1e-4 * (1 + |torch|)).
            rel = lambda a, b: float(((a - b).abs() / (1 + b.abs())).max())  # noqa: E731
            if opt == "sgd":
                err = rel(mine_rows, ref_rows)
                ok, detail = err < 1e-4, f"max |ours - torch| / (1 + |torch|) = {err:.3g}"
            else:
                # m = (1 - b1) g is well conditioned: compare it tightly. The first Adam step moves
                # each weight by ~lr * g / |g|, so where g nearly cancels (|g| ~ rounding of its
                # terms) the two sides' last-bit differences in g flip the step: compare the
                # weights only where |g| > 1e-4.
                ref_m = o.state[p]["exp_avg"][touched]
                err_m = rel(mine_m, ref_m)
                well = ref_m.abs() > 1e-5
                err = rel(mine_rows[well], ref_rows[well])
                ok = err_m < 1e-4 and err < 1e-4
                detail = (f"max rel. diff of m vs exp_avg = {err_m:.3g}; of weights = {err:.3g} over "
                          f"{int(well.sum()):,} of {well.numel():,} elements with |g| > 1e-4")
            del p, o, ref_rows, mine_rows, mine_m
            torch.cuda.empty_cache()
            self.check(f"{name}/{dist}/backward+{opt}", ok and same_elsewhere,
                       f"{touched.numel():,} touched rows, {detail}, untouched rows unchanged: {same_elsewhere}")

    # ---- 26 tables of different sizes, fused -----------------------------------------------
    def multi_table(self, dist, batch=65536):
        torch, F, core = self.torch, self.F, self.core
        n_tables = 26
        rows = [int(r) for r in np.geomspace(1_000, 4_000_000, n_tables)]
        dims = [[16, 32, 64, 128][t % 4] for t in range(n_tables)]
        print(f"\n== 26 tables / {dist}: rows {rows[0]:,}..{rows[-1]:,}, dims 16/32/64/128, "
              f"{batch:,} lookups x 1 key each", flush=True)
        tables = [torch.randn(r, d, device="cuda") for r, d in zip(rows, dims)]
        keys = [torch.from_numpy(make_keys(self.rng, batch, r, dist)).cuda() for r in rows]
        offs = [torch.arange(batch + 1, dtype=torch.int64, device="cuda") for _ in rows]
        outs = [torch.empty(batch, d, device="cuda") for d in dims]
        core.lookup_forward_cuda(tables, offs, keys, None, ["sum"] * n_tables, outs, stream=self.stream, check=True)
        err = max(float((o - F.embedding_bag(k, t, f, mode="sum", include_last_offset=True)).abs().max())
                  for o, t, k, f in zip(outs, tables, keys, offs))
        self.check(f"26tables/{dist}/forward", err < 1e-5, f"max |ours - embedding_bag| = {err:.3g}")
        nbytes = sum(fwd_bytes(batch, batch, batch, d) for d in dims)
        ours = self.timer.median_ms(lambda: core.lookup_forward_cuda(tables, offs, keys, None, ["sum"] * n_tables,
                                                                     outs, stream=self.stream, check=False))

        def torch_fwd():
            for t, k, f in zip(tables, keys, offs):
                F.embedding_bag(k, t, f, mode="sum", include_last_offset=True)
        theirs = self.timer.median_ms(torch_fwd)
        base = dict(workload="26tables", dist=dist, rows=sum(rows), dim=0, lookups=batch * n_tables, keys_per_lookup=1,
                    unique=0)
        self.record(**base, op="forward-sum (1 launch)", ours_ms=ours, torch_ms=theirs, bytes=nbytes,
                    ours_GBps=nbytes / ours / 1e6, torch_GBps=nbytes / theirs / 1e6,
                    ours_frac_copy=nbytes / ours / 1e6 / self.copy_GBps, speedup=theirs / ours)
        if dist == "uniform":
            def per_table():
                for t, k, f, o in zip(tables, keys, offs, outs):
                    core.lookup_forward_cuda([t], [f], [k], None, ["sum"], [o], stream=self.stream, check=False)
            ms = self.timer.median_ms(per_table)
            self.record(**base, op="exp:forward-sum 26 launches", ours_ms=ms, torch_ms=float("nan"), bytes=nbytes,
                        ours_GBps=nbytes / ms / 1e6, torch_GBps=float("nan"),
                        ours_frac_copy=nbytes / ms / 1e6 / self.copy_GBps, speedup=float("nan"))
        # backward + SGD: all 26 tables in one call (one shared sort), and table by table
        dys = [torch.randn(batch, d, device="cuda") for d in dims]
        ws = torch.empty(core.lookup_backward_apply_multi_cuda_workspace_size([batch] * n_tables, [batch] * n_tables,
                                                                              dims, rows),
                         dtype=torch.uint8, device="cuda")
        mine = [t.clone() for t in tables]
        single = [t.clone() for t in tables]
        core.lookup_backward_apply_multi_cuda(mine, offs, keys, None, ["sum"] * n_tables, dys, "sgd", 0.01,
                                              stream=self.stream, check=True, workspace=ws)
        for t, k, f, dy in zip(single, keys, offs, dys):
            core.lookup_backward_apply_cuda(t, f, k, None, "sum", dy, "sgd", 0.01, stream=self.stream, workspace=ws)
        same = all(torch.equal(a, b) for a, b in zip(mine, single))
        self.check(f"26tables/{dist}/backward+sgd one call == per table", same, f"bitwise equal: {same}")
        del single

        def ours_multi():
            core.lookup_backward_apply_multi_cuda(mine, offs, keys, None, ["sum"] * n_tables, dys, "sgd", 0.01,
                                                  stream=self.stream, check=False, workspace=ws)
        ours_one_call = self.timer.median_ms(ours_multi, inner=1)

        def ours_bwd():
            for t, k, f, dy in zip(mine, keys, offs, dys):
                core.lookup_backward_apply_cuda(t, f, k, None, "sum", dy, "sgd", 0.01, stream=self.stream,
                                                check=False, workspace=ws)
        ours = self.timer.median_ms(ours_bwd, inner=1)
        del mine
        params = [torch.nn.Parameter(t.clone()) for t in tables]
        o = torch.optim.SGD(params, lr=0.01)
        holder = {}

        def setup():
            o.zero_grad(set_to_none=True)
            holder["ys"] = [F.embedding_bag(k, p, f, mode="sum", include_last_offset=True, sparse=True)
                            for p, k, f in zip(params, keys, offs)]

        def theirs_bwd():
            torch.autograd.backward(holder["ys"], dys)
            o.step()
        theirs = self.timer.median_ms(theirs_bwd, setup=setup)
        uniq = sum(int(torch.unique(k).numel()) for k in keys)
        nbytes_b = sum(bwd_bytes(batch, batch, d, 0, 0) for d in dims) + sum(
            2 * int(torch.unique(k).numel()) * d * 4 for k, d in zip(keys, dims))
        self.record(**base, op="backward+sgd (1 call)", ours_ms=ours_one_call, torch_ms=theirs, bytes=nbytes_b,
                    ours_GBps=nbytes_b / ours_one_call / 1e6, torch_GBps=nbytes_b / theirs / 1e6,
                    ours_frac_copy=nbytes_b / ours_one_call / 1e6 / self.copy_GBps, speedup=theirs / ours_one_call)
        self.record(**base, op="exp:backward+sgd 26 calls", ours_ms=ours, torch_ms=theirs, bytes=nbytes_b,
                    ours_GBps=nbytes_b / ours / 1e6, torch_GBps=nbytes_b / theirs / 1e6,
                    ours_frac_copy=nbytes_b / ours / 1e6 / self.copy_GBps, speedup=theirs / ours)
        del tables, keys, offs, outs, dys, params, o, holder, ws
        print(f"  ({uniq:,} unique keys over the 26 tables)")
        torch.cuda.empty_cache()

    def run(self):
        torch = self.torch
        self.info = gpu_info(torch)
        if self.args.variant:
            self.core._set_cuda_forward_variant(*self.args.variant)
        self.info["forward_variant"] = tuple(self.core._cuda_forward_variant())
        self.info["backward_variant"] = tuple(self.core._cuda_backward_variant())
        print(f"GPU: {self.info}", flush=True)
        self.copy_GBps, copy_ms = copy_bandwidth(torch, self.timer)
        print(f"device copy: {self.copy_GBps:,.0f} GB/s (1 GiB read + 1 GiB written in {copy_ms:.3f} ms)", flush=True)
        a = self.args
        lookups = a.batch * 26
        shapes = {"128d-1key": (128, 1), "128d-10key": (128, 10), "16d-1key": (16, 1)}
        for dist in a.dists:
            for w in a.workloads:
                self.single_table(w, a.rows, shapes[w][0], lookups, shapes[w][1], dist)
            if not a.skip_multi:
                self.multi_table(dist, a.batch)
        self.report()

    def report(self):
        print("\n" + "=" * 118)
        print(f"{'workload':<12}{'dist':<9}{'op':<34}{'ours ms':>9}{'torch ms':>10}{'ours GB/s':>11}"
              f"{'torch GB/s':>11}{'of copy':>9}{'speedup':>9}{'floor ms':>9}{'of floor':>9}{'spread':>8}")
        for r in self.rows:
            fl, of = r.get("floor_ms", float("nan")), r.get("of_floor", float("nan"))
            sp = f"{r['spread']:>8.1%}" if "spread" in r else f"{'':>8}"
            print(f"{r['workload']:<12}{r['dist']:<9}{r['op']:<34}{r['ours_ms']:>9.3f}{r['torch_ms']:>10.3f}"
                  f"{r['ours_GBps']:>11,.0f}{r['torch_GBps']:>11,.0f}{r['ours_frac_copy']:>9.1%}{r['speedup']:>9.2f}"
                  f"{fl:>9.3f}{of:>9.1%}{sp}")
        print(f"device copy: {self.copy_GBps:,.0f} GB/s on {self.info['gpu']} (driver {self.info['driver']})")
        path = out_path("lookup_gpu", self.info)
        path.write_text(json.dumps({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join([sys.executable] + sys.argv), "info": self.info,
            "copy_GBps": self.copy_GBps, "args": vars(self.args), "checks": self.checks, "rows": self.rows},
            indent=1, default=float))
        print(f"wrote {path}")

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000, help="rows of the big tables")
    ap.add_argument("--batch", type=int, default=65536, help="lookups per feature (x26 features)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--dists", nargs="+", default=["uniform", "zipf"], choices=["uniform", "zipf"])
    ap.add_argument("--skip-multi", action="store_true", help="skip the 26-table workload")
    ap.add_argument("--workloads", nargs="+", default=["128d-1key", "128d-10key", "16d-1key"],
                    choices=["128d-1key", "128d-10key", "16d-1key"])
    ap.add_argument("--forward-only", action="store_true", help="time the forward only (no backward)")
    ap.add_argument("--variant", type=int, nargs=3, default=None, metavar=("R", "U", "MINBLK"),
                    help="forward variant for every timing (default: the library's)")
    ap.add_argument("--variant-sweep", action="store_true",
                    help="time every forward variant on every forward workload")
    Bench(ap.parse_args()).run()


if __name__ == "__main__":
    main()
