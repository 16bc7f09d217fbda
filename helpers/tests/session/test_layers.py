"""Every dense layer type against a NumPy oracle (forward) and finite differences (gradient, float64)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from embedlab.session.layers import forward_layer
from embedlab.session.spec import LayerSpec, T2, T3


def spec(t, in_shapes, params=None, ntops=1):
    return LayerSpec(name=t.lower(), type=t, bottoms=[f"b{i}" for i in range(len(in_shapes))],
                     tops=[f"t{i}" for i in range(ntops)], in_shapes=in_shapes, out_shapes=[], params=params or {})


def run(sp, ins, weights=(), training=False, bn=None):
    return [o.numpy() for o in forward_layer(sp, [tf.constant(x) for x in ins],
                                             [tf.Variable(w) for w in weights], training, bn)]


def grad_check(sp, ins, weights=()):
    """Analytic (TensorFlow autodiff) against numerical Jacobians, in float64."""
    ins = [np.asarray(x, np.float64) for x in ins]
    weights = [np.asarray(w, np.float64) for w in weights]
    n_in = len(ins)

    def f(*xs):
        outs = forward_layer(sp, list(xs[:n_in]), list(xs[n_in:]), False, None)
        return tf.concat([tf.reshape(o, [-1]) for o in outs], 0)

    theo, num = tf.test.compute_gradient(f, [tf.constant(x) for x in ins + weights], delta=1e-6)
    for a, b in zip(theo, num):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_reshape_concat_slice(rng):
    b = 3
    x3 = rng.standard_normal((b, 4, 6)).astype(np.float32)
    (y,) = run(spec("Reshape", [T3(4, 6)], {"leading_dim": 12}), [x3])
    np.testing.assert_array_equal(y, x3.reshape(-1, 12))
    (y,) = run(spec("Reshape", [T3(4, 6)], {"leading_dim": 6}), [x3])
    assert y.shape == (12, 6)
    a, c = rng.standard_normal((b, 5)).astype(np.float32), rng.standard_normal((b, 2)).astype(np.float32)
    (y,) = run(spec("Concat", [T2(1, 5), T2(1, 2)]), [a, c])
    np.testing.assert_array_equal(y, np.concatenate([a, c], 1))
    outs = run(spec("Slice", [T2(1, 5)], {"ranges": [[0, 3], [2, 5]]}, 2), [a])
    np.testing.assert_array_equal(outs[0], a[:, 0:3])
    np.testing.assert_array_equal(outs[1], a[:, 2:5])
    grad_check(spec("Reshape", [T3(4, 6)], {"leading_dim": 12}), [x3])
    grad_check(spec("Concat", [T2(1, 5), T2(1, 2)]), [a, c])
    grad_check(spec("Slice", [T2(1, 5)], {"ranges": [[0, 3], [2, 5]]}, 2), [a])


@pytest.mark.parametrize("fused", [False, True])
def test_inner_product(rng, fused):
    x = rng.standard_normal((4, 7)).astype(np.float32)
    w, bias = rng.standard_normal((7, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    t = "FusedInnerProduct" if fused else "InnerProduct"
    (y,) = run(spec(t, [T2(1, 7)], {"num_output": 3}), [x], [w, bias])
    ref = x @ w + bias
    np.testing.assert_allclose(y, np.maximum(ref, 0) if fused else ref, rtol=1e-5, atol=1e-6)
    grad_check(spec(t, [T2(1, 7)], {"num_output": 3}), [x], [w, bias])


def test_activations_and_dropout(rng):
    x = rng.standard_normal((5, 6)).astype(np.float32)
    x[0, 0] = 0.25
    (y,) = run(spec("ReLU", [T2(1, 6)]), [x])
    np.testing.assert_array_equal(y, np.maximum(x, 0))
    (y,) = run(spec("ELU", [T2(1, 6)], {"alpha": 0.7}), [x])
    np.testing.assert_allclose(y, np.where(x > 0, x, 0.7 * (np.exp(x) - 1)), rtol=1e-6, atol=1e-7)
    grad_check(spec("ELU", [T2(1, 6)], {"alpha": 0.7}), [x + 0.05])
    sp = spec("Dropout", [T2(1, 6)], {"rate": 0.5})
    (y,) = run(sp, [x], training=False)
    np.testing.assert_array_equal(y, x)                      # evaluation: identity
    big = np.ones((400, 50), np.float32)
    seed = tf.constant([3, 9], tf.int64)
    y1 = forward_layer(sp, [tf.constant(big)], [], True, dropout_seed=seed)[0].numpy()
    y2 = forward_layer(sp, [tf.constant(big)], [], True, dropout_seed=seed)[0].numpy()
    np.testing.assert_array_equal(y1, y2)                    # stateless: same seed, same mask
    assert set(np.unique(y1)) <= {0.0, 2.0}                  # inverted dropout scaling 1/(1-rate)
    assert abs((y1 == 0).mean() - 0.5) < 0.02


def test_multicross(rng):
    x0 = rng.standard_normal((4, 5))
    ws = [rng.standard_normal((1, 5)) * 0.5 for _ in range(6)]     # w, b per layer, 3 layers
    sp = spec("MultiCross", [T2(1, 5)], {"num_layers": 3})
    (y,) = run(sp, [x0.astype(np.float32)], [w.astype(np.float32) for w in ws])
    x = x0
    for l in range(3):
        x = x0 * (x @ ws[2 * l].T) + ws[2 * l + 1] + x
    np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5)
    grad_check(sp, [x0], ws)


def test_fm_order2_multiply_reducesum_add(rng):
    x = rng.standard_normal((3, 4 * 5))
    (y,) = run(spec("FmOrder2", [T2(1, 20)], {"out_dim": 5}), [x.astype(np.float32)])
    v = x.reshape(3, 4, 5)
    np.testing.assert_allclose(y, 0.5 * (v.sum(1) ** 2 - (v ** 2).sum(1)), rtol=1e-4, atol=1e-5)
    grad_check(spec("FmOrder2", [T2(1, 20)], {"out_dim": 5}), [x])
    d, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    sp = spec("Multiply", [T2(1, 4)], {"weight_dims": [4, 2]})
    (y,) = run(sp, [d.astype(np.float32)], [w.astype(np.float32)])
    np.testing.assert_allclose(y, (d[:, :, None] * w[None]).reshape(3, 8), rtol=1e-5, atol=1e-6)
    grad_check(sp, [d], [w])
    (y,) = run(spec("ReduceSum", [T2(1, 4)], {"axis": 1}), [d.astype(np.float32)])
    np.testing.assert_allclose(y, d.sum(1, keepdims=True), rtol=1e-5, atol=1e-6)
    grad_check(spec("ReduceSum", [T2(1, 4)], {"axis": 1}), [d])
    e = rng.standard_normal((3, 4))
    (y,) = run(spec("Add", [T2(1, 4)] * 3), [d.astype(np.float32), e.astype(np.float32), d.astype(np.float32)])
    np.testing.assert_allclose(y, 2 * d + e, rtol=1e-5, atol=1e-6)
    grad_check(spec("Add", [T2(1, 4)] * 2), [d, e])


def test_interaction(rng):
    b, S, dd = 3, 4, 5
    mlp, emb = rng.standard_normal((b, dd)), rng.standard_normal((b, S, dd))
    sp = spec("Interaction", [T2(1, dd), T3(S, dd)])
    (y,) = run(sp, [mlp.astype(np.float32), emb.astype(np.float32)])
    allv = np.concatenate([mlp[:, None], emb], 1)
    n = S + 1
    pairs = [[allv[k, i] @ allv[k, j] for i in range(n) for j in range(i)] for k in range(b)]
    ref = np.concatenate([mlp, np.array(pairs), np.zeros((b, 1))], 1)
    assert y.shape == (b, dd + n * (n - 1) // 2 + 1)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-5)
    grad_check(sp, [mlp, emb])


def test_batchnorm(rng):
    x = rng.standard_normal((16, 3)) * 2 + 1
    g, bt = rng.standard_normal(3), rng.standard_normal(3)
    sp = spec("BatchNorm", [T2(1, 3)], {"factor": 0.1, "eps": 1e-5})
    mean_v, var_v = tf.Variable(np.zeros(3, np.float32)), tf.Variable(np.ones(3, np.float32))
    (y,) = run(sp, [x.astype(np.float32)], [g.astype(np.float32), bt.astype(np.float32)], True, (mean_v, var_v))
    ref = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5) * g + bt
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean_v.numpy(), 0.1 * x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(var_v.numpy(), 0.9 + 0.1 * x.var(0, ddof=1), rtol=1e-5)
    (y,) = run(sp, [x.astype(np.float32)], [g.astype(np.float32), bt.astype(np.float32)], False, (mean_v, var_v))
    ref = (x - mean_v.numpy()) / np.sqrt(var_v.numpy() + 1e-5) * g + bt
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)

    def f(xx, gg, bb):
        m64, v64 = tf.Variable(np.zeros(3)), tf.Variable(np.ones(3))
        return forward_layer(sp, [xx], [gg, bb], True, (m64, v64))[0] ** 2

    theo, num = tf.test.compute_gradient(f, [tf.constant(x), tf.constant(g), tf.constant(bt)], delta=1e-6)
    for a, b in zip(theo, num):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_loss_and_regularizer(rng, tmp_path):
    """BinaryCrossEntropyLoss with L1 / L2 against the closed forms HugeCTR uses."""
    import json
    from embedlab.session.session import Session, solver_parser_helper
    for reg in ("L1", "L2"):
        j = {"optimizer": {"type": "SGD", "sgd_hparam": {"learning_rate": 0.1}},
             "layers": [{"name": "data", "type": "Data", "label": {"top": "label", "label_dim": 1},
                         "dense": {"top": "dense", "dense_dim": 3},
                         "sparse": [{"top": "s", "type": "DistributedSlot", "max_feature_num_per_sample": 2,
                                     "slot_num": 1}]},
                        {"name": "emb", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "s", "top": "e",
                         "sparse_embedding_hparam": {"max_vocabulary_size_per_gpu": 10, "embedding_vec_size": 2,
                                                     "combiner": 0}},
                        {"name": "r", "type": "Reshape", "bottom": "e", "top": "r", "leading_dim": 2},
                        {"name": "c", "type": "Concat", "bottom": ["r", "dense"], "top": "c"},
                        {"name": "fc", "type": "InnerProduct", "bottom": "c", "top": "fc",
                         "fc_param": {"num_output": 1}},
                        {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["fc", "label"],
                         "regularizer": reg, "lambda": 0.3, "top": "loss"}]}
        p = tmp_path / f"m_{reg}.json"
        p.write_text(json.dumps(j))
        sess = Session(solver_parser_helper(batchsize=4), p)
        logit = rng.standard_normal((6, 1)).astype(np.float32)
        label = (rng.random((6, 1)) > 0.5).astype(np.float32)
        got = float(sess._loss_of(tf.constant(logit), tf.constant(label), 6.0))
        w = sess.dense.weights()[0].numpy()
        bce = np.mean(np.maximum(logit, 0) - logit * label + np.log1p(np.exp(-np.abs(logit))))
        extra = 0.3 / 6 * np.abs(w).sum() if reg == "L1" else 0.3 / 12 * (w ** 2).sum()
        assert got == pytest.approx(bce + extra, rel=1e-5)
