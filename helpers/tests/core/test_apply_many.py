"""lookup_backward_apply_many (the framework-free core's many-table fused backward + optimizer)
against table-by-table lookup_backward_apply and a float64 oracle: same bits, any thread count,
and a bad key anywhere leaves every table as it was."""
import numpy as np
import pytest

import reference as ref


def _problem(rng, n):
    tables, offs, keys, dys, combs = [], [], [], [], []
    for t in range(n):
        rows, dim = int(rng.integers(5, 300)), int(rng.choice([4, 16, 64, 128]))
        tables.append(rng.standard_normal((rows, dim)).astype(np.float32))
        o, k = ref.random_csr(rng, int(rng.integers(1, 80)), rows, max_nnz=5, zipf=bool(t % 2))
        offs.append(o), keys.append(k)
        dys.append(rng.standard_normal((len(o) - 1, dim)).astype(np.float32))
        combs.append(["sum", "mean"][t % 2])
    return tables, offs, keys, dys, combs


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("n", [3, 9])  # fewer / more tables than twice the threads
def test_many_equals_one_by_one(core, rng, opt, n):
    tables, offs, keys, dys, combs = _problem(rng, n)
    w = [rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32) for k in keys]
    slots = {"adagrad": 1, "adam": 2}.get(opt, 0)
    s = [[np.abs(rng.standard_normal(x.shape)).astype(np.float32) * 0.1 for x in tables] for _ in range(slots)]
    one = [x.copy() for x in tables]
    one_s = [[x.copy() for x in sl] for sl in s]
    for t in range(n):
        kw = {}
        if opt == "adagrad":
            kw["accumulator"] = one_s[0][t]
        if opt == "adam":
            kw.update(m=one_s[0][t], v=one_s[1][t], step=3)
        core.lookup_backward_apply(one[t], offs[t], keys[t], w[t], combs[t], dys[t], opt, 0.05, **kw)
    for threads in (1, 2, 3):
        many = [x.copy() for x in tables]
        many_s = [[x.copy() for x in sl] for sl in s]
        kw = {}
        if opt == "adagrad":
            kw["accumulators"] = many_s[0]
        if opt == "adam":
            kw.update(ms=many_s[0], vs=many_s[1], step=3)
        core.lookup_backward_apply_many(many, offs, keys, w, combs, dys, opt, 0.05, num_threads=threads, **kw)
        for t in range(n):
            assert many[t].tobytes() == one[t].tobytes(), (t, threads)
            for a, b in zip(many_s, one_s):
                assert a[t].tobytes() == b[t].tobytes()
    if opt == "sgd":  # and right: table - lr * the float64 gradient
        for t in range(n):
            uk, g = ref.csr_lookup_grad(offs[t], keys[t], w[t], combs[t], dys[t])
            want = tables[t].astype(np.float64)
            want[uk] -= 0.05 * g
            np.testing.assert_allclose(one[t], want, rtol=1e-4, atol=1e-4)


def test_many_bad_key_changes_nothing(core, rng):
    tables, offs, keys, dys, combs = _problem(rng, 6)
    keys[4] = keys[4].copy()
    keys[4][-1] = tables[4].shape[0]  # one past the end
    before = [x.copy() for x in tables]
    with pytest.raises(ValueError, match=f"table 4: key {tables[4].shape[0]}"):
        core.lookup_backward_apply_many(tables, offs, keys, None, combs, dys, "sgd", 0.1)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(tables, before))
    bad = [o.copy() for o in offs]
    bad[2][-1] += 1  # offsets past nnz
    with pytest.raises(ValueError, match="table 2"):
        core.lookup_backward_apply_many(tables, bad, keys, None, combs, dys, "sgd", 0.1)
    with pytest.raises(ValueError, match="adam needs ms"):
        core.lookup_backward_apply_many(tables, offs, keys, None, combs, dys, "adam", 0.1)
