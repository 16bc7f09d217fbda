"""GPU benchmark of EmbedLab's fused backward + per-table optimizer (SGD, Adagrad, Adam, FTRL: the four
Keras-RS optimizers) against the PyTorch a user would write, after a float64 check of EmbedLab's update.

Run on a CUDA machine with PyTorch, after building the module (standalone is enough):

    cmake -S helpers -B /tmp/b -G Ninja -DEMBEDLAB_BUILD_TF=OFF -DEMBEDLAB_CUDA=ON \\
          -DEMBEDLAB_CUDA_ARCHITECTURES=90 -DPython_EXECUTABLE=$(which python3) && ninja -C /tmp/b
    EMBEDLAB_CORE_STANDALONE=1 PYTHONPATH=/tmp/b python3 helpers/benchmarks/sparse_optimizers_gpu.py

For each optimizer, dim (16, 128) and keys per lookup (1, 10), on a 10,000,000-row table with
batch 65,536 (sum combiner):

1. Check. From a random state (slots too), one step of EmbedLab's `lookup_backward_apply_cuda`
   on a batch with empty bags, -1 padding, keys repeated inside a bag and hot keys repeated across
   bags is compared with an independent float64 reference computed in PyTorch on the touched rows
   of the same state: the gradient summed per key in float64 from the output gradient, then Keras
   3's update as the binding implements it (helpers/csrc/core/sparse_optimizer.h):
     SGD      w -= lr g
     Adagrad  a += g g;  w -= lr g / sqrt(a + eps)                     (eps inside the root)
     Adam     m += (g - m)(1 - b1);  v += (g g - v)(1 - b2);
              w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)   (lazy: touched rows only)
     FTRL     Keras' FTRL-Proximal on the touched rows (n, z; see sparse_optimizer.h)
   The check's hyperparameters (CHECK_HP) make every term visible at float32 precision (a large
   Adagrad / Adam epsilon, non-default betas, step 3, every FTRL term on). Every element of the
   touched rows of the table and the slots must satisfy |ours - ref| <= ATOL + RTOL |ref|, and
   sampled untouched rows must keep their bits; any failure raises, naming the case.
2. Timing (speed comparison only: the two sides do not compute the same numbers in every case).
   EmbedLab: `lookup_backward_apply_cuda(...)` (check=False, a preallocated workspace). PyTorch:
   `embedding_bag(..., mode="sum", sparse=True)`'s backward (the forward recorded once, outside the
   timing) and then
     SGD      torch.optim.SGD (sparse gradient): the same update.
     Adagrad  torch.optim.Adagrad (sparse gradient): w -= lr g / (sqrt(a) + eps), eps outside the
              root where Keras puts it inside; initial_accumulator_value 0.1 on both sides.
     Adam     torch.optim.SparseAdam: lazy Adam with the same formula, but its step count t is its
              own, one per step() call, so it grows during the timing while EmbedLab is given
              step=1 each call (the count changes only a host-side scalar, not the work).
     FTRL     PyTorch has none: Keras' FTRL written out on the coalesced gradient's rows with
              gathers and index_copy_ (torch_ftrl below).
   Both start from the same state; the largest difference of the touched table rows after one
   step is recorded (informative: Adagrad's epsilon placement shows there). Times are CUDA-event
   medians (benchmarks/_gpu.events_ms).

Prints a table and writes JSON ($OUT/sparse_optimizers_gpu_<gpu>_<time>.json when OUT is set,
else docs/benchmarks/results/). Takes about 20 s on an H200 (at most about 35 GB of GPU memory:
Adam at dim 128, both sides' tables and two slots).
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

import _gpu

OPTIMIZERS = ("sgd", "adagrad", "adam", "ftrl")

# Timing hyperparameters: the same values on both sides (Keras' defaults where they have one).
HP = {
    "sgd": dict(lr=0.05),
    "adagrad": dict(lr=0.05, epsilon=1e-7, initial_accumulator_value=0.1),
    "adam": dict(lr=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    "ftrl": dict(lr=0.05, lr_power=-0.5, l1=0.001, l2=0.01, l2_shrinkage=0.0, beta=0.1, initial_accumulator_value=0.1),
}
# Check hyperparameters: every term of each update visible in float32 (a misplaced epsilon, a
# wrong beta or bias correction, a missing FTRL term would all exceed the tolerance).
CHECK_HP = {
    "sgd": dict(lr=0.3),
    "adagrad": dict(lr=0.2, epsilon=0.05),
    "adam": dict(lr=0.02, beta_1=0.8, beta_2=0.95, epsilon=0.01, step=3),
    "ftrl": dict(lr=0.2, lr_power=-0.5, l1=0.05, l2=0.3, l2_shrinkage=0.1, beta=0.7),
}
RTOL, ATOL = 2e-5, 2e-5  # float32 state and per-key sums against float64; hot keys sum ~100 rows
SLOTS = {"sgd": (), "adagrad": ("accumulator",), "adam": ("m", "v"), "ftrl": ("accumulator", "linear")}


def slot_kwargs(opt, slots):
    """The binding's keyword arguments for the optimizer's slot tensors."""
    return dict(zip(SLOTS[opt], slots))


def hyper_kwargs(opt, hp):
    """The binding's keyword arguments for the optimizer's hyperparameters (lr is positional)."""
    if opt == "sgd":
        return {}
    if opt == "adagrad":
        return dict(epsilon=hp["epsilon"])
    if opt == "adam":
        return dict(beta_1=hp["beta_1"], beta_2=hp["beta_2"], epsilon=hp["epsilon"], step=hp.get("step", 1))
    return {k: hp[k] for k in ("lr_power", "l1", "l2", "l2_shrinkage", "beta")}


def apply_ours(core, opt, W, slots, offsets, keys, dy, hp, stream, check, workspace=None):
    """One fused backward + `opt` step through the framework-free binding (sum combiner, no weights)."""
    core.lookup_backward_apply_cuda(W, offsets, keys, None, "sum", dy, opt, hp["lr"], **slot_kwargs(opt, slots),
                                    **hyper_kwargs(opt, hp), stream=stream, check=check, workspace=workspace)


# ---- the float64 reference -----------------------------------------------------------------------

def summed_grad64(torch, offsets, keys, dy):
    """(unique valid keys ascending, their summed gradient rows in float64) of a sum-combined lookup."""
    bag = torch.repeat_interleave(torch.arange(len(offsets) - 1, device=keys.device), offsets.diff())
    valid = keys >= 0
    uk, inv = torch.unique(keys[valid], return_inverse=True)
    g = torch.zeros(len(uk), dy.shape[1], dtype=torch.float64, device=dy.device)
    g.index_add_(0, inv, dy.double()[bag[valid]])
    return uk, g


def reference_step(torch, opt, w, s, g, hp):
    """Keras 3's update of `opt` on the touched rows in float64: w, slots s (list) -> new (w, slots)."""
    lr = hp["lr"]
    if opt == "sgd":
        return w - lr * g, []
    if opt == "adagrad":
        a = s[0] + g * g
        return w - lr * g / torch.sqrt(a + hp["epsilon"]), [a]
    if opt == "adam":
        b1, b2, t = hp["beta_1"], hp["beta_2"], hp["step"]
        m = s[0] + (g - s[0]) * (1 - b1)
        v = s[1] + (g * g - s[1]) * (1 - b2)
        alpha = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        return w - alpha * m / (torch.sqrt(v) + hp["epsilon"]), [m, v]
    n, z = s
    p = -hp["lr_power"]
    l2 = hp["l2"] + hp["beta"] / (2 * lr)
    n_new = n + g * g
    z = z + g + 2 * hp["l2_shrinkage"] * w - (n_new ** p - n ** p) / lr * w
    w = (z.clamp(-hp["l1"], hp["l1"]) - z) / (n_new ** p / lr + 2 * l2)
    return w, [n_new, z]


def check_batch(torch, rng, rows, batch, k, dev):
    """CSR ids for the check: k keys per bag, 5% empty bags, 3% -1 padding, 10% of bags (k > 1)
    repeating their first key, 3% of keys from 256 hot rows (repeated across many bags)."""
    lengths = np.full(batch, k, np.int64)
    lengths[rng.random(batch) < 0.05] = 0
    offsets = np.zeros(batch + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    nnz = int(offsets[-1])
    keys = rng.integers(0, rows, nnz)
    hot = rng.integers(0, rows, 256)
    pick = rng.random(nnz) < 0.03
    keys[pick] = hot[rng.integers(0, 256, int(pick.sum()))]
    if k > 1:
        starts = offsets[:-1][(lengths > 1) & (rng.random(batch) < 0.1)]
        keys[starts + 1] = keys[starts]
    keys[rng.random(nnz) < 0.03] = -1
    return torch.from_numpy(offsets).to(dev), torch.from_numpy(keys).to(dev)


def random_state(torch, opt, W, slots):
    """A valid random optimizer state in place (Adagrad / FTRL accumulators > 0)."""
    if opt == "adagrad":
        slots[0].uniform_(0.0, 0.3)
    elif opt == "adam":
        slots[0].normal_(0.0, 0.1)
        slots[1].uniform_(0.0, 0.05)
    elif opt == "ftrl":
        slots[0].uniform_(0.05, 0.5)
        slots[1].normal_(0.0, 0.1)


def check_against_float64(torch, core, opt, W, slots, rng, batch, k, stream):
    """One EmbedLab step on a check batch from a random state, compared with reference_step.

    Returns {"max_abs_err": ..., "worst_ratio": ...} (ratio = error / (ATOL + RTOL |ref|), <= 1);
    raises AssertionError naming the optimizer, tensor, element and values otherwise.
    """
    rows, dim = W.shape
    dev = W.device
    random_state(torch, opt, W, slots)
    offsets, keys = check_batch(torch, rng, rows, batch, k, dev)
    dy = torch.randn(batch, dim, device=dev)
    uk, g = summed_grad64(torch, offsets, keys, dy)
    before = [W.index_select(0, uk).double()] + [s.index_select(0, uk).double() for s in slots]
    untouched = torch.from_numpy(rng.integers(0, rows, 4096)).to(dev)
    untouched = untouched[~torch.isin(untouched, uk)]
    kept = [x.index_select(0, untouched).clone() for x in [W, *slots]]
    apply_ours(core, opt, W, slots, offsets, keys, dy, CHECK_HP[opt], stream, check=True)
    w_ref, s_ref = reference_step(torch, opt, before[0], before[1:], g, CHECK_HP[opt])
    names = ["table", *SLOTS[opt]]
    worst, max_abs = 0.0, 0.0
    for name, x, want in zip(names, [W, *slots], [w_ref, *s_ref]):
        got = x.index_select(0, uk).double()
        err = (got - want).abs()
        ratio = err / (ATOL + RTOL * want.abs())
        i = int(ratio.argmax())
        r, c = divmod(i, dim)
        worst, max_abs = max(worst, float(ratio.max())), max(max_abs, float(err.max()))
        if not bool(torch.isfinite(got).all()) or float(ratio.max()) > 1.0:
            raise AssertionError(
                f"{opt} dim {dim} keys/lookup {k}: {name} differs from the float64 reference beyond "
                f"|d| <= {ATOL} + {RTOL}|ref|: row {int(uk[r])} column {c}: got {float(got[r, c])!r}, "
                f"want {float(want[r, c])!r} (state before: "
                f"{[float(b[r, c]) for b in before]}, summed gradient {float(g[r, c])!r})")
    for name, x, b in zip(names, [W, *slots], kept):
        if not torch.equal(x.index_select(0, untouched), b):
            raise AssertionError(f"{opt} dim {dim} keys/lookup {k}: {name} changed rows the batch did not touch")
    return dict(max_abs_err=max_abs, worst_ratio=worst, touched_rows=len(uk), nnz=len(keys))


# ---- PyTorch -------------------------------------------------------------------------------------

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


def torch_step_fn(torch, opt, Wt, hp):
    """step(grad) that applies what a PyTorch user would use for `opt` to Wt (a Parameter)."""
    if opt == "sgd":
        o = torch.optim.SGD([Wt], lr=hp["lr"])
    elif opt == "adagrad":
        o = torch.optim.Adagrad([Wt], lr=hp["lr"], eps=hp["epsilon"],
                                initial_accumulator_value=hp["initial_accumulator_value"])
    elif opt == "adam":
        o = torch.optim.SparseAdam([Wt], lr=hp["lr"], betas=(hp["beta_1"], hp["beta_2"]), eps=hp["epsilon"])
    else:
        N = torch.full_like(Wt.data, hp["initial_accumulator_value"])
        Z = torch.zeros_like(Wt.data)

        def ftrl():
            with torch.no_grad():
                torch_ftrl(torch, Wt.data, N, Z, Wt.grad, hp)
        return ftrl, (N, Z)
    return o.step, (o,)


def initial_slots(torch, opt, W):
    """EmbedLab's slots for `opt`, allocated like W and set by reset_slots."""
    slots = [torch.empty_like(W) for _ in SLOTS[opt]]
    reset_slots(opt, slots)
    return slots


def reset_slots(opt, slots):
    """The state PyTorch's optimizer starts from: accumulators at initial_accumulator_value, the rest 0."""
    for name, s in zip(SLOTS[opt], slots):
        s.fill_(HP[opt]["initial_accumulator_value"] if name == "accumulator" else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--optimizers", nargs="+", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dims", type=int, nargs="+", default=[16, 128])
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--keys", type=int, nargs="+", default=[1, 10], help="keys per lookup")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    import torch
    core = _gpu.load_core()
    if not hasattr(core, "lookup_backward_apply_cuda") or core.cuda_device_count() == 0:
        sys.exit(f"{core.__name__} has no CUDA kernels or sees no GPU: build it with -DEMBEDLAB_CUDA=ON "
                 "(see this script's docstring) on a CUDA machine")
    info = _gpu.gpu_info(torch)
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    rng = np.random.default_rng(0)
    torch.manual_seed(0)
    rows_out = []
    print(f"{'opt':>8} {'dim':>4} {'keys':>4}  {'embedlab ms':>11} {'torch ms':>9} {'ratio':>6}  "
          f"{'check max|err|':>14} {'vs torch max|d|':>15}", flush=True)
    for opt in args.optimizers:
        for dim in args.dims:
            for k in args.keys:
                W = torch.randn(args.rows, dim, device=dev)
                slots = initial_slots(torch, opt, W)
                chk = check_against_float64(torch, core, opt, W, slots, rng, args.batch, k, stream)

                # Timing from the state PyTorch's optimizer starts from (W as the check left it).
                reset_slots(opt, slots)
                keys = torch.from_numpy(rng.integers(0, args.rows, args.batch * k)).to(dev)
                offsets = torch.arange(0, args.batch * k + 1, k, device=dev, dtype=torch.int64)
                dy = torch.randn(args.batch, dim, device=dev)
                ws = torch.empty(core.lookup_backward_cuda_workspace_size(args.batch, args.batch * k, dim, args.rows),
                                 dtype=torch.uint8, device=dev)
                Wt = torch.nn.Parameter(W.clone())
                step, keep = torch_step_fn(torch, opt, Wt, HP[opt])
                out = torch.nn.functional.embedding_bag(keys, Wt, offsets[:-1], mode="sum", sparse=True)

                def ours(W=W, slots=slots, keys=keys, offsets=offsets, dy=dy, ws=ws, opt=opt):
                    apply_ours(core, opt, W, slots, offsets, keys, dy, HP[opt], stream, check=False, workspace=ws)

                def theirs(Wt=Wt, out=out, dy=dy, step=step):
                    Wt.grad = None
                    out.backward(dy, retain_graph=True)
                    step()

                ours()
                theirs()
                torch.cuda.synchronize()
                touched = torch.unique(keys)
                diff = float((W.index_select(0, touched) - Wt.data.index_select(0, touched)).abs().max())
                ms_ours = _gpu.events_ms(torch, ours, args.reps)
                ms_torch = _gpu.events_ms(torch, theirs, args.reps)
                row = dict(optimizer=opt, dim=dim, keys_per_lookup=k, rows=args.rows, batch=args.batch,
                           embedlab_ms=ms_ours, torch_ms=ms_torch, speedup=ms_torch / ms_ours, max_abs_diff=diff,
                           check=chk)
                rows_out.append(row)
                print(f"{opt:>8} {dim:>4} {k:>4}  {ms_ours:11.3f} {ms_torch:9.3f} {ms_torch / ms_ours:6.1f}  "
                      f"{chk['max_abs_err']:14.2e} {diff:15.2e}", flush=True)
                del W, slots, Wt, step, keep, out, ws
                torch.cuda.empty_cache()
    path = _gpu.out_path("sparse_optimizers_gpu", info)
    path.write_text(json.dumps(dict(info=info, hyperparameters=HP, check_hyperparameters=CHECK_HP,
                                    check_tolerance=dict(rtol=RTOL, atol=ATOL), results=rows_out), indent=1))
    print("wrote", path)


if __name__ == "__main__":
    main()
