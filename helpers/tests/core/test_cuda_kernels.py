"""The CUDA kernels (csrc/core/embedding_cuda.cu, sparse_optimizer_cuda.cu) through
`_embedlab_core`'s DLPack functions.

Each CUDA kernel is compared with the CPU kernel of the same module and with a float64 NumPy
oracle, on fresh random inputs: empty rows, -1 padding, duplicate keys, Zipf-skewed hot keys
(more than kCudaSegment = 32 contributions to one key, which takes the hot-key tree path),
many tables of different sizes and dims (1, 4, 16, 33, 128, 256). Outputs are poisoned with NaN
first, so an element nobody wrote fails. Repeated runs must give the same bits.

Skipped, with the reason, when the module was built without CUDA, when neither PyTorch nor
CuPy is importable, or when no GPU is visible. Arrays are moved with PyTorch when present
(else CuPy); the caller's current stream is passed to every kernel.
"""

import numpy as np
import pytest

import reference as ref
from gpu_arrays import core_and_device


core, DEV, _ = core_and_device("cuda_device_count")
pytestmark = pytest.mark.needs_gpu("cuda_device_count")

SEGMENT = 32  # kCudaSegment in embedding.h


# ---- inputs and float64 oracles ----------------------------------------------------------------

random_csr = ref.random_csr  # zipf_a 1.2: a few keys get far more than SEGMENT contributions
ref_forward = ref.csr_lookup
ref_backward = ref.csr_lookup_grad


def rel_err(x, ref):
    x = np.asarray(x, np.float64)
    den = np.linalg.norm(ref)
    return np.linalg.norm(x - ref) / (den if den > 0 else 1.0)


# ---- helpers over the binding --------------------------------------------------------------------

def cuda_forward(tables, offs, keys, weights, combiners, check=True):
    d_tabs = [DEV.put(t) for t in tables]
    outs = [DEV.nan((len(o) - 1, t.shape[1])) for o, t in zip(offs, tables)]
    core.lookup_forward_cuda(d_tabs, [DEV.put(o) for o in offs], [DEV.put(k) for k in keys],
                             None if weights is None else [DEV.put(w) for w in weights], combiners, outs,
                             stream=DEV.stream(), check=check)
    return [DEV.get(o) for o in outs]


def cuda_backward(offsets, keys, weights, combiner, dy, num_rows):
    nnz, dim = len(keys), dy.shape[1]
    uk = DEV.full(max(nnz, 1), -7, np.int64)
    rows = DEV.nan((max(nnz, 1), dim))
    nu = DEV.full(1, -7, np.int64)
    core.lookup_backward_cuda(DEV.put(offsets), DEV.put(keys), None if weights is None else DEV.put(weights),
                              combiner, DEV.put(dy), num_rows, uk, rows, nu, stream=DEV.stream())
    n = int(DEV.get(nu)[0])
    return DEV.get(uk)[:n], DEV.get(rows)[:n]


def cpu_coalesce(indices, grads):
    """(unique ascending indices, summed rows in input order) through the CPU backward."""
    offsets = np.arange(len(indices) + 1, dtype=np.int64)
    return core.lookup_backward(offsets, indices, None, "sum", grads, int(indices.max()) + 1 if len(indices) else 1)


# ---- forward -------------------------------------------------------------------------------------

DIMS = [1, 4, 16, 33, 128, 256]


@pytest.mark.parametrize("weighted", [False, True])
def test_forward_many_tables_matches_cpu_and_float64(rng, weighted):
    tables, offs, keys, ws, combs = [], [], [], [], []
    for i, dim in enumerate(DIMS * 2):
        rows = int(rng.integers(1, 3000))
        tables.append(rng.standard_normal((rows, dim)).astype(np.float32))
        o, k = random_csr(rng, int(rng.integers(0, 300)), rows, max_nnz=int(rng.integers(1, 12)), zipf=i % 3 == 0)
        offs.append(o)
        keys.append(k)
        combs.append("mean" if i % 2 else "sum")
        # Negative weights for sum tables; positive for mean tables, where a weight sum near 0
        # would make the float64 comparison ill-conditioned (seen: 2e-5 relative at seed 1816840567).
        lo = 0.1 if combs[-1] == "mean" else -1.0
        ws.append(rng.uniform(lo, 2, size=len(k)).astype(np.float32))
    weights = ws if weighted else None
    got = cuda_forward(tables, offs, keys, weights, combs)
    cpu = [np.zeros((len(o) - 1, t.shape[1]), np.float32) for o, t in zip(offs, tables)]
    core.lookup_forward(tables, offs, keys, weights, combs, cpu)
    for t in range(len(tables)):
        assert np.isfinite(got[t]).all(), f"table {t}: unwritten (NaN) outputs"
        ref = ref_forward(tables[t], offs[t], keys[t], None if weights is None else weights[t], combs[t])
        assert rel_err(got[t], ref) < 1e-5, f"table {t} (dim {tables[t].shape[1]})"
        np.testing.assert_allclose(got[t], cpu[t], rtol=1e-6, atol=1e-6, err_msg=f"table {t} vs CPU")


def test_forward_bitwise_equals_cpu(rng):
    """Same float32 expression order and no FMA contraction: the CPU's bits (x86-64 build)."""
    tables, offs, keys, combs = [], [], [], []
    for i, dim in enumerate(DIMS):
        tables.append(rng.standard_normal((500, dim)).astype(np.float32))
        o, k = random_csr(rng, 200, 500, max_nnz=9)
        offs.append(o)
        keys.append(k)
        combs.append(["sum", "mean"][i % 2])
    ws = [rng.uniform(0, 1, size=len(k)).astype(np.float32) for k in keys]
    got = cuda_forward(tables, offs, keys, ws, combs)
    cpu = [np.zeros((len(o) - 1, t.shape[1]), np.float32) for o, t in zip(offs, tables)]
    core.lookup_forward(tables, offs, keys, ws, combs, cpu)
    for t in range(len(tables)):
        np.testing.assert_array_equal(got[t], cpu[t], err_msg=f"table {t}")


def test_forward_empty_and_all_missing(rng):
    table = rng.standard_normal((10, 16)).astype(np.float32)
    offs = [np.zeros(1, np.int64), np.array([0, 0, 0], np.int64), np.array([0, 2, 3], np.int64)]
    keys = [np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([-1, -1, -1], np.int64)]
    got = cuda_forward([table] * 3, offs, keys, None, ["sum", "mean", "mean"])
    assert got[0].shape == (0, 16)
    assert (got[1] == 0).all() and (got[2] == 0).all()


def one_key_layouts(rng, batch):
    """Row offsets with as many keys as rows (nnz == batch, the forward's one-key path): one key
    per row, and layouts that only look like it (empty rows and two-key rows, all in the last)."""
    lengths = np.ones(batch, np.int64)
    pos = rng.permutation(batch)[: batch // 3]
    lengths[pos[: len(pos) // 2]] = 0
    lengths[pos[len(pos) // 2: 2 * (len(pos) // 2)]] = 2
    last = np.zeros(batch, np.int64)
    last[-1] = batch
    return [np.concatenate([[0], np.cumsum(n)]).astype(np.int64) for n in (np.ones(batch, np.int64), lengths, last)]


def test_forward_one_key_per_row_equals_cpu_and_every_variant(rng):
    """As many keys as rows: the row of keys[i] is loaded before row i's offsets are known, and
    kept only if row i holds exactly that key. Same bits as the CPU and as the variants that
    unroll keys (which never take that path), weighted or not, sum and mean, with missing keys."""
    batch = 301
    default = tuple(core._cuda_forward_variant())
    variants = [(0, 0, 0), (1, 4, 1), (1, 1, 8), (2, 1, 8), (2, 2, 4), (4, 1, 4)]
    for dim in [1, 4, 16, 33, 128]:
        table = rng.standard_normal((1000, dim)).astype(np.float32)
        for o in one_key_layouts(rng, batch):
            assert o[-1] == batch
            k = rng.integers(0, 1000, size=batch).astype(np.int64)
            w = rng.uniform(0.1, 2, size=batch).astype(np.float32)
            for comb in ["sum", "mean"]:
                for weights in [None, [w]]:
                    got = cuda_forward([table], [o], [k], weights, [comb])[0]
                    cpu = np.zeros((batch, dim), np.float32)
                    core.lookup_forward([table], [o], [k], weights, [comb], [cpu])
                    np.testing.assert_array_equal(got, cpu, err_msg=f"dim {dim} {comb} weighted={weights is not None}")
            km = k.copy()
            km[rng.permutation(batch)[:20]] = -1  # missing keys: skipped, as in the other path
            try:
                res = []
                for v in variants:
                    core._set_cuda_forward_variant(*v)
                    res.append(cuda_forward([table], [o], [km], [w], ["mean"], check=False)[0])
            finally:
                core._set_cuda_forward_variant(*default)
            for v, r in zip(variants, res):
                assert np.isfinite(r).all() and r.tobytes() == res[1].tobytes(), f"variant {v} dim {dim}"


def test_forward_rejects_bad_keys_and_changes_nothing(rng):
    table = rng.standard_normal((100, 8)).astype(np.float32)
    offsets = np.array([0, 2, 4], np.int64)
    out = DEV.nan((2, 8))
    for bad in (100, -2):
        keys = np.array([1, 2, bad, 3], np.int64)
        with pytest.raises(ValueError, match=r"lookup_forward_cuda: table 0: key .* at position 2 \(row 1\)"):
            core.lookup_forward_cuda([DEV.put(table)], [DEV.put(offsets)], [DEV.put(keys)], None, ["sum"], [out],
                                     stream=DEV.stream())
    assert np.isnan(DEV.get(out)).all()
    with pytest.raises(ValueError, match="lookup_forward_cuda: tables\\[0\\] must have dtype float32"):
        core.lookup_forward_cuda([DEV.put(table.astype(np.float64))], [DEV.put(offsets)],
                                 [DEV.put(np.array([1, 2, 3, 4], np.int64))], None, ["sum"], [out])
    with pytest.raises(ValueError, match="lookup_forward_cuda: tables\\[0\\] must be a CUDA device array"):
        core.lookup_forward_cuda([table], [DEV.put(offsets)], [DEV.put(np.array([1, 2, 3, 4], np.int64))], None,
                                 ["sum"], [out])


# ---- backward ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("combiner,weighted,zipf", [("sum", False, False), ("mean", True, True),
                                                    ("sum", True, True), ("mean", False, False)])
def test_backward_matches_cpu_and_float64(rng, dim, combiner, weighted, zipf):
    rows = int(rng.integers(50, 5000))
    offsets, keys = random_csr(rng, int(rng.integers(200, 1500)), rows, max_nnz=8, zipf=zipf)
    weights = rng.uniform(0.1, 2, size=len(keys)).astype(np.float32) if weighted else None
    dy = rng.standard_normal((len(offsets) - 1, dim)).astype(np.float32)
    uk, g = cuda_backward(offsets, keys, weights, combiner, dy, rows)
    assert np.isfinite(g).all(), "unwritten (NaN) gradient rows"
    ref_k, ref_g = ref_backward(offsets, keys, weights, combiner, dy)
    np.testing.assert_array_equal(uk, ref_k)
    assert rel_err(g, ref_g) < 1e-5
    cpu_k, cpu_g = core.lookup_backward(offsets, keys, weights, combiner, dy, rows)
    np.testing.assert_array_equal(uk, cpu_k)
    # Hot keys are summed in another (fixed) order than the CPU's: the difference is bounded by
    # a small multiple of eps * sum |terms| (the same oracle on |dy| and |weights|).
    _, abs_sum = ref_backward(offsets, keys, None if weights is None else np.abs(weights), combiner, np.abs(dy))
    assert (np.abs(g - cpu_g) <= 1e-5 * abs_sum + 1e-7).all()
    # Keys touched at most SEGMENT times are summed strictly in position order: the CPU's bits.
    counts = np.bincount(keys[keys >= 0], minlength=rows)[uk]
    cold = counts <= SEGMENT
    np.testing.assert_array_equal(g[cold], cpu_g[cold])
    if zipf:
        assert counts.max() > SEGMENT, "the draw should exercise the hot-key path"


def test_backward_hot_key_is_deterministic_and_accurate(rng):
    # One key takes ~half of 200k contributions (thousands of segments): the tree path.
    batch, rows, dim = 200_000, 1000, 64
    offsets = np.arange(batch + 1, dtype=np.int64)
    keys = np.where(rng.random(batch) < 0.5, 7, rng.integers(0, rows, size=batch)).astype(np.int64)
    dy = rng.standard_normal((batch, dim)).astype(np.float32)
    uk1, g1 = cuda_backward(offsets, keys, None, "sum", dy, rows)
    for _ in range(3):
        uk2, g2 = cuda_backward(offsets, keys, None, "sum", dy, rows)
        np.testing.assert_array_equal(uk1, uk2)
        assert g1.tobytes() == g2.tobytes(), "repeated runs must give the same bits"
    ref_k, ref_g = ref_backward(offsets, keys, None, "sum", dy)
    np.testing.assert_array_equal(uk1, ref_k)
    assert rel_err(g1, ref_g) < 1e-6


def test_backward_empty_inputs(rng):
    dy = rng.standard_normal((3, 4)).astype(np.float32)
    uk, g = cuda_backward(np.array([0, 0, 0, 0], np.int64), np.zeros(0, np.int64), None, "sum", dy, 10)
    assert len(uk) == 0 and g.shape == (0, 4)
    uk, g = cuda_backward(np.array([0, 1, 1, 3], np.int64), np.array([-1, -1, -1], np.int64), None, "mean", dy, 10)
    assert len(uk) == 0


# ---- optimizers ----------------------------------------------------------------------------------

def _states(rng, rows, dim):
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    s1 = rng.uniform(0.0, 0.5, (rows, dim)).astype(np.float32)
    s2 = rng.uniform(0.0, 0.5, (rows, dim)).astype(np.float32)
    return table, s1, s2


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("dim", [1, 16, 33, 128])
def test_sparse_optimizers_match_cpu(rng, opt, dim):
    rows = 3000
    n = 4000
    indices = ((rng.zipf(1.3, size=n) - 1) % rows).astype(np.int64)  # unsorted, duplicates, hot keys
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    table, s1, s2 = _states(rng, rows, dim)
    lr, eps, b1, b2, step = 0.05, 1e-7, 0.9, 0.999, 3
    d_t, d_1, d_2 = DEV.put(table), DEV.put(s1), DEV.put(s2)
    d_i, d_g = DEV.put(indices), DEV.put(grads)
    st = DEV.stream()
    if opt == "sgd":
        core.sparse_sgd_cuda(d_t, d_i, d_g, lr, stream=st)
    elif opt == "adagrad":
        core.sparse_adagrad_cuda(d_t, d_1, d_i, d_g, lr, eps, stream=st)
    else:
        core.sparse_adam_cuda(d_t, d_1, d_2, d_i, d_g, lr, b1, b2, eps, step, stream=st)
    # CPU: coalesce (the CPU optimizers need unique ascending indices), then update.
    ui, ug = cpu_coalesce(indices, grads)
    ct, c1, c2 = table.copy(), s1.copy(), s2.copy()
    ref.core_update(core, opt, ct, c1, c2, ui, ug, lr, eps, b1, b2, step)
    got = [DEV.get(d_t), DEV.get(d_1), DEV.get(d_2)]
    counts = np.bincount(indices, minlength=rows)
    cold = counts <= SEGMENT
    for name, g, c in zip(["table", "slot1", "slot2"], got, [ct, c1, c2]):
        np.testing.assert_array_equal(g[cold], c[cold], err_msg=f"{name}: rows with <= {SEGMENT} duplicates")
        # Hot rows: the summed gradient differs from the CPU's only by summation order (checked
        # against float64 in the backward tests); the optimizer then amplifies it at most mildly.
        np.testing.assert_allclose(g[~cold], c[~cold], rtol=1e-3, atol=1e-5, err_msg=name)
    untouched = counts == 0
    np.testing.assert_array_equal(got[0][untouched], table[untouched])


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_fused_backward_apply_equals_backward_then_update(rng, opt):
    rows, dim = 2000, 128
    offsets, keys = random_csr(rng, 3000, rows, max_nnz=6, zipf=True)
    weights = rng.uniform(0.1, 2, size=len(keys)).astype(np.float32)
    dy = rng.standard_normal((len(offsets) - 1, dim)).astype(np.float32)
    table, s1, s2 = _states(rng, rows, dim)
    kw = dict(lr=0.01, epsilon=1e-7, beta_1=0.9, beta_2=0.999, step=5)

    def fused():
        d = [DEV.put(table), DEV.put(s1), DEV.put(s2)]
        core.lookup_backward_apply_cuda(d[0], DEV.put(offsets), DEV.put(keys), DEV.put(weights), "mean", DEV.put(dy),
                                        opt, accumulator=d[1] if opt == "adagrad" else None,
                                        m=d[1] if opt == "adam" else None, v=d[2] if opt == "adam" else None,
                                        stream=DEV.stream(), **kw)
        return [DEV.get(x) for x in d]

    a = fused()
    b = fused()
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes(), "repeated fused runs must give the same bits"
    # Two-step path on the GPU: backward, then the sparse update on the unique keys.
    uk, g = cuda_backward(offsets, keys, weights, "mean", dy, rows)
    d = [DEV.put(table), DEV.put(s1), DEV.put(s2)]
    if opt == "sgd":
        core.sparse_sgd_cuda(d[0], DEV.put(uk), DEV.put(g), kw["lr"], stream=DEV.stream())
    elif opt == "adagrad":
        core.sparse_adagrad_cuda(d[0], d[1], DEV.put(uk), DEV.put(g), kw["lr"], kw["epsilon"], stream=DEV.stream())
    else:
        core.sparse_adam_cuda(d[0], d[1], d[2], DEV.put(uk), DEV.put(g), kw["lr"], kw["beta_1"], kw["beta_2"],
                              kw["epsilon"], kw["step"], stream=DEV.stream())
    two = [DEV.get(x) for x in d]
    for x, y in zip(a, two):
        np.testing.assert_array_equal(x, y)
    # And the CPU path within float32 rounding.
    ck, cg = core.lookup_backward(offsets, keys, weights, "mean", dy, rows)
    ct, c1, c2 = table.copy(), s1.copy(), s2.copy()
    ref.core_update(core, opt, ct, c1, c2, ck, cg, **kw)
    counts = np.bincount(keys[keys >= 0], minlength=rows)
    cold = counts <= SEGMENT
    for x, y in zip(a, [ct, c1, c2]):
        np.testing.assert_array_equal(x[cold], y[cold])
        np.testing.assert_allclose(x[~cold], y[~cold], rtol=1e-3, atol=1e-5)


def test_optimizer_rejects_bad_indices_and_changes_nothing(rng):
    table = rng.standard_normal((50, 4)).astype(np.float32)
    d_t = DEV.put(table)
    for bad in (50, -1):
        idx = np.array([3, bad, 5], np.int64)
        with pytest.raises(ValueError, match="sparse_sgd_cuda: indices: index .* at position 1"):
            core.sparse_sgd_cuda(d_t, DEV.put(idx), DEV.put(np.ones((3, 4), np.float32)), 0.1, stream=DEV.stream())
    np.testing.assert_array_equal(DEV.get(d_t), table)
    with pytest.raises(ValueError, match="grads must have shape"):
        core.sparse_sgd_cuda(d_t, DEV.put(np.array([1], np.int64)), DEV.put(np.ones((1, 5), np.float32)), 0.1)


def test_forward_variants_give_identical_bits(rng):
    """The benchmark's forward variants (rows per group, unroll, occupancy) change speed only."""
    tables, offs, keys, combs = [], [], [], []
    for i, dim in enumerate(DIMS):
        tables.append(rng.standard_normal((700, dim)).astype(np.float32))
        o, k = random_csr(rng, int(rng.integers(1, 400)), 700, max_nnz=int(rng.integers(1, 12)))
        offs.append(o)
        keys.append(k)
        combs.append(["sum", "mean"][i % 2])
    ws = [rng.uniform(0, 1, size=len(k)).astype(np.float32) for k in keys]
    default = tuple(core._cuda_forward_variant())
    variants = [(0, 0, 0), (1, 4, 1), (1, 4, 8), (1, 1, 8), (2, 1, 8), (2, 2, 4), (2, 2, 6), (4, 1, 4), (4, 1, 6)]
    try:
        results = []
        for v in variants:
            core._set_cuda_forward_variant(*v)
            results.append(cuda_forward(tables, offs, keys, ws, combs))
    finally:
        core._set_cuda_forward_variant(*default)
    for v, res in zip(variants[1:], results[1:]):
        for t in range(len(tables)):
            assert np.isfinite(res[t]).all(), f"variant {v} table {t}: unwritten outputs"
            assert res[t].tobytes() == results[0][t].tobytes(), f"variant {v} table {t}"
    with pytest.raises(ValueError, match="not a compiled variant"):
        core._set_cuda_forward_variant(3, 3, 3)


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_table_apply_equals_per_table_calls(rng, opt, weighted):
    """One shared sort for many tables (different sizes, dims, combiners) = one call per table."""
    dims = [1, 4, 16, 33, 128, 256, 16, 4]
    n = len(dims)
    rows = [int(rng.integers(1, 4000)) for _ in dims]
    ids = [random_csr(rng, int(rng.integers(0, 600)), r, max_nnz=6, zipf=i % 2 == 0) for i, r in enumerate(rows)]
    offs = [o for o, _ in ids]
    keys = [k for _, k in ids]
    for k in keys:  # a hot key (> SEGMENT contributions) in every table: the tree path
        k[: min(len(k), 3 * SEGMENT)] = 0
    ws = [rng.uniform(0.1, 2, size=len(k)).astype(np.float32) for k in keys] if weighted else None
    combs = ["mean" if i % 3 == 0 else "sum" for i in range(n)]
    dys = [rng.standard_normal((len(o) - 1, d)).astype(np.float32) for o, d in zip(offs, dims)]
    states = [_states(rng, r, d) for r, d in zip(rows, dims)]
    kw = dict(lr=0.02, epsilon=1e-7, beta_1=0.9, beta_2=0.999, step=2)

    def slots(d, i):
        return dict(accumulator=d[i][1] if opt == "adagrad" else None, m=d[i][1] if opt == "adam" else None,
                    v=d[i][2] if opt == "adam" else None)

    multi = [[DEV.put(x) for x in st] for st in states]
    core.lookup_backward_apply_multi_cuda(
        [d[0] for d in multi], [DEV.put(o) for o in offs], [DEV.put(k) for k in keys],
        None if ws is None else [DEV.put(w) for w in ws], combs, [DEV.put(dy) for dy in dys], opt,
        accumulators=[d[1] for d in multi] if opt == "adagrad" else None,
        m=[d[1] for d in multi] if opt == "adam" else None, v=[d[2] for d in multi] if opt == "adam" else None,
        stream=DEV.stream(), **kw)
    single = [[DEV.put(x) for x in st] for st in states]
    for i in range(n):
        core.lookup_backward_apply_cuda(single[i][0], DEV.put(offs[i]), DEV.put(keys[i]),
                                        None if ws is None else DEV.put(ws[i]), combs[i], DEV.put(dys[i]), opt,
                                        stream=DEV.stream(), **slots(single, i), **kw)
    for i in range(n):
        for a, b, name in zip(multi[i], single[i], ["table", "slot1", "slot2"]):
            x, y = DEV.get(a), DEV.get(b)
            assert np.isfinite(x).all()
            assert x.tobytes() == y.tobytes(), f"table {i} (dim {dims[i]}) {name}: multi-table != per-table"
    # and the CPU path, on one of the tables, within float32 rounding
    i = 4
    ck, cg = core.lookup_backward(offs[i], keys[i], None if ws is None else ws[i], combs[i], dys[i], rows[i])
    ct, c1, c2 = (x.copy() for x in states[i])
    ref.core_update(core, opt, ct, c1, c2, ck, cg, **kw)
    for a, c in zip(multi[i], [ct, c1, c2]):
        np.testing.assert_allclose(DEV.get(a), c, rtol=1e-3, atol=1e-5)


def test_backward_variants_give_identical_bits(rng):
    """The benchmark's backward-reduction variants (state prefetch, register cap) change speed only."""
    rows, dim = 3000, 128
    offsets, keys = random_csr(rng, 4000, rows, max_nnz=4, zipf=True)
    dy = rng.standard_normal((len(offsets) - 1, dim)).astype(np.float32)
    table, s1, s2 = _states(rng, rows, dim)
    default = tuple(core._cuda_backward_variant())
    outs = []
    try:
        for variant in [(True, 4), (True, 1), (False, 4), (False, 1)]:
            core._set_cuda_backward_variant(*variant)
            d = [DEV.put(table), DEV.put(s1), DEV.put(s2)]
            core.lookup_backward_apply_cuda(d[0], DEV.put(offsets), DEV.put(keys), None, "mean", DEV.put(dy), "adam",
                                            0.01, m=d[1], v=d[2], step=3, stream=DEV.stream())
            outs.append([DEV.get(x).tobytes() for x in d])
    finally:
        core._set_cuda_backward_variant(*default)
    assert all(o == outs[0] for o in outs[1:])


@pytest.mark.parametrize("opt", ["sgd", "adam"])
def test_multi_table_apply_accepts_a_table_with_no_rows(rng, opt):
    """A table whose batch is 0 (empty grad_out, which frameworks give any strides) is a no-op."""
    dims, rows = [16, 4], [50, 30]
    offs = [np.array([0, 2, 3], np.int64), np.zeros(1, np.int64)]
    keys = [np.array([4, 7, 7], np.int64), np.zeros(0, np.int64)]
    dys = [rng.standard_normal((2, 16)).astype(np.float32), np.zeros((0, 4), np.float32)]
    states = [_states(rng, r, d) for r, d in zip(rows, dims)]
    dev = [[DEV.put(x) for x in st] for st in states]
    core.lookup_backward_apply_multi_cuda(
        [d[0] for d in dev], [DEV.put(o) for o in offs], [DEV.put(k) for k in keys], None, ["sum", "sum"],
        [DEV.put(dy) for dy in dys], opt, m=[d[1] for d in dev] if opt == "adam" else None,
        v=[d[2] for d in dev] if opt == "adam" else None, stream=DEV.stream(),
        lr=0.02, epsilon=1e-7, beta_1=0.9, beta_2=0.999, step=1)
    assert DEV.get(dev[1][0]).tobytes() == states[1][0].tobytes()  # the empty table is untouched
    t0 = DEV.get(dev[0][0])
    assert not np.array_equal(t0[[4, 7]], states[0][0][[4, 7]])  # the other one trained
    untouched = np.setdiff1d(np.arange(rows[0]), [4, 7])
    assert t0[untouched].tobytes() == states[0][0][untouched].tobytes()
