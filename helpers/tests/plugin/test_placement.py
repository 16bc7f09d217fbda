"""embedlab.plugin.placement: the "distributed" rule is csrc/core/routing.h's (checked against the
compiled route_keys), and shard_keys / local_rows are each other's inverse in both embedding types."""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from embedlab.plugin import placement  # noqa: E402


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_distributed_rule_matches_routing_h(core, rng, n):
    V = int(rng.integers(n, 5000))
    keys = rng.integers(0, V, 3000).astype(np.int64)
    keys[rng.random(keys.shape) < 0.1] = -1
    counts, send, inverse, _ = core.route_keys(keys, np.array([0, len(keys)], np.int64), [0], [V], [0], n, 0, 1)
    valid = keys >= 0
    starts = np.concatenate([[0], np.cumsum(counts[:, 0])])
    core_owner = np.searchsorted(starts, inverse[valid], side="right") - 1
    core_local = send[inverse[valid]]
    owner, local = placement.distributed_owner(keys[valid], n)
    np.testing.assert_array_equal(owner, core_owner)
    np.testing.assert_array_equal(local, core_local)
    t_owner, t_local = placement.distributed_owner(tf.constant(keys[valid]), n)
    np.testing.assert_array_equal(t_owner.numpy(), core_owner)
    np.testing.assert_array_equal(t_local.numpy(), core_local)
    # shard_keys lists each device's keys in local-row order, every key exactly once.
    plan = placement.shard_keys(V, n, "distributed")
    assert len(plan) == n
    np.testing.assert_array_equal(np.sort(np.concatenate(plan)), np.arange(V))
    for i, sk in enumerate(plan):
        o, l = placement.distributed_owner(sk, n)
        assert (o == i).all() and np.array_equal(l, np.arange(len(sk)))
        rows = placement.local_rows(i, n, tf.constant(keys), "distributed").numpy()
        mine = valid & (placement.distributed_owner(keys, n)[0] == i)
        assert (rows[~mine] == -1).all()
        np.testing.assert_array_equal(sk[rows[mine]], keys[mine])


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("with_sizes", [True, False])
def test_localized_shards_and_local_rows_are_inverse(rng, n, with_sizes):
    S = int(rng.integers(1, 9))
    ssa = rng.integers(1, 50, S).astype(np.int64)
    V = int(ssa.sum())
    offsets = placement.slot_offsets(ssa)
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(ssa)[:-1]]))
    slot = rng.integers(0, S, 2000).astype(np.int64)
    keys = offsets[slot] + (rng.random(2000) * ssa[slot]).astype(np.int64)
    keys[rng.random(2000) < 0.1] = -1
    sizes = [int(x) for x in ssa] if with_sizes else None
    plan = placement.shard_keys(V, n, "localized", sizes)
    for i, sk in enumerate(plan):
        if with_sizes:
            want = np.concatenate([np.arange(offsets[s], offsets[s] + ssa[s]) for s in range(S) if s % n == i]
                                  or [np.zeros(0, np.int64)])
            np.testing.assert_array_equal(sk, want)
        else:
            np.testing.assert_array_equal(sk, np.arange(V))
        rows = placement.local_rows(i, n, tf.constant(keys), "localized", tf.constant(slot), sizes).numpy()
        mine = (keys >= 0) & (placement.localized_device(slot, n) == i)
        assert (rows[~mine] == -1).all()
        np.testing.assert_array_equal(sk[rows[mine]], keys[mine])
