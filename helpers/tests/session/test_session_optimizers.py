"""The Session's dense and Global update rules against HugeCTR's formulas in NumPy (float64)."""
import numpy as np
import pytest
import tensorflow as tf

from embedlab.session.embedding import TFOptimizer
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
def test_dense_and_global_updates_match_hugectr_formulas(kind):
    rng = np.random.default_rng()
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
        # Global on a table: rows idx get their gradient, every other row a zero gradient
        idx = np.sort(rng.choice(40, 7, replace=False))
        gr = rng.standard_normal((7, 4))
        opt.apply_global(tf.constant(idx, tf.int64), tf.constant(gr, tf.float32), table, tslots,
                         tf.constant(0.01), tf.constant(step, tf.int64))
        dense_g = np.zeros_like(table0)
        dense_g[idx] = gr
        ref_t, ref_ts = _numpy_rule(kind, ref_t, dense_g, ref_ts, 0.01, step)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
    for var, ref in zip(slots, ref_s):
        np.testing.assert_allclose(var.numpy(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table.numpy(), ref_t, rtol=1e-5, atol=1e-6)
    for var, ref in zip(tslots, ref_ts):
        np.testing.assert_allclose(var.numpy(), ref, rtol=1e-5, atol=1e-6)
