"""The CPU forward at every width it specialises (rows summed in registers, chunk by chunk, for
widths that are a multiple of 8; a plain loop for the others), against an independent float32
reference that adds the terms in the contract's order: every bit must match.

Inputs are fresh random draws with empty rows, rows of only -1, duplicate keys inside a row and
across rows, and weights; both the CSR and the single-pass COO kernel are checked, through the
framework-free module and through the TensorFlow op.
"""
import numpy as np
import pytest

import reference as ref

WIDTHS = (1, 4, 8, 12, 16, 24, 32, 40, 64, 96, 128, 136, 256)


def sequential_f32(table, offsets, keys, weights, combiner):
    """out[r] = ((0 + w_0 x_0) + w_1 x_1) + ... in float32, one rounding per product and per add,
    in increasing position (the contract in embedding.h); mean divides by the float32 sum of the
    valid keys' weights; empty rows are zeros. Row by row in Python: no vectorised reordering."""
    batch, dim = len(offsets) - 1, table.shape[1]
    out = np.zeros((batch, dim), np.float32)
    for r in range(batch):
        acc = np.zeros(dim, np.float32)
        wsum = np.float32(0)
        for j in range(offsets[r], offsets[r + 1]):
            k = keys[j]
            if k < 0:
                continue
            if weights is None:
                acc = acc + table[k]
                wsum = np.float32(wsum + np.float32(1))
            else:
                w = np.float32(weights[j])
                acc = acc + (w * table[k]).astype(np.float32)
                wsum = np.float32(wsum + w)
        if combiner == "mean":
            acc = acc / wsum if wsum != 0 else np.zeros(dim, np.float32)
        out[r] = acc
    return out


def _ids(rng, batch, rows):
    offsets, keys = ref.random_csr(rng, batch, rows, max_nnz=6, zipf=bool(rng.integers(2)))
    if batch > 2:  # a row of only -1 padding, and a key repeated across two rows
        offsets_l = offsets.tolist()
        if offsets_l[2] > offsets_l[1]:
            keys[offsets_l[1]:offsets_l[2]] = -1
        if offsets_l[1] > offsets_l[0] and len(keys) > offsets_l[2]:
            keys[offsets_l[2]] = keys[0] if keys[0] >= 0 else 0
    return offsets, keys


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_core_forward_bits_at_every_width(core, rng, combiner, weighted):
    tables, offs, keys, weights, outs = [], [], [], [], []
    for dim in WIDTHS:
        rows = int(rng.integers(1, 200))
        tables.append(rng.standard_normal((rows, dim)).astype(np.float32))
        o, k = _ids(rng, int(rng.integers(3, 70)), rows)
        offs.append(o), keys.append(k)
        weights.append(rng.uniform(-1.0, 2.0, size=len(k)).astype(np.float32) if weighted else None)
        outs.append(np.full((len(o) - 1, dim), np.nan, np.float32))  # every element must be written
    for threads in (1, 2):
        core.lookup_forward(tables, offs, keys, weights if weighted else None, [combiner] * len(WIDTHS), outs,
                            num_threads=threads)
        for t, dim in enumerate(WIDTHS):
            want = sequential_f32(tables[t], offs[t], keys[t], weights[t], combiner)
            assert outs[t].tobytes() == want.tobytes(), f"dim {dim}, {threads} threads"
            # and close to the float64 oracle (the reference itself is right)
            np.testing.assert_allclose(outs[t], ref.csr_lookup(tables[t], offs[t], keys[t], weights[t], combiner),
                                       rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dim", [16, 64, 128])
def test_core_coo_forward_bits(core, rng, dim):
    rows = int(rng.integers(50, 500))
    table = rng.standard_normal((rows, dim)).astype(np.float32)
    o, k = _ids(rng, 300, rows)
    counts = np.diff(o)
    indices = np.ascontiguousarray(np.stack([np.repeat(np.arange(len(counts)), counts),
                                             np.concatenate([np.arange(c) for c in counts])], 1).astype(np.int64))
    w = rng.uniform(0.1, 2.0, size=len(k)).astype(np.float32)
    out = np.full((len(counts), dim), np.nan, np.float32)
    offsets, status = core.lookup_forward_coo(table, indices, k, w, len(counts), "mean", out)
    assert status == "ok" and np.array_equal(offsets, o)
    assert out.tobytes() == sequential_f32(table, o, k, w, "mean").tobytes()


@pytest.mark.parametrize("dim", [8, 64, 128])
def test_core_forward_rejects_bad_keys_at_register_widths(core, rng, dim):
    table = rng.standard_normal((10, dim)).astype(np.float32)
    o = np.array([0, 2, 3], np.int64)
    for bad in (10, -2):
        k = np.array([1, bad, 3], np.int64)
        with pytest.raises(ValueError, match=f"key {bad}"):
            core.lookup_forward([table], [o], [k], None, ["sum"], [np.zeros((2, dim), np.float32)])


def test_tf_op_forward_bits_at_register_widths(rng):
    tf = pytest.importorskip("tensorflow")
    from embedlab import ops
    tables, ids, refs = [], [], []
    for dim in (8, 32, 64, 128, 136):
        rows = int(rng.integers(5, 300))
        table = rng.standard_normal((rows, dim)).astype(np.float32)
        o, k = _ids(rng, int(rng.integers(3, 60)), rows)
        tables.append(tf.Variable(table))
        ids.append(tf.RaggedTensor.from_row_splits(k, o))
        refs.append(sequential_f32(table, o, k, None, "sum"))
    for out, want in zip(ops.fused_embedding_lookup(tables, ids, "sum"), refs):
        assert out.numpy().tobytes() == want.tobytes()
