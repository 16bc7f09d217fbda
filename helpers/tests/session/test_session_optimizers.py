"""The Session's dense and Global update rules against HugeCTR's formulas in NumPy (float64)."""
import numpy as np
import pytest
import tensorflow as tf

from embedlab.session.optimizer import TFOptimizer
from embedlab.session.spec import OptimizerSpec


def _numpy_rule(kind, w, g, slots, lr, t, b1=0.9, b2=0.999, eps=1e-7, mu=0.9):
    if kind == "Adam":
        m, v = slots
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        return w - lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (np.sqrt(v) + eps), [m, v]
    if kind == "MomentumSGD":
        a = mu * slots[0] - lr * g
        return w + a, [a]
    if kind == "Nesterov":
        a = mu * slots[0] - lr * g
        return w + (1 + mu) * a - mu * slots[0], [a]
    return w - lr * g, []


@pytest.mark.parametrize("kind", ["Adam", "SGD", "MomentumSGD", "Nesterov"])
def test_dense_and_global_updates_match_hugectr_formulas(kind, rng):
    spec = OptimizerSpec(type=kind, update_type="Global", learning_rate=0.01, momentum_factor=0.9)
    opt = TFOptimizer(spec)
    w0 = rng.standard_normal((50, 8))
    w = tf.Variable(w0.astype(np.float32))
    slots = opt.make_slots([50, 8], "t")
    table0 = rng.standard_normal((40, 4))
    table = tf.Variable(table0.astype(np.float32))
    tslots = opt.make_slots([40, 4], "tab")
    ref_w, ref_s = w0, [np.zeros_like(w0) for _ in slots]
    ref_t, ref_ts = table0, [np.zeros_like(table0) for _ in tslots]
    for step in range(1, 5):
        g = rng.standard_normal((50, 8))
        opt.apply_dense([tf.constant(g, tf.float32)], [w], [slots], tf.constant(0.01), tf.constant(step, tf.int64))
        ref_w, ref_s = _numpy_rule(kind, ref_w, g, ref_s, 0.01, step)
        # Global on a table: rows idx get their gradient, every other row in use a zero gradient.
        # Rows in use grow like the Session's watermark (30 + step); the rows past them were
        # never touched (zero state), so the rule leaves them as they are.
        used = 30 + step
        idx = np.sort(rng.choice(used, 7, replace=False))
        gr = rng.standard_normal((7, 4))
        if step == 3:                            # unsorted, with a repeated row: summed first
            idx, gr = np.concatenate([idx[::-1], idx[:2]]), np.concatenate([gr[::-1], gr[:2]])
        opt.apply_global(tf.constant(idx, tf.int64), tf.constant(gr, tf.float32), table, tslots,
                         tf.constant(0.01), tf.constant(step, tf.int64), tf.constant(used, tf.int64))
        dense_g = np.zeros_like(table0)
        np.add.at(dense_g, idx, gr)
        ref_t, ref_ts = _numpy_rule(kind, ref_t, dense_g, ref_ts, 0.01, step)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
    for var, ref in zip(slots, ref_s):
        np.testing.assert_allclose(var.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table.numpy(), ref_t, rtol=1e-5, atol=1e-6)
    for var, ref in zip(tslots, ref_ts):
        np.testing.assert_allclose(var.numpy(), ref, rtol=1e-5, atol=1e-6)


def test_global_adam_reads_no_row_past_the_rows_in_use(rng):
    """The compiled Global Adam pass stops at rows_used: state planted past it (NaN) is neither
    read nor written, and a row index past rows_used extends the pass to that row only."""
    spec = OptimizerSpec(type="Adam", update_type="Global", learning_rate=0.01)
    opt = TFOptimizer(spec)
    table0 = rng.standard_normal((40, 4)).astype(np.float32)
    table = tf.Variable(table0)
    m0 = np.zeros((40, 4), np.float32)
    m0[25:] = np.nan
    tslots = [tf.Variable(m0), tf.Variable(m0.copy())]
    idx, gr = np.array([3, 22], np.int64), rng.standard_normal((2, 4)).astype(np.float32)
    opt.apply_global(tf.constant(idx), tf.constant(gr), table, tslots, tf.constant(0.01),
                     tf.constant(1, tf.int64), tf.constant(21, tf.int64))
    t = table.numpy()
    assert np.isfinite(t).all() and np.array_equal(t[[21, 23, 24]], table0[[21, 23, 24]])
    assert np.array_equal(t[25:], table0[25:])
    assert np.isnan(tslots[0].numpy()[25:]).all() and np.isnan(tslots[1].numpy()[25:]).all()
    assert (t[[3, 22]] != table0[[3, 22]]).all()
    with pytest.raises(tf.errors.InvalidArgumentError, match="rows_used\\[0\\] = 41 is outside"):
        opt.apply_global(tf.constant(idx), tf.constant(gr), table, tslots, tf.constant(0.01),
                         tf.constant(2, tf.int64), tf.constant(41, tf.int64))


def test_catch_up_replays_missed_steps_exactly_and_refuses_rows_too_far_behind(rng):
    """EmbedLabGlobalAdamCatchUp on a row 3 steps behind equals 3 full passes with a zero
    gradient, bit for bit; repeated rows are replayed once; a row further behind than the
    learning-rate ring reaches is an error naming it, and nothing is written."""
    import embedlab
    ops = embedlab.tf_ops()
    spec = OptimizerSpec(type="Adam", update_type="Global", learning_rate=0.01)
    opt = TFOptimizer(spec)
    w0 = rng.standard_normal((6, 8)).astype(np.float32)
    m0 = (rng.standard_normal((6, 8)) * 1e-2).astype(np.float32)
    v0 = (rng.random((6, 8)) * 1e-3).astype(np.float32)
    full = [tf.Variable(x) for x in (w0, m0, v0)]
    lrs = np.array([0.01, 0.02, 0.005, 0.01, 0.03], np.float32)          # step j at j % 5
    for j in (5, 6, 7):                                                   # three full passes
        opt.apply_global(tf.zeros([0], tf.int64), tf.zeros([0, 8]), full[0], full[1:],
                         tf.constant(lrs[j % 5]), tf.constant(j, tf.int64), tf.constant(6, tf.int64))
    lazy = [tf.Variable(x) for x in (w0, m0, v0)]
    last = tf.Variable(np.full(6, 4, np.int64))

    def catch_up(rows, all_rows, target):
        ops.embed_lab_global_adam_catch_up(lazy[0].handle, lazy[1].handle, lazy[2].handle, last.handle,
                                           tf.constant(rows, tf.int64), tf.constant(all_rows, tf.int64),
                                           tf.constant(target, tf.int64), tf.constant(lrs),
                                           tf.constant(0.9, tf.float64), tf.constant(0.999, tf.float64),
                                           tf.constant(1e-7, tf.float32))

    catch_up([2, 2, 4], -1, 7)
    assert last.numpy().tolist() == [4, 4, 7, 4, 7, 4]
    catch_up([], 6, 7)                                                    # the rest
    for a, b in zip(lazy, full):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    before = [x.numpy().copy() for x in lazy]
    last.assign(np.array([7, 7, 7, 1, 7, 7], np.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"row 3 is current only through step 1, more than 4 steps"):
        catch_up([0, 3, 5], -1, 9)
    for a, b in zip(lazy, before):
        np.testing.assert_array_equal(a.numpy(), b)


@pytest.mark.parametrize("kind", ["Adam", "SGD"])
def test_compiled_embedding_state_is_the_optimizers_own(kind):
    """An embedding on the compiled path keeps its optimizer state in the EmbedLab optimizer's
    variables (`slot_variables`): the same variables the fused kernels update."""
    from embedlab.session.embedding import Embedding
    from embedlab.session.spec import EmbeddingSpec, SparseInput
    opt = OptimizerSpec(type=kind, update_type="Local", learning_rate=0.01)
    inp = SparseInput(top="s", type="DistributedSlot", max_feature_num_per_sample=1, slot_num=1, first_slot=0)
    e = Embedding(EmbeddingSpec(index=0, name="e", type="DistributedSlotSparseEmbeddingHash", bottom="s", top="t",
                                input=inp, vec=4, combiner="sum", capacity=8, slot_size_array=None, optimizer=opt),
                  seed=0)
    assert e.compiled
    name, handles = e.kopt._slot_handles([e.table])
    assert len(handles) == len(e.slots) and all(s.handle is h for s, h in zip(e.slots, handles))
    assert len(e.slots) == (2 if kind == "Adam" else 0)
    assert all(isinstance(s, tf.Variable) and tuple(s.shape) == (8, 4) for s in e.slots)
    with pytest.raises(ValueError, match="has no state for variable"):
        e.kopt.slot_variables(tf.Variable(tf.zeros([8, 4])))
