"""embedlab.optimizers against Keras' own optimizers and NumPy float64 references.

SGD and Adagrad must give the same bits as Keras on IndexedSlices gradients; Adam equals
Keras on rows touched every step and follows the lazy reference elsewhere.
"""
from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import reference as ref  # noqa: E402
from embedlab import ops  # noqa: E402
from embedlab import optimizers as eopt  # noqa: E402


def _unique_grad(rng, rows, dim, frac=0.5, always=()):
    idx = np.union1d(np.flatnonzero(rng.random(rows) < frac), np.asarray(always, np.int64)).astype(np.int64)
    vals = rng.standard_normal((len(idx), dim)).astype(np.float32)
    return tf.IndexedSlices(tf.constant(vals), tf.constant(idx), tf.constant([rows, dim], tf.int64))


def _pairs(kind, lr):
    if kind == "sgd":
        return eopt.SGD(lr), keras.optimizers.SGD(lr)
    if kind == "adagrad":
        return eopt.Adagrad(lr, initial_accumulator_value=0.3), keras.optimizers.Adagrad(lr, initial_accumulator_value=0.3)
    if kind == "ftrl":
        kw = dict(learning_rate_power=-0.5, initial_accumulator_value=0.2, l1_regularization_strength=0.01,
                  l2_regularization_strength=0.05, beta=0.1)
        return eopt.Ftrl(lr, **kw), keras.optimizers.Ftrl(lr, **kw)
    return eopt.Adam(lr, beta_1=0.8, beta_2=0.95), keras.optimizers.Adam(lr, beta_1=0.8, beta_2=0.95)


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_sgd_adagrad_bitwise_equal_keras(rng, kind):
    rows, dim = 64, 8
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    ours, theirs = _pairs(kind, float(rng.uniform(0.01, 0.5)))
    a, b = tf.Variable(init), tf.Variable(init)
    for _ in range(5):
        g = _unique_grad(rng, rows, dim)
        ours.apply_gradients([(g, a)])
        theirs.apply_gradients([(g, b)])
    assert np.array_equal(a.numpy(), b.numpy())


def test_adam_equal_keras_on_always_touched_rows_lazy_elsewhere(rng):
    rows, dim, lr = 48, 4, 0.05
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    always = np.arange(0, rows, 3)                 # rows touched every step
    ours, theirs = _pairs("adam", lr)
    a, b = tf.Variable(init), tf.Variable(init)
    w, m, v = init.astype(np.float64), np.zeros((rows, dim)), np.zeros((rows, dim))
    for step in range(1, 7):
        g = _unique_grad(rng, rows, dim, frac=0.3, always=always)
        ours.apply_gradients([(g, a)])
        theirs.apply_gradients([(g, b)])
        w, m, v = ref.np_lazy_adam(w, m, v, g.indices.numpy(), g.values.numpy(), lr, step, 0.8, 0.95, 1e-7)
    got, keras_w = a.numpy(), b.numpy()
    np.testing.assert_array_equal(got[always], keras_w[always])
    np.testing.assert_allclose(got, w, rtol=2e-5, atol=2e-6)       # lazy reference, all rows
    # Moments of the lazy optimizer match the reference too.
    i = ours._get_variable_index(a)
    np.testing.assert_allclose(ours._momentums[i].numpy(), m, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(ours._velocities[i].numpy(), v, rtol=2e-5, atol=1e-9)


def test_adam_untouched_rows_do_not_move(rng):
    rows, dim = 20, 3
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    a = tf.Variable(init)
    opt = eopt.Adam(0.1)
    g1 = tf.IndexedSlices(tf.ones([2, dim]), tf.constant([1, 5], tf.int64), tf.constant([rows, dim], tf.int64))
    g2 = tf.IndexedSlices(tf.ones([1, dim]), tf.constant([7], tf.int64), tf.constant([rows, dim], tf.int64))
    opt.apply_gradients([(g1, a)])
    after1 = a.numpy().copy()
    opt.apply_gradients([(g2, a)])                # Keras Adam would move rows 1 and 5 again (momentum)
    after2 = a.numpy()
    assert np.array_equal(after1[[1, 5]], after2[[1, 5]])
    untouched = np.setdiff1d(np.arange(rows), [1, 5, 7])
    assert np.array_equal(after2[untouched], init[untouched])


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_duplicate_indices_are_summed(rng, kind):
    rows, dim, lr = 10, 4, 0.1
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    idx = np.array([3, 1, 3, 3, 7, 1], np.int64)
    vals = rng.standard_normal((len(idx), dim)).astype(np.float32)
    dup = tf.IndexedSlices(tf.constant(vals), tf.constant(idx), tf.constant([rows, dim], tf.int64))
    u, s = np.unique(idx), None
    s = np.stack([vals[idx == k].astype(np.float64).sum(0) for k in u]).astype(np.float32)
    coal = tf.IndexedSlices(tf.constant(s), tf.constant(u), tf.constant([rows, dim], tf.int64))
    a, b = tf.Variable(init), tf.Variable(init)
    o1, _ = _pairs(kind, lr)
    o2, _ = _pairs(kind, lr)
    o1.apply_gradients([(dup, a)])
    o2.apply_gradients([(coal, b)])
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6, atol=1e-6)
    if kind == "sgd":
        np.testing.assert_allclose(a.numpy(), ref.np_sgd(init, idx, vals, lr), rtol=1e-6, atol=1e-6)
    elif kind == "adagrad":
        w, _ = ref.np_adagrad(init, np.full((rows, dim), 0.3), idx, vals, lr)
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-5, atol=1e-6)
    else:
        w, _, _ = ref.np_lazy_adam(init, np.zeros((rows, dim)), np.zeros((rows, dim)), idx, vals, lr, 1, 0.8, 0.95)
        np.testing.assert_allclose(a.numpy(), w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
def test_dense_gradients_go_to_keras(rng, kind):
    init = rng.standard_normal((6, 5)).astype(np.float32)
    ours, theirs = _pairs(kind, 0.05)
    a, b = tf.Variable(init), tf.Variable(init)
    for _ in range(3):
        g = tf.constant(rng.standard_normal((6, 5)).astype(np.float32))
        ours.apply_gradients([(g, a)])
        theirs.apply_gradients([(g, b)])
    assert np.array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_many_tables_in_tf_function_match_numpy(rng, kind):
    # Several tables (one fused update op) from a real lookup gradient, inside tf.function.
    lr = 0.05
    shapes = [(30, 4), (17, 8), (50, 1)]
    inits = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tables = [tf.Variable(x) for x in inits]
    opt = _pairs(kind, lr)[0]
    idss = [ref.random_ids(rng, 12, s[0]) for s in shapes]
    dys = [rng.standard_normal((12, s[1])).astype(np.float32) for s in shapes]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            outs = ops.fused_embedding_lookup(tables, [i.ragged(tf) for i in idss], "sum")
            loss = tf.add_n([tf.reduce_sum(o * d) for o, d in zip(outs, dys)])
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))

    state = [dict(w=x.astype(np.float64), a=np.full(x.shape, 0.3), m=np.zeros(x.shape), v=np.zeros(x.shape))
             for x in inits]
    for it in range(1, 4):
        step()
        for t, (i, d, st) in enumerate(zip(idss, dys, state)):
            g = ref.np_lookup_grad(d, i.splits, i.keys, shapes[t][0])
            touched = np.unique(i.keys[i.keys >= 0])
            if kind == "sgd":
                st["w"] = ref.np_sgd(st["w"], touched, g[touched], lr)
            elif kind == "adagrad":
                st["w"], st["a"] = ref.np_adagrad(st["w"], st["a"], touched, g[touched], lr)
            else:
                st["w"], st["m"], st["v"] = ref.np_lazy_adam(st["w"], st["m"], st["v"], touched, g[touched], lr, it,
                                                            0.8, 0.95)
    for t, st in zip(tables, state):
        np.testing.assert_allclose(t.numpy(), st["w"], rtol=1e-4, atol=1e-5)


def test_fit_with_dense_and_sparse_variables(rng):
    # model.fit: the table gets IndexedSlices (compiled path), the Dense layer dense grads (Keras).
    rows, dim, n = 40, 6, 512
    keys = rng.integers(0, rows, (n, 2)).astype(np.int64)
    y = ((keys[:, 0] % 3) == 0).astype(np.float32)

    class Emb(keras.layers.Layer):
        def build(self, _):
            self.table = self.add_weight(shape=(rows, dim), initializer="random_normal")

        def call(self, ids):
            return ops.embedding_lookup(self.table, ids)

    inp = keras.Input((2,), dtype="int64")
    model = keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(Emb()(inp)))
    model.compile(eopt.Adam(0.05), "binary_crossentropy", metrics=["accuracy"])
    h = model.fit(keys, y, batch_size=64, epochs=6, verbose=0)
    assert h.history["loss"][-1] < 0.8 * h.history["loss"][0]


def test_bad_gradient_index_raises_and_changes_nothing():
    a = tf.Variable(tf.ones([5, 2]))
    before = a.numpy().copy()
    g = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 9], tf.int64), tf.constant([5, 2], tf.int64))
    with pytest.raises(tf.errors.InvalidArgumentError, match="9"):
        eopt.SGD(0.1).apply_gradients([(g, a)])
    assert np.array_equal(a.numpy(), before)


# ---- optimizer in backward (fused_embedding_lookup(..., optimizer=...)) ---------------------

def _random_ids(rng, rows, batch=6, max_nnz=4):
    ids = ref.random_ids(rng, batch, rows, max_nnz=max_nnz)
    return ids.ragged(tf, True)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("graph", [False, True])
def test_optimizer_in_backward_equals_gradient_then_apply(rng, kind, graph):
    # Three tables (mixed dims and combiners, weights, -1 padding, duplicates): three steps with
    # the optimizer inside the backward give the same bits as tape.gradient + apply_gradients.
    shapes = [(int(rng.integers(5, 60)), d) for d in (4, 16, 7)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    comb = ["sum", "mean", "sum"]
    ta, tb = [tf.Variable(x) for x in init], [tf.Variable(x) for x in init]
    oa, _ = _pairs(kind, 0.1)
    ob, _ = _pairs(kind, 0.1)

    def two_step(ids, w, r):
        with tf.GradientTape() as tape:
            outs = ops.fused_embedding_lookup(ta, ids, comb, weights=w)
            loss = tf.add_n([tf.reduce_sum(o * x) for o, x in zip(outs, r)])
        oa.apply_gradients(zip(tape.gradient(loss, ta), ta))

    def fused(ids, w, r):
        with tf.GradientTape() as tape:
            outs = ops.fused_embedding_lookup(tb, ids, comb, weights=w, optimizer=ob)
            loss = tf.add_n([tf.reduce_sum(o * x) for o, x in zip(outs, r)])
        grads = tape.gradient(loss, tb)
        return [g is None for g in grads]

    if graph:
        two_step, fused = tf.function(two_step), tf.function(fused)
    # Eager, the op's kernel (and its grouping buffers) is reused across batch sizes: growing
    # and shrinking batches check that nothing of an earlier step leaks into the next.
    for batch in ((6, 40, 3) if not graph else (6, 6, 6)):
        pairs = [_random_ids(rng, r, batch=batch) for r, _ in shapes]
        ids, w = [p[0] for p in pairs], [p[1] for p in pairs]
        r = [tf.constant(rng.standard_normal((batch, d)).astype(np.float32)) for _, d in shapes]
        two_step(ids, w, r)
        none = fused(ids, w, r)
        assert all(bool(x) for x in none)  # the tables come back None: they are already updated
    for a, b in zip(ta, tb):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert int(oa.iterations.numpy()) == int(ob.iterations.numpy()) == 3


def test_optimizer_in_backward_bad_key_changes_nothing():
    # The forward checks keys too, so feed the backward op directly: every table is checked
    # before any is written.
    import embedlab
    a, b = tf.Variable(tf.ones([5, 2])), tf.Variable(tf.ones([4, 2]))
    before = [a.numpy().copy(), b.numpy().copy()]
    splits = [tf.constant([0, 1, 2], tf.int64)] * 2
    keys = [tf.constant([1, 2], tf.int64), tf.constant([3, 4], tf.int64)]  # 4 is outside b's 4 rows
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"EmbedLabFusedLookupGradApply: ids\[1\].*key 4 at position 1 .* outside the table of 4 rows"):
        embedlab.tf_ops().embed_lab_fused_lookup_grad_apply(
            [tf.ones([2, 2])] * 2, splits, keys, [], [a.handle, b.handle], [], 0.1, 0.0,
            tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), tf.constant(1, tf.int64),
            combiners=["sum", "sum"], optimizer="sgd")
    assert np.array_equal(a.numpy(), before[0]) and np.array_equal(b.numpy(), before[1])
    with pytest.raises(ValueError, match="optimizer must be an embedlab.optimizers instance"):
        ops.fused_embedding_lookup([a], [tf.constant([[1]], tf.int64)], "sum", optimizer=keras.optimizers.SGD())
    with pytest.raises(ValueError, match="with an optimizer, every table must be a variable"):
        ops.fused_embedding_lookup([a, tf.ones([4, 2])], [tf.constant([[1]], tf.int64)] * 2, "sum",
                                   optimizer=eopt.SGD(0.1))


def test_optimizer_in_backward_built_for_other_variables_says_so():
    other, table = tf.Variable(tf.ones([3, 2])), tf.Variable(tf.ones([5, 2]))
    opt = eopt.Adam(0.1)
    opt.build([other])
    with tf.GradientTape() as tape:
        out = ops.fused_embedding_lookup([table], [tf.constant([[1, 2]], tf.int64)], "sum", optimizer=opt)
        loss = tf.reduce_sum(out[0])
    with pytest.raises(ValueError, match="has no state for variable .* built for other variables"):
        tape.gradient(loss, [table])
    assert np.array_equal(table.numpy(), np.ones([5, 2]))


# ---- apply_gradients fused with the lookup's backward (graph mode) ----------------------------

def _op_types(fn):
    return {op.type for op in fn.get_concrete_function().graph.get_operations()}


def _fusion_case(rng, kind, ids_format, modify=None, read_grads=False):
    """Three tables (mixed dims and combiners, weights, -1 padding, duplicates, an empty row),
    three steps of tape.gradient + apply_gradients in a tf.function, with fusion on and off.
    modify(grads) may change gradients before they are applied (the same on both sides).
    Returns (fused tables, unfused tables, op types of the fused step, of the unfused step)."""
    shapes = [(int(rng.integers(5, 60)), d) for d in (4, 16, 7)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    comb = ["sum", "mean", "sum"]
    batches = []
    for _ in range(3):
        ids = [ref.random_ids(rng, 6, r) for r, _ in shapes]
        if ids_format == "sparse":
            pairs = [i.sparse(tf, True) for i in ids]
        else:
            pairs = [i.ragged(tf, True) for i in ids]
        r = [tf.constant(rng.standard_normal((6, d)).astype(np.float32)) for _, d in shapes]
        batches.append(([p[0] for p in pairs], [p[1] for p in pairs], r))
    sides = []
    for fuse in (True, False):
        tables = [tf.Variable(x) for x in init]
        opt = _pairs(kind, 0.1)[0]
        opt.fuse_lookup_backward = fuse

        def make(b, tables=tables, opt=opt):
            ids, w, r = batches[b]

            @tf.function
            def step():
                with tf.GradientTape() as tape:
                    outs = ops.fused_embedding_lookup(tables, ids, comb, weights=w)
                    loss = tf.add_n([tf.reduce_sum(o * x) for o, x in zip(outs, r)])
                grads = tape.gradient(loss, tables)
                if modify is not None:
                    grads = modify(grads)
                opt.apply_gradients(zip(grads, tables))
                return [g.values for g in grads] if read_grads else tf.constant(0)
            return step

        fns = [make(b) for b in range(len(batches))]
        for fn in fns:
            fn()
        sides.append((tables, _op_types(fns[0]), opt))
    (ta, types_a, oa), (tb, types_b, ob) = sides
    assert int(oa.iterations.numpy()) == int(ob.iterations.numpy()) == 3
    return ta, tb, types_a, types_b


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam", "ftrl"])
@pytest.mark.parametrize("ids_format", ["ragged", "sparse"])
def test_apply_gradients_fuses_with_the_lookup_backward(rng, kind, ids_format):
    fused, plain, types_fused, types_plain = _fusion_case(rng, kind, ids_format)
    for a, b in zip(fused, plain):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert "EmbedLabFusedLookupGradApply" in types_fused
    assert not any(t.startswith("EmbedLabSparseApply") for t in types_fused)
    assert "EmbedLabFusedLookupGradApply" not in types_plain
    assert any(t.startswith("EmbedLabSparseApply") for t in types_plain)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_apply_gradients_does_not_fuse_a_changed_gradient(rng, kind):
    # Table 1's gradient is scaled (a new IndexedSlices): it must take the unfused path, while
    # tables 0 and 2 still fuse; the tables end up as with fusion off.
    def scale_one(grads):
        g = grads[1]
        return [grads[0], tf.IndexedSlices(g.values * 2.0, g.indices, g.dense_shape), grads[2]]

    fused, plain, types_fused, _ = _fusion_case(rng, kind, "ragged", modify=scale_one)
    for a, b in zip(fused, plain):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert "EmbedLabFusedLookupGradApply" in types_fused
    assert any(t.startswith("EmbedLabSparseApply") for t in types_fused)


def test_apply_gradients_fused_while_the_gradient_is_also_read(rng):
    # The step also returns the gradient rows: the backward op then runs too, and the tables
    # must still be updated exactly once.
    fused, plain, types_fused, _ = _fusion_case(rng, "adagrad", "sparse", read_grads=True)
    for a, b in zip(fused, plain):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert "EmbedLabFusedLookupGradApply" in types_fused


def test_clipped_gradients_are_not_fused(rng):
    table = tf.Variable(rng.standard_normal((20, 4)).astype(np.float32))
    ids = tf.constant([[1, 2], [3, -1]], tf.int64)
    opt = eopt.SGD(0.1, clipnorm=0.5)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(ops.embedding_lookup(table, ids) * 3.0)
        opt.apply_gradients([(tape.gradient(loss, table), table)])

    step()
    types = _op_types(step)
    assert "EmbedLabFusedLookupGradApply" not in types and "EmbedLabSparseApplySGD" in types


@pytest.mark.parametrize("cls", [eopt.SGD, eopt.Adagrad, eopt.Adam, eopt.Ftrl])
def test_optimizer_config_round_trip(cls):
    opt = cls(0.25, fuse_lookup_backward=False)
    again = cls.from_config(opt.get_config())
    assert again.fuse_lookup_backward is False
    assert float(again.learning_rate.numpy()) == pytest.approx(0.25)


def test_optimizer_rejects_options_it_does_not_have():
    with pytest.raises(ValueError, match="no momentum.*momentum=0.9"):
        eopt.SGD(0.1, momentum=0.9)
    with pytest.raises(ValueError, match="no amsgrad"):
        eopt.Adam(0.1, amsgrad=True)


def test_fit_fuses_the_lookup_backward_and_matches_unfused(rng):
    # model.fit traces apply_gradients in its train function: the table's update is built
    # fused (apply_lookup_gradients is called while tracing), the Dense layer's stays Keras',
    # and the weights come out bit for bit as with fusion off.
    rows, dim, n = 40, 6, 256
    keys = rng.integers(-1, rows, (n, 3)).astype(np.int64)
    y = ((keys[:, 0] % 3) == 0).astype(np.float32)
    init_table = rng.standard_normal((rows, dim)).astype(np.float32)
    init_dense = [rng.standard_normal((dim, 1)).astype(np.float32), np.zeros(1, np.float32)]

    class Emb(keras.layers.Layer):
        def build(self, _):
            self.table = self.add_weight(shape=(rows, dim), initializer="zeros")

        def call(self, ids):
            return ops.embedding_lookup(self.table, ids, "mean")

    results = []
    for fuse in (True, False):
        inp = keras.Input((3,), dtype="int64")
        emb, dense = Emb(), keras.layers.Dense(1, activation="sigmoid")
        model = keras.Model(inp, dense(emb(inp)))
        emb.table.assign(init_table)
        dense.set_weights(init_dense)
        opt = eopt.Adagrad(0.05, fuse_lookup_backward=fuse)
        fused_calls = []
        original = opt.apply_lookup_gradients
        opt.apply_lookup_gradients = lambda *a, **k: (fused_calls.append(1), original(*a, **k))[1]
        model.compile(opt, "binary_crossentropy", jit_compile=False)
        model.fit(keys, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
        results.append((emb.table.numpy(), dense.get_weights(), len(fused_calls)))
    (ta, da, calls_a), (tb, db, calls_b) = results
    assert calls_a > 0 and calls_b == 0
    assert ta.tobytes() == tb.tobytes()
    assert all(x.tobytes() == z.tobytes() for x, z in zip(da, db))


# ---- Ftrl ------------------------------------------------------------------------------------

FTRL_CASES = {  # Keras argument names; the cases that change the update's path
    "defaults": dict(),
    "l1_zeroes_some": dict(l1_regularization_strength=3.0),
    "l1_zeroes_all": dict(l1_regularization_strength=1e4),
    "l1_l2_beta": dict(l1_regularization_strength=0.05, l2_regularization_strength=0.3, beta=0.7,
                       initial_accumulator_value=0.2),
    "power_0_shrinkage": dict(learning_rate_power=0.0, l1_regularization_strength=0.01,
                              l2_shrinkage_regularization_strength=0.2),
    "power_-0.3": dict(learning_rate_power=-0.3, l1_regularization_strength=0.02, l2_regularization_strength=0.1,
                       beta=0.5, initial_accumulator_value=0.3),
    "power_-1_all": dict(learning_rate_power=-1.0, l1_regularization_strength=0.05, l2_regularization_strength=0.05,
                         l2_shrinkage_regularization_strength=0.1, beta=1.0, initial_accumulator_value=0.5),
}


def _ftrl_ref_kwargs(kw):
    return dict(lr_power=kw.get("learning_rate_power", -0.5), l1=kw.get("l1_regularization_strength", 0.0),
                l2=kw.get("l2_regularization_strength", 0.0),
                l2_shrinkage=kw.get("l2_shrinkage_regularization_strength", 0.0), beta=kw.get("beta", 0.0))


@pytest.mark.parametrize("case", list(FTRL_CASES))
def test_ftrl_matches_float64_with_duplicates_in_one_fused_op(rng, case):
    # Two tables in one apply_gradients (one EmbedLabSparseApplyFtrl op), indices repeated and
    # unordered, four steps: weights, accumulators and linears follow the float64 reference.
    kw, lr = FTRL_CASES[case], 0.1
    shapes = [(int(rng.integers(10, 80)), d) for d in (4, 9)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    tables = [tf.Variable(x) for x in init]
    opt = eopt.Ftrl(lr, **kw)
    acc0 = kw.get("initial_accumulator_value", 0.1)
    want = [(x.astype(np.float64), np.full(x.shape, acc0), np.zeros(x.shape)) for x in init]
    rk = _ftrl_ref_kwargs(kw)
    touched_rows = [np.zeros(rows, bool) for rows, _ in shapes]
    for _ in range(4):
        grads = []
        for t, (rows, dim) in enumerate(shapes):
            idx = rng.integers(0, rows, size=int(rng.integers(1, rows))).astype(np.int64)
            vals = rng.standard_normal((len(idx), dim)).astype(np.float32)
            grads.append(tf.IndexedSlices(tf.constant(vals), tf.constant(idx), tf.constant([rows, dim], tf.int64)))
            want[t] = ref.np_ftrl(*want[t], idx, vals, lr, **rk)
            touched_rows[t][idx] = True
        opt.apply_gradients(zip(grads, tables))
    for table, (w, n, z) in zip(tables, want):
        acc, lin = (s.numpy() for s in opt.slot_variables(table))
        np.testing.assert_allclose(table.numpy(), w, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(acc, n, rtol=2e-5, atol=2e-6)
        np.testing.assert_allclose(lin, z, rtol=5e-5, atol=2e-5)
    if case == "l1_zeroes_all":  # every row a step touched is exactly 0, the others as they were
        for table, x, touched in zip(tables, init, touched_rows):
            assert not table.numpy()[touched].any()
            assert np.array_equal(table.numpy()[~touched], x[~touched])


def test_ftrl_equals_keras_on_always_touched_rows_and_leaves_the_rest(rng):
    # Keras' dense step recomputes every row; on rows touched at every step (no shrinkage) it is
    # the same update (Keras' float32 pow(x, 0.5) against the kernels' square root: an ulp or two).
    rows, dim, lr = 40, 6, 0.2
    kw = FTRL_CASES["l1_l2_beta"]
    init = rng.standard_normal((rows, dim)).astype(np.float32)
    always = np.arange(0, rows, 4)
    ours, theirs = eopt.Ftrl(lr, **kw), keras.optimizers.Ftrl(lr, **kw)
    a, b = tf.Variable(init), tf.Variable(init)
    touched = np.zeros(rows, bool)
    for _ in range(5):
        g = _unique_grad(rng, rows, dim, frac=0.3, always=always)
        touched[g.indices.numpy()] = True
        ours.apply_gradients([(g, a)])
        theirs.apply_gradients([(tf.convert_to_tensor(g), b)])
    np.testing.assert_allclose(a.numpy()[always], b.numpy()[always], rtol=1e-5, atol=1e-6)
    assert np.array_equal(a.numpy()[~touched], init[~touched])


def test_ftrl_bad_hyperparameters_are_named():
    for kw, name in [(dict(learning_rate_power=0.5), "learning_rate_power"),
                     (dict(l1_regularization_strength=-1.0), "l1_regularization_strength"),
                     (dict(l2_regularization_strength=-1.0), "l2_regularization_strength"),
                     (dict(l2_shrinkage_regularization_strength=-0.1), "l2_shrinkage_regularization_strength"),
                     (dict(initial_accumulator_value=-0.1), "initial_accumulator_value"),
                     (dict(beta=-1.0), "beta"),
                     (dict(l1_regularization_strength=float("nan")), "l1_regularization_strength"),
                     (dict(learning_rate=0.0), "learning_rate")]:
        with pytest.raises(ValueError, match=name):
            eopt.Ftrl(**kw)


def test_ftrl_ops_refuse_bad_hyperparameters_and_change_nothing(rng):
    import embedlab
    table = tf.Variable(rng.standard_normal((5, 2)).astype(np.float32))
    acc, lin = tf.Variable(tf.fill([5, 2], 0.1)), tf.Variable(tf.zeros([5, 2]))
    before = [v.numpy().copy() for v in (table, acc, lin)]
    idx, vals = tf.constant([1, 3], tf.int64), tf.ones([2, 2])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="EmbedLabSparseApplyFtrl: l1_regularization_strength must be a finite value >= 0, got -1"):
        embedlab.tf_ops().embed_lab_sparse_apply_ftrl([table.handle], [acc.handle], [lin.handle], [idx], [vals],
                                                      0.1, l1=-1.0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="EmbedLabSparseApplyFtrl: learning_rate must be a finite value > 0, got 0"):
        embedlab.tf_ops().embed_lab_sparse_apply_ftrl([table.handle], [acc.handle], [lin.handle], [idx], [vals], 0.0)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="EmbedLabFusedLookupGradApply: learning_rate_power must be a finite value <= 0, got 0.5"):
        embedlab.tf_ops().embed_lab_fused_lookup_grad_apply(
            [tf.ones([2, 2])], [tf.constant([0, 1, 2], tf.int64)], [idx], [], [table.handle], [acc.handle, lin.handle],
            0.1, 0.0, tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), tf.constant(1, tf.int64),
            combiners=["sum"], optimizer="ftrl", lr_power=0.5)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="ftrl needs 2 slot variables for 1 tables"):
        embedlab.tf_ops().embed_lab_fused_lookup_grad_apply(
            [tf.ones([2, 2])], [tf.constant([0, 1, 2], tf.int64)], [idx], [], [table.handle], [acc.handle],
            0.1, 0.0, tf.constant(0.0, tf.float64), tf.constant(0.0, tf.float64), tf.constant(1, tf.int64),
            combiners=["sum"], optimizer="ftrl")
    for v, b in zip((table, acc, lin), before):
        assert np.array_equal(v.numpy(), b)
