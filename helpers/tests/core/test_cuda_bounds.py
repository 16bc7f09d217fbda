"""Size, stride and output-length checks of every CUDA entry point of `_embedlab_core`.

Every output array is a view at the start of a larger device buffer whose tail (the guard) is
poisoned; after each call, valid or refused, the guard must hold its poison. A refused call
(wrong shape, stride below the busiest owner, a send array shorter than the routed keys) must
raise ValueError naming the function and leave the outputs as they were. Valid calls still give
the CPU's results, so the checks cannot pass by refusing everything.

Skipped, with the reason, when the module was built without CUDA, when neither PyTorch nor CuPy
is importable, or when no GPU is visible.
"""

import numpy as np
import pytest

from gpu_arrays import core_and_device

core, DEV, _ = core_and_device("cuda_device_count")
pytestmark = pytest.mark.needs_gpu("cuda_device_count")
GUARD = 4096  # elements of poison after each output
POISON = {np.float32: 12345.0, np.int64: 0x5A5A5A5A, np.uint8: 0xA5}


class Guarded:
    """An output of `shape` at the start of a buffer followed by GUARD poisoned elements."""

    def __init__(self, shape, dtype, fill=None):
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (int(shape),)
        self.dtype, self.shape = dtype, shape
        self.n = int(np.prod(shape)) if shape else 1
        self.buf = DEV.full(self.n + GUARD, POISON[dtype], dtype)
        self.view = self.buf[: self.n].reshape(shape)
        if fill is not None and self.n:
            self.view[...] = DEV.put(np.asarray(fill, dtype).reshape(shape))

    def guard_intact(self):
        return bool((DEV.get(self.buf)[self.n:] == POISON[self.dtype]).all())

    def get(self):
        return DEV.get(self.buf)[: self.n].reshape(self.shape)


def refused(fn, match, *guards):
    """fn() raises ValueError matching `match`; every guard and every output is unchanged."""
    before = [g.get().copy() for g in guards]
    with pytest.raises(ValueError, match=match):
        fn()
    for g, b in zip(guards, before):
        assert g.guard_intact(), "a refused call wrote past its output"
        np.testing.assert_array_equal(g.get(), b, err_msg="a refused call changed its output")


# ---- routing -------------------------------------------------------------------------------------

def _route_case(rng, n, T=3, per=400):
    keys = rng.integers(0, 1000, size=T * per).astype(np.int64)
    keys[rng.random(keys.size) < 0.05] = -1
    offsets = (np.arange(T + 1) * per).astype(np.int64)
    return keys, offsets, [0] * T, [1000] * T, [0] * T


def test_route_scatter_refuses_a_stride_below_the_busiest_owner():
    """The issue's repro: 100 keys, 4 owners; stride 10 wrote 90 int64 past send[40]."""
    keys = DEV.put(np.arange(100, dtype=np.int64))
    offsets = np.array([0, 100], np.int64)
    counts = DEV.full((4, 1), -7, np.int64)
    total, busiest = core.route_count_cuda(keys, offsets, [0], [100], [0], 4, counts, DEV.stream())
    assert (total, busiest) == (100, 25)
    send, inverse = Guarded(40, np.int64), Guarded(100, np.int64)
    refused(lambda: core.route_scatter_cuda(keys, offsets, [0], [100], [0], 4, counts, 10, send.view, inverse.view,
                                            DEV.stream()),
            "route_scatter_cuda: stride 10 is below the 25 keys of the busiest owner", send, inverse)
    # all 100 keys to one owner (localized): the CPU's own wording and numbers
    counts1 = DEV.full((4, 1), -7, np.int64)
    core.route_count_cuda(keys, offsets, [1], [100], [2], 4, counts1, DEV.stream())
    refused(lambda: core.route_scatter_cuda(keys, offsets, [1], [100], [2], 4, counts1, 10, send.view, inverse.view,
                                            DEV.stream()),
            "route_scatter_cuda: stride 10 is below the 100 keys of the busiest owner", send, inverse)
    with pytest.raises(ValueError, match="stride 10 is below the 100 keys of the busiest owner"):
        core.route_keys(np.arange(100, dtype=np.int64), offsets, [1], [100], [2], 4, 10, 1)


def test_route_scatter_refuses_a_short_compact_send():
    keys = DEV.put(np.arange(100, dtype=np.int64))
    offsets = np.array([0, 100], np.int64)
    counts = DEV.full((4, 1), -7, np.int64)
    core.route_count_cuda(keys, offsets, [0], [100], [0], 4, counts, DEV.stream())
    send, inverse = Guarded(99, np.int64), Guarded(100, np.int64)
    refused(lambda: core.route_scatter_cuda(keys, offsets, [0], [100], [0], 4, counts, 0, send.view, inverse.view,
                                            DEV.stream()),
            "route_scatter_cuda: send has 99 entries, the 100 routed keys need 100", send, inverse)


@pytest.mark.parametrize("n", [1, 4, 64])
def test_route_valid_calls_stay_inside_their_outputs(rng, n):
    keys, offsets, modes, rows, ranks = _route_case(rng, n)
    cpu = core.route_keys(keys, offsets, modes, rows, ranks, n, -1, 1)
    cpu0 = core.route_keys(keys, offsets, modes, rows, ranks, n, 0, 1)
    dk = DEV.put(keys)
    counts = Guarded((n, len(modes)), np.int64)
    total, busiest = core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts.view, DEV.stream())
    assert counts.guard_intact()
    np.testing.assert_array_equal(counts.get(), cpu[0])
    for stride, ref in ((cpu[3], cpu), (0, cpu0)):
        size = n * stride if stride else total
        send, inverse = Guarded(size, np.int64), Guarded(len(keys), np.int64)
        core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, stride, send.view, inverse.view,
                                DEV.stream())
        assert send.guard_intact() and inverse.guard_intact() and counts.guard_intact()
        np.testing.assert_array_equal(send.get(), ref[1])
        np.testing.assert_array_equal(inverse.get(), ref[2])
    # a caller's workspace: too small is refused, the right size gives the same results
    need = core.route_cuda_workspace_size(offsets, n)
    ws = Guarded(need, np.uint8)
    send, inverse = Guarded(total, np.int64), Guarded(len(keys), np.int64)
    status = Guarded(6, np.int64)
    assert core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts.view, DEV.stream(), status=status.view,
                                 workspace=ws.view) is None
    core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, 0, send.view, inverse.view, DEV.stream(),
                            check=False, status=status.view, workspace=ws.view)
    assert ws.guard_intact() and send.guard_intact() and status.guard_intact()
    np.testing.assert_array_equal(status.get(), [total, busiest, -1, -1, 0, 0])
    np.testing.assert_array_equal(send.get(), cpu0[1])
    np.testing.assert_array_equal(inverse.get(), cpu0[2])
    small_ws = Guarded(need - 1, np.uint8)
    refused(lambda: core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, 0, send.view,
                                            inverse.view, DEV.stream(), workspace=small_ws.view),
            "route_scatter_cuda: workspace has", send, inverse, small_ws)
    # check=False with a stride below the busiest owner: nothing written, the verdict in status
    if busiest > 1:
        short = Guarded(n * (busiest - 1), np.int64)
        core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, busiest - 1, short.view,
                                inverse.view, DEV.stream(), check=False, status=status.view)
        assert short.guard_intact() and (short.get() == POISON[np.int64]).all()
        assert int(status.get()[5]) == 1  # kRouteStrideTooSmall
    # wrong lengths of counts / inverse / padded send are refused before any launch
    bad_counts = Guarded((n, len(modes) + 1), np.int64)
    refused(lambda: core.route_count_cuda(dk, offsets, modes, rows, ranks, n, bad_counts.view, DEV.stream()),
            "route_count_cuda: counts has", bad_counts)
    send, short_inv = Guarded(n * cpu[3], np.int64), Guarded(len(keys) - 1, np.int64)
    refused(lambda: core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, cpu[3], send.view,
                                            short_inv.view, DEV.stream()),
            "route_scatter_cuda: inverse has", send, short_inv)
    short_send, inverse = Guarded(n * cpu[3] - 1, np.int64), Guarded(len(keys), np.int64)
    refused(lambda: core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts.view, cpu[3], short_send.view,
                                            inverse.view, DEV.stream()),
            "route_scatter_cuda: send must have num_workers \\* stride", short_send, inverse)


# ---- embedding kernels ---------------------------------------------------------------------------

def _csr(rng, batch, rows, max_nnz=4):
    lens = rng.integers(0, max_nnz + 1, size=batch)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    keys = rng.integers(0, rows, size=int(offsets[-1])).astype(np.int64)
    return offsets, keys


def test_forward_outputs_checked_and_guarded(rng):
    rows, dim, batch = 300, 16, 50
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    offsets, keys = _csr(rng, batch, rows)
    args = [DEV.put(table)], [DEV.put(offsets)], [DEV.put(keys)], None, ["sum"]
    out = Guarded((batch, dim), np.float32)
    core.lookup_forward_cuda(*args, [out.view], stream=DEV.stream(), check=False)
    assert out.guard_intact()
    cpu = np.zeros((batch, dim), np.float32)
    core.lookup_forward([table], [offsets], [keys], None, ["sum"], [cpu])
    np.testing.assert_allclose(out.get(), cpu, rtol=1e-6, atol=1e-6)
    for shape in ((batch - 1, dim), (batch, dim - 1)):
        small = Guarded(shape, np.float32)
        refused(lambda: core.lookup_forward_cuda(*args, [small.view], stream=DEV.stream(), check=False),
                r"lookup_forward_cuda: outs\[0\] must have shape", small)


def test_backward_outputs_checked_and_guarded(rng):
    rows, dim, batch = 300, 8, 40
    offsets, keys = _csr(rng, batch, rows)
    nnz = len(keys)
    dy = DEV.put(rng.standard_normal((batch, dim)).astype(np.float32))
    d_off, d_keys = DEV.put(offsets), DEV.put(keys)
    uk, g, nu = Guarded(nnz, np.int64), Guarded((nnz, dim), np.float32), Guarded(1, np.int64)
    core.lookup_backward_cuda(d_off, d_keys, None, "sum", dy, rows, uk.view, g.view, nu.view, stream=DEV.stream())
    assert uk.guard_intact() and g.guard_intact() and nu.guard_intact()
    cpu_k, _ = core.lookup_backward(offsets, keys, None, "sum", DEV.get(dy), rows)
    assert int(nu.get()[0]) == len(cpu_k)
    cases = [((nnz - 1,), (nnz, dim), (1,), "unique_keys needs room for every key"),
             ((nnz,), (nnz - 1, dim), (1,), "rows must have shape"),
             ((nnz,), (nnz, dim + 1), (1,), "rows must have shape"),
             ((nnz,), (nnz, dim), (0,), "num_unique must have one entry")]
    for su, sr, sn, msg in cases:
        a, b, c = Guarded(su, np.int64), Guarded(sr, np.float32), Guarded(sn, np.int64)
        refused(lambda: core.lookup_backward_cuda(d_off, d_keys, None, "sum", dy, rows, a.view, b.view, c.view,
                                                  stream=DEV.stream()), "lookup_backward_cuda: " + msg, a, b, c)
    ws = Guarded(16, np.uint8)
    refused(lambda: core.lookup_backward_cuda(d_off, d_keys, None, "sum", dy, rows, uk.view, g.view, nu.view,
                                              stream=DEV.stream(), workspace=ws.view),
            "lookup_backward_cuda: workspace has 16 bytes, needs", ws)


@pytest.mark.parametrize("opt", ["sgd", "adagrad", "adam"])
def test_apply_and_optimizers_checked_and_guarded(rng, opt):
    rows, dim, batch = 200, 8, 30
    offsets, keys = _csr(rng, batch, rows)
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    dy = DEV.put(rng.standard_normal((batch, dim)).astype(np.float32))
    t = Guarded((rows, dim), np.float32, table)
    s1, s2 = Guarded((rows, dim), np.float32, np.zeros((rows, dim))), Guarded((rows, dim), np.float32,
                                                                             np.zeros((rows, dim)))
    slots = {"sgd": {}, "adagrad": {"accumulator": s1.view}, "adam": {"m": s1.view, "v": s2.view}}[opt]
    core.lookup_backward_apply_cuda(t.view, DEV.put(offsets), DEV.put(keys), None, "sum", dy, opt, 0.1,
                                    stream=DEV.stream(), **slots)
    assert t.guard_intact() and s1.guard_intact() and s2.guard_intact()
    assert not np.array_equal(t.get(), table) or len(keys) == 0
    if opt != "sgd":  # a state slot shorter than the table
        short = Guarded((rows - 1, dim), np.float32, np.zeros((rows - 1, dim)))
        bad = dict(slots)
        bad["accumulator" if opt == "adagrad" else "v"] = short.view
        refused(lambda: core.lookup_backward_apply_cuda(t.view, DEV.put(offsets), DEV.put(keys), None, "sum", dy, opt,
                                                        0.1, stream=DEV.stream(), **bad),
                "lookup_backward_apply_cuda: .* must have the table's shape", t, short)
        refused(lambda: core.lookup_backward_apply_multi_cuda(
                    [t.view], [DEV.put(offsets)], [DEV.put(keys)], None, ["sum"], [dy], opt, 0.1,
                    **{("accumulators" if k == "accumulator" else k): [v] for k, v in bad.items()},
                    stream=DEV.stream()),
                "lookup_backward_apply_multi_cuda: .* must have the table's shape", t, short)
    wide = DEV.put(rng.standard_normal((batch, dim + 1)).astype(np.float32))
    refused(lambda: core.lookup_backward_apply_cuda(t.view, DEV.put(offsets), DEV.put(keys), None, "sum", wide, opt,
                                                    0.1, stream=DEV.stream(), **slots),
            "lookup_backward_apply_cuda: gradient rows have", t, s1, s2)
    # the index-based optimizers
    idx = DEV.put(rng.integers(0, rows, size=20).astype(np.int64))
    grads = DEV.put(rng.standard_normal((20, dim)).astype(np.float32))
    short_g = DEV.put(rng.standard_normal((19, dim)).astype(np.float32))
    call = {"sgd": lambda g: core.sparse_sgd_cuda(t.view, idx, g, 0.1, stream=DEV.stream()),
            "adagrad": lambda g: core.sparse_adagrad_cuda(t.view, s1.view, idx, g, 0.1, 1e-7, stream=DEV.stream()),
            "adam": lambda g: core.sparse_adam_cuda(t.view, s1.view, s2.view, idx, g, 0.1, 0.9, 0.999, 1e-7, 1,
                                                    stream=DEV.stream())}[opt]
    call(grads)
    assert t.guard_intact() and s1.guard_intact() and s2.guard_intact()
    refused(lambda: call(short_g), f"sparse_{opt}_cuda: grads must have shape", t, s1, s2)


def test_gather_floor_checked_and_guarded(rng):
    rows, dim, n = 500, 16, 300
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    idx = rng.integers(0, rows, size=n).astype(np.int64)
    idx[:3] = [-1, rows, 2**40]  # outside the table: zero rows
    out = Guarded((n, dim), np.float32)
    core._gather_rows_cuda(DEV.put(table), DEV.put(idx), out.view, stream=DEV.stream())
    assert out.guard_intact()
    want = np.where(((idx >= 0) & (idx < rows))[:, None], table[np.clip(idx, 0, rows - 1)], 0)
    np.testing.assert_array_equal(out.get(), want)
    small = Guarded((n - 1, dim), np.float32)
    refused(lambda: core._gather_rows_cuda(DEV.put(table), DEV.put(idx), small.view, stream=DEV.stream()),
            r"_gather_rows_cuda: out must have shape", small)


# ---- the embedding cache -------------------------------------------------------------------------

@pytest.mark.parametrize("dim", [16, 33])
def test_cache_outputs_checked_and_guarded(rng, dim):
    if not hasattr(core, "CudaEmbeddingCache"):
        pytest.skip("the module has no CudaEmbeddingCache")
    cache = core.CudaEmbeddingCache(1024, dim, ways=8)
    keys = np.unique(rng.integers(-(2**40), 2**40, size=300)).astype(np.int64)
    vals = rng.standard_normal((len(keys), dim)).astype(np.float32)
    cache.insert(DEV.put(keys), DEV.put(vals), stream=DEV.stream())
    n = len(keys)
    out, mask = Guarded((n, dim), np.float32), Guarded(n, np.uint8)
    cache.lookup_mask(DEV.put(keys), out.view, mask.view, stream=DEV.stream())
    assert out.guard_intact() and mask.guard_intact()
    hit = mask.get() == 1
    np.testing.assert_array_equal(out.get()[hit], vals[hit])
    missing = cache.lookup(DEV.put(keys), out.view, stream=DEV.stream())
    assert out.guard_intact() and len(DEV.get(missing)) == int((~hit).sum())
    for shape in ((n - 1, dim), (n, dim - 1)):
        small = Guarded(shape, np.float32)
        refused(lambda: cache.lookup_mask(DEV.put(keys), small.view, None, stream=DEV.stream()),
                "CudaEmbeddingCache.lookup_mask: out must have shape", small)
        refused(lambda: cache.lookup(DEV.put(keys), small.view, stream=DEV.stream()),
                "CudaEmbeddingCache.lookup: out must have shape", small)
    # the miss positions into a caller's array: a view of its first m entries, nothing past n
    mis = Guarded(n, np.int64)
    got = cache.lookup(DEV.put(keys), out.view, stream=DEV.stream(), missing=mis.view)
    assert mis.guard_intact() and out.guard_intact()
    np.testing.assert_array_equal(DEV.get(got), np.flatnonzero(~hit))
    short_mis = Guarded(n - 1, np.int64)
    refused(lambda: cache.lookup(DEV.put(keys), out.view, stream=DEV.stream(), missing=short_mis.view),
            "CudaEmbeddingCache.lookup: missing must have room for every key", short_mis, out)
    short_mask = Guarded(n - 1, np.uint8)
    refused(lambda: cache.lookup_mask(DEV.put(keys), out.view, short_mask.view, stream=DEV.stream()),
            "CudaEmbeddingCache.lookup_mask: hit_mask must have shape", short_mask)
    for name in ("insert", "update"):
        with pytest.raises(ValueError, match=f"CudaEmbeddingCache.{name}: values must have shape"):
            getattr(cache, name)(DEV.put(keys), DEV.put(vals[:-1]), stream=DEV.stream())
