"""GPU benchmark of EmbedLab's fused backward + FTRL against the PyTorch a user would write.

Run on a CUDA machine with PyTorch, after building the module (standalone is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    PYTHONPATH=/tmp/b python3 helpers/benchmarks/ftrl_gpu.py

PyTorch has no FTRL: the baseline is `embedding_bag(sparse=True)`'s backward (the forward is
recorded once, outside the timing), the sparse gradient coalesced, and Keras' FTRL written out
on the touched rows with gathers and index_copy_. EmbedLab: `lookup_backward_apply_cuda(...,
"ftrl")` (check=False, a preallocated workspace). Both are checked against each other on the
same step first. Times are CUDA-event medians (benchmarks/_gpu.events_ms). Prints a table and
writes JSON ($OUT/ftrl_gpu_<gpu>_<time>.json when OUT is set, else results/).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import _gpu

HP = dict(lr=0.05, lr_power=-0.5, l1=0.001, l2=0.01, l2_shrinkage=0.0, beta=0.1)


def torch_ftrl(torch, W, N, Z, grad, hp):
    """Keras 3's FTRL on the rows of a sparse (COO) gradient, as a PyTorch user writes it."""
    g = grad.coalesce()
    idx, gv = g.indices()[0], g.values()
    w, n, z = W.index_select(0, idx), N.index_select(0, idx), Z.index_select(0, idx)
    lr, p = hp["lr"], -hp["lr_power"]
    l2 = hp["l2"] + hp["beta"] / (2 * lr)
    n_new = n + gv * gv
    p_new = n_new.pow(p)
    z = z + (gv + 2 * hp["l2_shrinkage"] * w) - (p_new - n.pow(p)) / lr * w
    w = (z.clamp(-hp["l1"], hp["l1"]) - z) / (p_new / lr + 2 * l2)
    W.index_copy_(0, idx, w)
    N.index_copy_(0, idx, n_new)
    Z.index_copy_(0, idx, z)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--keys", type=int, nargs="+", default=[1, 10], help="keys per lookup")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch
    core = _gpu.load_core()
    info = _gpu.gpu_info(torch)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rng = np.random.default_rng(0)
    rows_out = []
    for dim in args.dims:
        W = torch.randn(args.rows, dim, device=dev)
        N = torch.full((args.rows, dim), 0.1, device=dev)
        Z = torch.zeros(args.rows, dim, device=dev)
        for k in args.keys:
            keys = torch.from_numpy(rng.integers(0, args.rows, args.batch * k)).to(dev)
            offsets = torch.arange(0, args.batch * k + 1, k, device=dev, dtype=torch.int64)
            dy = torch.randn(args.batch, dim, device=dev)
            ws = torch.empty(core.lookup_backward_cuda_workspace_size(args.batch, args.batch * k, dim, args.rows),
                             dtype=torch.uint8, device=dev)

            def ours(W=W, N=N, Z=Z, keys=keys, offsets=offsets, dy=dy, ws=ws):
                core.lookup_backward_apply_cuda(W, offsets, keys, None, "sum", dy, "ftrl", HP["lr"], accumulator=N,
                                                linear=Z, lr_power=HP["lr_power"], l1=HP["l1"], l2=HP["l2"],
                                                l2_shrinkage=HP["l2_shrinkage"], beta=HP["beta"], stream=stream,
                                                check=False, workspace=ws)

            Wt = torch.nn.Parameter(W.clone())
            Nt, Zt = N.clone(), Z.clone()
            out = torch.nn.functional.embedding_bag(keys, Wt, offsets[:-1], mode="sum", sparse=True)

            def theirs(Wt=Wt, Nt=Nt, Zt=Zt, out=out, dy=dy):
                Wt.grad = None
                out.backward(dy, retain_graph=True)
                with torch.no_grad():
                    torch_ftrl(torch, Wt.data, Nt, Zt, Wt.grad, HP)

            # correctness: one step on both from the same state
            ours()
            theirs()
            torch.cuda.synchronize()
            err = max(float((a - b).abs().max()) for a, b in ((W, Wt.data), (N, Nt), (Z, Zt)))
            ms_ours = _gpu.events_ms(torch, ours, args.reps)
            ms_torch = _gpu.events_ms(torch, theirs, args.reps)
            row = dict(dim=dim, keys_per_lookup=k, rows=args.rows, batch=args.batch, max_abs_diff=err,
                       embedlab_ms=ms_ours, torch_ms=ms_torch, speedup=ms_torch / ms_ours)
            rows_out.append(row)
            print(f"{dim:>4}d {k:>2} keys  embedlab {ms_ours:8.3f} ms  torch {ms_torch:8.3f} ms  "
                  f"x{ms_torch / ms_ours:5.1f}  max|diff| after one step {err:.2e}", flush=True)
        del W, N, Z
        torch.cuda.empty_cache()
    path = _gpu.out_path("ftrl_gpu", info)
    path.write_text(json.dumps(dict(info=info, hyperparameters=HP, results=rows_out), indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
