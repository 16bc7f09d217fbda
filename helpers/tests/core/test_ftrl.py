"""FTRL (Keras 3's `keras.optimizers.Ftrl` on touched rows) in the core kernels, through
`_embedlab_core`: the row update (`sparse_ftrl`), the fused backward + FTRL
(`lookup_backward_apply`, `lookup_backward_apply_many`) on the CPU, and the same entry points on
the GPU (`*_cuda`, marked needs_gpu: skipped with the reason where no GPU is visible).

Every result is compared with `reference.np_ftrl` (float64) over several steps on fresh random
inputs with empty rows, -1 padding and duplicate keys, for the hyperparameters that change the
update's path: learning_rate_power -0.5 (square root), 0 (fixed rate) and others (pow), l1 large
enough to zero rows, l2, beta, l2 shrinkage, a zero initial accumulator. The GPU is compared with
the CPU too (same bits where the CPU and GPU sums agree and the power is exact).
"""

import numpy as np
import pytest

import reference as ref
from gpu_arrays import core_and_device

_core, DEV, _ = core_and_device("cuda_device_count")

# (lr, lr_power, l1, l2, l2_shrinkage, beta, initial_accumulator_value)
CASES = {
    "keras_defaults": (0.05, -0.5, 0.0, 0.0, 0.0, 0.0, 0.1),
    "l1_zeroes_some": (0.1, -0.5, 3.0, 0.0, 0.0, 0.0, 0.1),
    "l1_l2_beta": (0.2, -0.5, 0.05, 0.3, 0.0, 0.7, 0.2),
    "power_0_shrinkage": (0.05, 0.0, 0.01, 0.0, 0.2, 0.0, 0.1),
    "power_-0.3": (0.1, -0.3, 0.02, 0.1, 0.0, 0.5, 0.3),
    "power_-1_all": (0.3, -1.0, 0.05, 0.05, 0.1, 1.0, 0.5),
    "zero_accumulator": (0.1, -0.5, 0.0, 0.0, 0.3, 0.0, 0.0),
}
EXACT_POWERS = (-0.5, 0.0)  # a square root / the constant 1: CPU and GPU round them the same


def _hyper(case):
    lr, p, l1, l2, l2s, beta, init = CASES[case]
    return lr, dict(lr_power=p, l1=l1, l2=l2, l2_shrinkage=l2s, beta=beta), init


def _state(rng, rows, dim, init):
    w = rng.standard_normal((rows, dim)).astype(np.float32)
    return w, np.full((rows, dim), init, np.float32), np.zeros((rows, dim), np.float32)


def _ref_step(st, idx, g, lr, hp):
    return ref.np_ftrl(*st, idx, g, lr, **hp)


def _close(got, want, rtol=2e-5, atol=2e-6):
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=rtol, atol=atol)


def _check_state(ours, want):
    for got, w, name in zip(ours, want, ("w", "n", "z")):
        _close(got, w, rtol=5e-5 if name == "z" else 2e-5, atol=2e-5 if name == "z" else 2e-6)


# ---- CPU -------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_sparse_ftrl_matches_float64(core, rng, case):
    rows, dim = int(rng.integers(20, 200)), int(rng.choice([1, 4, 16, 33]))
    lr, hp, init = _hyper(case)
    w, n, z = _state(rng, rows, dim, init)
    want = (w.astype(np.float64), n.astype(np.float64), z.astype(np.float64))
    touched_ever = np.zeros(rows, bool)
    for _ in range(4):
        idx = np.flatnonzero(rng.random(rows) < 0.4).astype(np.int64)   # unique, ascending
        g = rng.standard_normal((len(idx), dim)).astype(np.float32)
        core.sparse_ftrl(w, n, z, idx, g, lr, **hp)
        want = _ref_step(want, idx, g, lr, hp)
        touched_ever[idx] = True
    _check_state((w, n, z), want)
    # rows no step touched keep their initial weights and state
    untouched = ~touched_ever
    assert np.array_equal(n[untouched], np.full((untouched.sum(), dim), init, np.float32))
    assert not z[untouched].any()


@pytest.mark.parametrize("entry", ["sparse_ftrl", "lookup_backward_apply"])
def test_large_l1_zeroes_every_touched_row_and_only_those(core, rng, entry):
    # |z| <= l1 for every touched element: those rows become exactly 0; the others keep their values.
    rows, dim = 30, 8
    w, n, z = _state(rng, rows, dim, 0.1)
    init = w.copy()
    offsets, keys = ref.random_csr(rng, 10, rows, max_nnz=3)
    dy = rng.standard_normal((10, dim)).astype(np.float32)
    if entry == "sparse_ftrl":
        uk, g = core.lookup_backward(offsets, keys, None, "sum", dy, rows)
        core.sparse_ftrl(w, n, z, uk, g, 0.1, l1=1e4)
    else:
        core.lookup_backward_apply(w, offsets, keys, None, "sum", dy, "ftrl", 0.1, accumulator=n, linear=z, l1=1e4)
    touched = np.zeros(rows, bool)
    touched[keys[keys >= 0]] = True
    assert touched.any()
    assert not w[touched].any()
    assert np.array_equal(w[~touched], init[~touched])


@pytest.mark.parametrize("case", ["keras_defaults", "l1_zeroes_some", "power_-0.3", "power_-1_all"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_fused_backward_ftrl_matches_float64_and_two_step(core, rng, case, combiner):
    # Random CSR ids (empty rows, -1 padding, duplicate keys), optional weights: the fused
    # backward + FTRL equals the float64 reference, and lookup_backward + sparse_ftrl bit for bit.
    rows, dim, batch = int(rng.integers(5, 80)), int(rng.choice([3, 8, 16])), int(rng.integers(1, 40))
    lr, hp, init = _hyper(case)
    fused = _state(rng, rows, dim, init)
    two = tuple(x.copy() for x in fused)
    want = tuple(x.astype(np.float64) for x in fused)
    for step in range(3):
        offsets, keys = ref.random_csr(rng, batch, rows, max_nnz=5)
        weights = rng.uniform(0.5, 2, len(keys)).astype(np.float32) if step % 2 else None
        dy = rng.standard_normal((batch, dim)).astype(np.float32)
        core.lookup_backward_apply(fused[0], offsets, keys, weights, combiner, dy, "ftrl", lr,
                                   accumulator=fused[1], linear=fused[2], **hp)
        uk, rows_g = core.lookup_backward(offsets, keys, weights, combiner, dy, rows)
        core.sparse_ftrl(two[0], two[1], two[2], uk, rows_g, lr, **hp)
        ruk, rg = ref.csr_lookup_grad(offsets, keys, weights, combiner, dy)
        want = _ref_step(want, ruk, rg, lr, hp)
    for a, b in zip(fused, two):
        assert a.tobytes() == b.tobytes()
    _check_state(fused, want)


def test_fused_backward_ftrl_many_tables_equals_one_by_one(core, rng):
    lr, hp, init = _hyper("l1_l2_beta")
    shapes = [(int(rng.integers(2, 90)), d) for d in (1, 4, 16, 7, 33)]
    combs = ["sum", "mean", "sum", "mean", "sum"]
    many = [_state(rng, r, d, init) for r, d in shapes]
    one = [tuple(x.copy() for x in s) for s in many]
    for _ in range(2):
        ids = [ref.random_csr(rng, 25, r, max_nnz=4) for r, _ in shapes]
        dys = [rng.standard_normal((25, d)).astype(np.float32) for _, d in shapes]
        core.lookup_backward_apply_many([s[0] for s in many], [o for o, _ in ids], [k for _, k in ids], None, combs,
                                        dys, "ftrl", lr, accumulators=[s[1] for s in many],
                                        linears=[s[2] for s in many], **hp)
        for s, (o, k), c, dy in zip(one, ids, combs, dys):
            core.lookup_backward_apply(s[0], o, k, None, c, dy, "ftrl", lr, accumulator=s[1], linear=s[2], **hp)
    for a, b in zip(many, one):
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()


BAD = [
    (dict(lr_power=0.5), "learning_rate_power must be a finite value <= 0, got 0.5"),
    (dict(l1=-0.1), "l1_regularization_strength must be a finite value >= 0, got -0.1"),
    (dict(l2=-1.0), "l2_regularization_strength must be a finite value >= 0, got -1"),
    (dict(l2_shrinkage=-0.5), "l2_shrinkage_regularization_strength must be a finite value >= 0, got -0.5"),
    (dict(beta=-2.0), "beta must be a finite value >= 0, got -2"),
    (dict(l1=float("nan")), "l1_regularization_strength must be a finite value >= 0, got nan"),
]


@pytest.mark.parametrize("bad,msg", BAD)
def test_bad_hyperparameters_are_named_and_change_nothing(core, rng, bad, msg):
    rows, dim = 12, 4
    w, n, z = _state(rng, rows, dim, 0.1)
    before = [x.copy() for x in (w, n, z)]
    idx = np.array([1, 4, 7], np.int64)
    g = rng.standard_normal((3, dim)).astype(np.float32)
    offsets, keys = np.array([0, 2, 3], np.int64), np.array([1, 4, 7], np.int64)
    dy = rng.standard_normal((2, dim)).astype(np.float32)
    with pytest.raises(ValueError, match="sparse_ftrl: " + msg):
        core.sparse_ftrl(w, n, z, idx, g, 0.1, **bad)
    with pytest.raises(ValueError, match="lookup_backward_apply: " + msg):
        core.lookup_backward_apply(w, offsets, keys, None, "sum", dy, "ftrl", 0.1, accumulator=n, linear=z, **bad)
    with pytest.raises(ValueError, match="lookup_backward_apply_many: " + msg):
        core.lookup_backward_apply_many([w], [offsets], [keys], None, ["sum"], [dy], "ftrl", 0.1, accumulators=[n],
                                        linears=[z], **bad)
    for x, b in zip((w, n, z), before):
        assert np.array_equal(x, b)


def test_bad_learning_rate_and_missing_slots(core, rng):
    w, n, z = _state(rng, 6, 2, 0.1)
    before = [x.copy() for x in (w, n, z)]
    offsets, keys = np.array([0, 1], np.int64), np.array([2], np.int64)
    dy = np.ones((1, 2), np.float32)
    with pytest.raises(ValueError, match="learning_rate must be a finite value > 0, got 0"):
        core.sparse_ftrl(w, n, z, np.array([2], np.int64), dy, 0.0)
    with pytest.raises(ValueError, match="lookup_backward_apply: ftrl needs linear"):
        core.lookup_backward_apply(w, offsets, keys, None, "sum", dy, "ftrl", 0.1, accumulator=n)
    with pytest.raises(ValueError, match="lookup_backward_apply: ftrl needs accumulator"):
        core.lookup_backward_apply(w, offsets, keys, None, "sum", dy, "ftrl", 0.1, linear=z)
    with pytest.raises(ValueError, match="lookup_backward_apply_many: ftrl needs linears, one per table"):
        core.lookup_backward_apply_many([w], [offsets], [keys], None, ["sum"], [dy], "ftrl", 0.1, accumulators=[n])
    with pytest.raises(ValueError, match="sparse_ftrl: linear must have the table's shape"):
        core.sparse_ftrl(w, n, z[:5], np.array([2], np.int64), dy, 0.1)
    for x, b in zip((w, n, z), before):
        assert np.array_equal(x, b)


# ---- GPU ---------------------------------------------------------------------------------------

def _gpu_state(st):
    return [DEV.put(x) for x in st]


def _get(st):
    return [DEV.get(x) for x in st]


def _agree_with_cpu(gpu, cpu, exact):
    for a, b in zip(gpu, cpu):
        if exact:
            assert a.tobytes() == b.tobytes()
        else:
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.needs_gpu("cuda_device_count")
@pytest.mark.parametrize("case", list(CASES))
def test_sparse_ftrl_cuda_sums_duplicates_and_matches_cpu(rng, case):
    core = _core
    rows, dim = int(rng.integers(20, 300)), int(rng.choice([1, 4, 16, 33, 128]))
    lr, hp, init = _hyper(case)
    cpu = _state(rng, rows, dim, init)
    gpu = _gpu_state(cpu)
    want = tuple(x.astype(np.float64) for x in cpu)
    for _ in range(3):
        idx = rng.integers(0, rows, size=int(rng.integers(0, 2 * rows))).astype(np.int64)  # repeats, any order
        g = rng.standard_normal((len(idx), dim)).astype(np.float32)
        core.sparse_ftrl_cuda(gpu[0], gpu[1], gpu[2], DEV.put(idx), DEV.put(g), lr, **hp, stream=DEV.stream())
        uk, summed = core.lookup_backward(np.arange(len(idx) + 1, dtype=np.int64), idx, None, "sum", g, rows)
        core.sparse_ftrl(cpu[0], cpu[1], cpu[2], uk, summed, lr, **hp)
        # The float64 step takes each key's gradient summed in float32 in index order (np.add.at,
        # independent of the kernels): a sum that nearly cancels has a large relative rounding
        # error, which a zero accumulator turns into a large error of w (w ~ z * lr / |g|), so a
        # float64 sum would test float32 summation, not the optimizer.
        g32 = np.zeros((rows, dim), np.float32)
        np.add.at(g32, idx, g)
        u = np.unique(idx)
        want = _ref_step(want, u, g32[u], lr, hp)
    got = _get(gpu)
    _agree_with_cpu(got, cpu, exact=hp["lr_power"] in EXACT_POWERS)
    _check_state(got, want)


@pytest.mark.needs_gpu("cuda_device_count")
@pytest.mark.parametrize("case", ["keras_defaults", "l1_zeroes_some", "power_0_shrinkage", "power_-1_all"])
def test_fused_backward_ftrl_cuda_matches_cpu_and_float64(rng, case):
    # Keys touched at most 32 times (max_nnz 4, batch 8 per table): the GPU's sums are the CPU's.
    core = _core
    lr, hp, init = _hyper(case)
    shapes = [(int(rng.integers(2, 500)), d) for d in (1, 4, 16, 33, 128)]
    combs = ["sum", "mean", "sum", "mean", "sum"]
    cpu = [_state(rng, r, d, init) for r, d in shapes]
    single = [_gpu_state(s) for s in cpu]
    multi = [_gpu_state(s) for s in cpu]
    want = [tuple(x.astype(np.float64) for x in s) for s in cpu]
    for _ in range(3):
        ids = [ref.random_csr(rng, 8, r, max_nnz=4) for r, _ in shapes]
        ws = [rng.uniform(0.5, 2, len(k)).astype(np.float32) for _, k in ids]
        dys = [rng.standard_normal((8, d)).astype(np.float32) for _, d in shapes]
        d_ids = [(DEV.put(o), DEV.put(k)) for o, k in ids]
        for t in range(len(shapes)):
            (o, k), c, dy, w = ids[t], combs[t], dys[t], ws[t]
            core.lookup_backward_apply(cpu[t][0], o, k, w, c, dy, "ftrl", lr, accumulator=cpu[t][1],
                                       linear=cpu[t][2], **hp)
            core.lookup_backward_apply_cuda(single[t][0], d_ids[t][0], d_ids[t][1], DEV.put(w), c, DEV.put(dy),
                                            "ftrl", lr, accumulator=single[t][1], linear=single[t][2], **hp,
                                            stream=DEV.stream())
            uk, g = ref.csr_lookup_grad(o, k, w, c, dy)
            want[t] = _ref_step(want[t], uk, g, lr, hp)
        core.lookup_backward_apply_multi_cuda([s[0] for s in multi], [d[0] for d in d_ids], [d[1] for d in d_ids],
                                              [DEV.put(w) for w in ws], combs, [DEV.put(d) for d in dys], "ftrl", lr,
                                              accumulators=[s[1] for s in multi], linears=[s[2] for s in multi],
                                              **hp, stream=DEV.stream())
    exact = hp["lr_power"] in EXACT_POWERS
    for t in range(len(shapes)):
        a, b = _get(single[t]), _get(multi[t])
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()  # one launch group or one table per call: same bits
        _agree_with_cpu(a, cpu[t], exact)
        _check_state(a, want[t])


@pytest.mark.needs_gpu("cuda_device_count")
def test_ftrl_cuda_checked_and_guarded(rng):
    # Outputs are views at the start of poisoned buffers (test_cuda_bounds.Guarded): valid calls
    # write nothing past them; refused calls name the function and argument and change nothing.
    from test_cuda_bounds import Guarded, refused
    core = _core
    rows, dim, batch = 200, 8, 30
    offsets, keys = ref.random_csr(rng, batch, rows, max_nnz=4)
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    dy = DEV.put(rng.standard_normal((batch, dim)).astype(np.float32))
    t = Guarded((rows, dim), np.float32, table)
    n = Guarded((rows, dim), np.float32, np.full((rows, dim), 0.1))
    z = Guarded((rows, dim), np.float32, np.zeros((rows, dim)))
    d_off, d_keys = DEV.put(offsets), DEV.put(keys)
    core.lookup_backward_apply_cuda(t.view, d_off, d_keys, None, "sum", dy, "ftrl", 0.1, accumulator=n.view,
                                    linear=z.view, stream=DEV.stream())
    assert t.guard_intact() and n.guard_intact() and z.guard_intact()
    assert not np.array_equal(t.get(), table) or (keys < 0).all()
    short = Guarded((rows - 1, dim), np.float32, np.zeros((rows - 1, dim)))
    refused(lambda: core.lookup_backward_apply_cuda(t.view, d_off, d_keys, None, "sum", dy, "ftrl", 0.1,
                                                    accumulator=n.view, linear=short.view, stream=DEV.stream()),
            "lookup_backward_apply_cuda: linear must have the table's shape", t, n, short)
    refused(lambda: core.lookup_backward_apply_multi_cuda([t.view], [d_off], [d_keys], None, ["sum"], [dy], "ftrl",
                                                          0.1, accumulators=[n.view], linears=[short.view],
                                                          stream=DEV.stream()),
            "lookup_backward_apply_multi_cuda: linear must have the table's shape", t, n, short)
    refused(lambda: core.lookup_backward_apply_cuda(t.view, d_off, d_keys, None, "sum", dy, "ftrl", 0.1,
                                                    accumulator=n.view, stream=DEV.stream()),
            "lookup_backward_apply_cuda: ftrl needs accumulator and linear", t, n)
    refused(lambda: core.lookup_backward_apply_multi_cuda([t.view], [d_off], [d_keys], None, ["sum"], [dy], "ftrl",
                                                          0.1, accumulators=[n.view], stream=DEV.stream()),
            "lookup_backward_apply_multi_cuda: ftrl needs accumulators and linears", t, n)
    for bad, msg in BAD:
        refused(lambda: core.lookup_backward_apply_cuda(t.view, d_off, d_keys, None, "sum", dy, "ftrl", 0.1,
                                                        accumulator=n.view, linear=z.view, **bad,
                                                        stream=DEV.stream()),
                "lookup_backward_apply_cuda: " + msg, t, n, z)
    idx = DEV.put(rng.integers(0, rows, size=20).astype(np.int64))
    grads = DEV.put(rng.standard_normal((20, dim)).astype(np.float32))
    short_g = DEV.put(rng.standard_normal((19, dim)).astype(np.float32))
    core.sparse_ftrl_cuda(t.view, n.view, z.view, idx, grads, 0.1, l1=0.01, stream=DEV.stream())
    assert t.guard_intact() and n.guard_intact() and z.guard_intact()
    refused(lambda: core.sparse_ftrl_cuda(t.view, n.view, z.view, idx, short_g, 0.1, stream=DEV.stream()),
            "sparse_ftrl_cuda: grads must have shape", t, n, z)
    refused(lambda: core.sparse_ftrl_cuda(t.view, n.view, z.view, idx, grads, 0.1, lr_power=0.5,
                                          stream=DEV.stream()),
            "sparse_ftrl_cuda: learning_rate_power must be a finite value <= 0, got 0.5", t, n, z)
