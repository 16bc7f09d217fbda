"""SGD, Adagrad and lazy Adam on the GPU, through `_embedlab_core`'s CUDA binding, against the float64
NumPy references of reference.py (`np_sgd`, `np_adagrad`, `np_lazy_adam`: Keras 3's formulas on the
touched rows, duplicates summed first). test_cuda_kernels.py compares these kernels with the CPU's;
this compares them with the formula itself. FTRL has the same check in test_ftrl.py.

Entry points: the fused backward + optimizer (`lookup_backward_apply_cuda`, and
`lookup_backward_apply_multi_cuda` over several tables) on random CSR ids with empty rows, -1
padding, keys repeated inside a row and Zipf-hot keys repeated across rows (more than 32
contributions: the hot-key path), sum and mean, with and without weights; and the row updates
(`sparse_<opt>_cuda`) on indices in any order with repeats. Several steps each, Adam's step
counting up. The hyperparameters make every term visible in float32: an Adagrad epsilon that
tells sqrt(acc + eps) from sqrt(acc) + eps, non-default Adam betas, an Adam epsilon that matters.
Marked needs_gpu: skipped with the reason where the module has no CUDA kernels or no GPU is visible.
"""

import numpy as np
import pytest

import reference as ref
from gpu_arrays import core_and_device

core, DEV, _ = core_and_device("cuda_device_count")
pytestmark = pytest.mark.needs_gpu("cuda_device_count")

HP = dict(lr=0.2, epsilon=0.05, beta_1=0.8, beta_2=0.95)
ADAM_EPS = 0.01
OPTS = ["sgd", "adagrad", "adam"]


def _state(rng, rows, dim):
    """Table, slot1 (Adagrad accumulator or Adam m), slot2 (Adam v): random, valid."""
    w = rng.standard_normal((rows, dim)).astype(np.float32)
    s1 = rng.uniform(0.0, 0.3, (rows, dim)).astype(np.float32)
    s2 = rng.uniform(0.0, 0.05, (rows, dim)).astype(np.float32)
    return w, s1, s2


def _eps(opt):
    return ADAM_EPS if opt == "adam" else HP["epsilon"]


def _ref_step(opt, st, idx, g, step):
    """One float64 reference step on (w, s1, s2); unused slots pass through."""
    w, s1, s2 = st
    if opt == "sgd":
        return ref.np_sgd(w, idx, g, HP["lr"]), s1, s2
    if opt == "adagrad":
        w, s1 = ref.np_adagrad(w, s1, idx, g, HP["lr"], eps=HP["epsilon"])
        return w, s1, s2
    return ref.np_lazy_adam(w, s1, s2, idx, g, HP["lr"], step, b1=HP["beta_1"], b2=HP["beta_2"], eps=ADAM_EPS)


def _slots(opt, d):
    """The binding's slot keywords for one table's device state d = (w, s1, s2)."""
    if opt == "adagrad":
        return dict(accumulator=d[1])
    if opt == "adam":
        return dict(m=d[1], v=d[2])
    return {}


def _check(opt, got, want, touched, initial):
    # float32 state and per-key float32 sums against float64 (hot keys sum up to ~100 rows)
    names = ["table", "slot1", "slot2"][: {"sgd": 1, "adagrad": 2, "adam": 3}[opt]]
    for name, g, w, init in zip(names, got, want, initial):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=2e-5, atol=1e-5, err_msg=f"{opt} {name}")
        assert np.array_equal(g[~touched], init[~touched]), f"{opt} {name}: a row no step touched changed"


@pytest.mark.parametrize("opt", OPTS)
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_fused_backward_apply_cuda_matches_float64(rng, opt, combiner):
    rows, dim, batch = int(rng.integers(20, 600)), int(rng.choice([1, 4, 16, 33, 128])), int(rng.integers(1, 300))
    init = _state(rng, rows, dim)
    d = [DEV.put(x) for x in init]
    want = tuple(x.astype(np.float64) for x in init)
    touched = np.zeros(rows, bool)
    for step in range(1, 4):
        offsets, keys = ref.random_csr(rng, batch, rows, max_nnz=6, zipf=step == 2)
        weights = rng.uniform(0.5, 2, len(keys)).astype(np.float32) if step != 1 else None
        dy = rng.standard_normal((batch, dim)).astype(np.float32)
        core.lookup_backward_apply_cuda(d[0], DEV.put(offsets), DEV.put(keys),
                                        None if weights is None else DEV.put(weights), combiner, DEV.put(dy), opt,
                                        HP["lr"], **_slots(opt, d), epsilon=_eps(opt), beta_1=HP["beta_1"],
                                        beta_2=HP["beta_2"], step=step, stream=DEV.stream())
        uk, g = ref.csr_lookup_grad(offsets, keys, weights, combiner, dy)
        want = _ref_step(opt, want, uk, g, step)
        touched[uk] = True
    _check(opt, [DEV.get(x) for x in d], want, touched, init)


@pytest.mark.parametrize("opt", OPTS)
def test_fused_backward_apply_multi_cuda_matches_float64(rng, opt):
    shapes = [(int(rng.integers(1, 400)), dim) for dim in (1, 4, 16, 33, 128)]
    combs = ["sum", "mean", "mean", "sum", "mean"]
    init = [_state(rng, r, dim) for r, dim in shapes]
    d = [[DEV.put(x) for x in s] for s in init]
    want = [tuple(x.astype(np.float64) for x in s) for s in init]
    touched = [np.zeros(r, bool) for r, _ in shapes]
    for step in range(1, 4):
        ids = [ref.random_csr(rng, 40, r, max_nnz=5, zipf=True) for r, _ in shapes]
        ws = [rng.uniform(0.5, 2, len(k)).astype(np.float32) for _, k in ids]
        dys = [rng.standard_normal((40, dim)).astype(np.float32) for _, dim in shapes]
        slots = dict(accumulators=[x[1] for x in d]) if opt == "adagrad" else (
            dict(m=[x[1] for x in d], v=[x[2] for x in d]) if opt == "adam" else {})
        core.lookup_backward_apply_multi_cuda([x[0] for x in d], [DEV.put(o) for o, _ in ids],
                                              [DEV.put(k) for _, k in ids], [DEV.put(w) for w in ws], combs,
                                              [DEV.put(dy) for dy in dys], opt, HP["lr"], **slots,
                                              epsilon=_eps(opt), beta_1=HP["beta_1"], beta_2=HP["beta_2"],
                                              step=step, stream=DEV.stream())
        for t, ((o, k), w, c, dy) in enumerate(zip(ids, ws, combs, dys)):
            uk, g = ref.csr_lookup_grad(o, k, w, c, dy)
            want[t] = _ref_step(opt, want[t], uk, g, step)
            touched[t][uk] = True
    for t in range(len(shapes)):
        _check(opt, [DEV.get(x) for x in d[t]], want[t], touched[t], init[t])


@pytest.mark.parametrize("opt", OPTS)
def test_sparse_update_cuda_sums_duplicates_and_matches_float64(rng, opt):
    rows, dim = int(rng.integers(10, 400)), int(rng.choice([1, 16, 33, 128]))
    init = _state(rng, rows, dim)
    d = [DEV.put(x) for x in init]
    want = tuple(x.astype(np.float64) for x in init)
    touched = np.zeros(rows, bool)
    for step in range(1, 4):
        n = 0 if step == 2 else int(rng.integers(1, 3 * rows))  # an empty update changes nothing
        idx = rng.integers(0, rows, size=n).astype(np.int64)   # repeats, any order
        g = rng.standard_normal((n, dim)).astype(np.float32)
        di, dg, st = DEV.put(idx), DEV.put(g.reshape(n, dim)), DEV.stream()
        if opt == "sgd":
            core.sparse_sgd_cuda(d[0], di, dg, HP["lr"], stream=st)
        elif opt == "adagrad":
            core.sparse_adagrad_cuda(d[0], d[1], di, dg, HP["lr"], HP["epsilon"], stream=st)
        else:
            core.sparse_adam_cuda(d[0], d[1], d[2], di, dg, HP["lr"], HP["beta_1"], HP["beta_2"], ADAM_EPS, step,
                                  stream=st)
        want = _ref_step(opt, want, idx, g, step)
        touched[idx] = True
    _check(opt, [DEV.get(x) for x in d], want, touched, init)
