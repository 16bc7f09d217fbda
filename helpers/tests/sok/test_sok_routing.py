"""The routing kernels (csrc/core/routing.*): CPU through `_embedlab_core.route_keys` and the TF
ops, CUDA through `route_count_cuda` / `route_scatter_cuda` (skipped, with the reason, without
a CUDA build, PyTorch or a GPU), all against a NumPy oracle on fresh random keys with padding
(-1), duplicates, empty tables, distributed / localized / hashed tables and 1-5 owners."""
from __future__ import annotations

import numpy as np
import pytest

from gpu_arrays import load_core

core = load_core()


def np_route(keys, offsets, modes, rows, ranks, n, stride):
    """(counts [n, T], send, inverse) by the definition in routing.h."""
    T = len(modes)
    owner = np.full(keys.shape, -1, np.int64)
    local = np.full(keys.shape, -1, np.int64)
    table = np.repeat(np.arange(T), np.diff(offsets))
    for i, (k, t) in enumerate(zip(keys, table)):
        if k == -1:
            continue
        if modes[t] == 0:
            assert 0 <= k < rows[t]
            owner[i], local[i] = k % n, k // n
        elif modes[t] == 1:
            assert 0 <= k < rows[t]
            owner[i], local[i] = ranks[t], k
        else:
            owner[i], local[i] = k % n, k   # Python's % is floor-mod, as the rule
    counts = np.zeros((n, T), np.int64)
    for o, t in zip(owner, table):
        if o >= 0:
            counts[o, t] += 1
    total = int(counts.sum())
    if stride < 0:
        stride = max(1, int(counts.sum(1).max()))
    send = np.full(n * stride if stride > 0 else total, -1, np.int64)
    inverse = np.full(keys.shape, -1, np.int64)
    pos = 0
    for o in range(n):
        if stride > 0:
            pos = o * stride
        for t in range(T):
            for i in np.nonzero((owner == o) & (table == t))[0]:
                send[pos] = local[i]
                inverse[i] = pos
                pos += 1
    return counts, send, inverse, stride


def random_case(rng, n, num_tables=None):
    T = int(num_tables or rng.integers(1, 6))
    modes, rows, ranks, parts = [], [], [], []
    for t in range(T):
        m = int(rng.integers(0, 3))
        r = int(rng.integers(1, 300))
        size = int(rng.choice([0, 1, 7, 200, 5000]))
        if m == 2:
            k = rng.integers(-2**40, 2**40, size=size)
        else:
            k = rng.integers(0, r, size=size)
        if size > 3:
            k[rng.integers(0, size, size=size // 5)] = -1      # padding
            k[1] = k[0]                                          # duplicates
        modes.append(m); rows.append(r); ranks.append(int(rng.integers(0, n))); parts.append(k.astype(np.int64))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    keys = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    return keys, offsets, modes, rows, ranks


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_cpu_routing_matches_oracle(n, rng):
    for _ in range(6):
        keys, offsets, modes, rows, ranks = random_case(rng, n)
        for stride in (-1, 0):
            exp = np_route(keys, offsets, modes, rows, ranks, n, stride)
            for threads in (1, 2):
                counts, send, inverse, s = core.route_keys(keys, offsets, modes, rows, ranks, n, stride, threads)
                np.testing.assert_array_equal(counts, exp[0])
                np.testing.assert_array_equal(send, exp[1])
                np.testing.assert_array_equal(inverse, exp[2])
                assert s == exp[3]
                valid = inverse >= 0
                # the inverse brings every routed key back to its input position
                assert (keys[~valid] == -1).all()


def test_cpu_routing_bad_keys_are_named():
    keys = np.array([0, 5, -1, 9, 3, 12, -7], np.int64)
    off = np.array([0, 4, 7], np.int64)
    with pytest.raises(ValueError, match="key 12 at position 1 of table 1 is outside the table of 10 rows"):
        core.route_keys(keys, off, [0, 1], [10, 10], [0, 1], 2)
    with pytest.raises(ValueError, match="key -7 at position 2 of table 1"):
        core.route_keys(keys, off, [0, 0], [10, 20], [0, 0], 2)
    with pytest.raises(ValueError, match="localized on rank 3"):
        core.route_keys(keys, off, [0, 1], [10, 20], [0, 3], 2)
    with pytest.raises(ValueError, match="table_offsets ends at"):
        core.route_keys(keys, np.array([0, 4, 6], np.int64), [0, 0], [10, 20], [0, 0], 2)


def test_tf_route_ops_match_oracle(rng):
    tf = pytest.importorskip("tensorflow", reason="the TF ops need TensorFlow (the GPU machine's standalone build has none)")
    import embedlab
    lib = embedlab.tf_ops()
    for n in (1, 2, 3):
        keys, offsets, modes, rows, ranks = random_case(rng, n, num_tables=3)
        parts = [keys[offsets[t]:offsets[t + 1]] for t in range(3)]
        attrs = dict(num_workers=n, modes=modes, rows=rows, ranks=ranks)
        counts, bad = lib.embed_lab_route_count([tf.constant(p) for p in parts], **attrs)
        exp = np_route(keys, offsets, modes, rows, ranks, n, -1)
        np.testing.assert_array_equal(counts.numpy(), exp[0])
        assert bad.numpy().tolist() == [-1, -1, -1]
        send, inverse = lib.embed_lab_route_scatter([tf.constant(p) for p in parts], counts, tf.constant(exp[3], tf.int64),
                                                    **attrs)
        np.testing.assert_array_equal(send.numpy(), exp[1])
        np.testing.assert_array_equal(np.concatenate([i.numpy() for i in inverse]), exp[2])
    # a bad key is reported as data (table, position, key), not raised
    _, bad = lib.embed_lab_route_count([tf.constant([1, 2], tf.int64), tf.constant([0, -1, 44], tf.int64)],
                                       num_workers=2, modes=[0, 0], rows=[5, 40], ranks=[0, 0])
    assert bad.numpy().tolist() == [1, 2, 44]


# ---- CUDA --------------------------------------------------------------------------------------
@pytest.mark.needs_gpu("route_count_cuda")
@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_cuda_routing_matches_cpu_and_oracle(n, rng):
    torch = pytest.importorskip("torch", reason="PyTorch puts these tests' arrays on the GPU")
    stream = torch.cuda.current_stream().cuda_stream
    for _ in range(5):
        keys, offsets, modes, rows, ranks = random_case(rng, n)
        if n == 64:
            keys = np.concatenate([keys, rng.integers(0, 50, size=300_000)]).astype(np.int64)
            offsets = offsets.copy(); offsets[-1] = len(keys)
            modes[-1] = 2
        exp_counts, exp_send, exp_inv, stride = np_route(keys, offsets, modes, rows, ranks, n, -1) if len(keys) < 50_000 \
            else (None, None, None, None)
        cpu = core.route_keys(keys, offsets, modes, rows, ranks, n, -1, 2)
        if exp_counts is not None:
            np.testing.assert_array_equal(cpu[0], exp_counts)
            np.testing.assert_array_equal(cpu[1], exp_send)
        stride = cpu[3]
        dk = torch.from_numpy(keys).cuda()
        counts = torch.empty((n, len(modes)), dtype=torch.int64, device="cuda")
        total, max_per_owner = core.route_count_cuda(dk, offsets, modes, rows, ranks, n, counts, stream)
        assert total == int(cpu[0].sum()) and max(1, max_per_owner) == stride
        for s in (stride, 0):
            size = n * s if s > 0 else total
            send = torch.full((size,), 12345, dtype=torch.int64, device="cuda")
            inverse = torch.full((len(keys),), 12345, dtype=torch.int64, device="cuda")
            core.route_scatter_cuda(dk, offsets, modes, rows, ranks, n, counts, s, send, inverse, stream)
            torch.cuda.synchronize()
            ref = cpu if s == stride else core.route_keys(keys, offsets, modes, rows, ranks, n, 0, 2)
            np.testing.assert_array_equal(counts.cpu().numpy(), ref[0])
            np.testing.assert_array_equal(send.cpu().numpy(), ref[1])
            np.testing.assert_array_equal(inverse.cpu().numpy(), ref[2])


@pytest.mark.needs_gpu("route_count_cuda")
def test_cuda_routing_bad_key_is_named():
    torch = pytest.importorskip("torch", reason="PyTorch puts these tests' arrays on the GPU")
    keys = torch.tensor([0, 5, -1, 9, 3, 12, 13], dtype=torch.int64, device="cuda")
    counts = torch.empty((2, 2), dtype=torch.int64, device="cuda")
    with pytest.raises(ValueError, match="key 12 at position 1 of table 1 is outside the table of 10 rows"):
        core.route_count_cuda(keys, np.array([0, 4, 7], np.int64), [0, 1], [10, 10], [0, 1], 2, counts, 0)
