"""embedlab.plugin.EmbeddingLayer: forward/backward against oracles, the HugeCTR accuracy
recipe, its own optimizer in model.fit, save/restore, bad input, and (in a subprocess with 4
logical CPU devices) bitwise identity across device counts and embedding types.

Splitting the CPU into logical devices must happen before TensorFlow starts, so the
multi-device tests (names containing "multidev") run in a child pytest process started by
`test_multidev_suite`, with EMBEDLAB_TEST_LOGICAL_CPUS=4.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

_NDEV = int(os.environ.get("EMBEDLAB_TEST_LOGICAL_CPUS", "0"))
if _NDEV:
    import embedlab.plugin as _p  # noqa: E402
    _p.split_cpu(_NDEV)

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import reference as ref  # noqa: E402
from embedlab import _io  # noqa: E402
from embedlab import optimizers as eopt  # noqa: E402
from embedlab import plugin  # noqa: E402

# The folder this process imported embedlab from (the source tree in development, site-packages
# after `pip install ./helpers`): child processes must load the same, built, package.
import embedlab as _embedlab  # noqa: E402
EMBEDLAB_HOME = Path(_embedlab.__file__).resolve().parents[1]
multidev = pytest.mark.skipif(_NDEV < 4, reason="needs 4 logical CPU devices: runs in the child process "
                                                "started by test_multidev_suite")


@pytest.fixture(autouse=True)
def _one_device():
    plugin.init(["/CPU:0"], seed=0)
    yield


def _keys(rng, batch, slots, nnz, vocab, pad=0.3, empty_slot=None):
    k = rng.integers(0, vocab, (batch, slots, nnz)).astype(np.int64)
    k[rng.random(k.shape) < pad] = -1
    if nnz >= 2:
        k[:, :, 1] = np.where(rng.random((batch, slots)) < 0.3, k[:, :, 0], k[:, :, 1])  # duplicates
    if empty_slot is not None:
        k[:, empty_slot] = -1
    return k


def _oracle(table, keys, combiner):
    b, s, m = keys.shape
    flat = keys.reshape(-1)
    splits = np.arange(b * s + 1) * m
    return ref.np_lookup(table, splits, flat, None, combiner).reshape(b, s, -1)


def _coo3(keys):
    idx = np.argwhere(keys >= 0)
    return tf.SparseTensor(idx, keys[keys >= 0], keys.shape)


def _coo2(keys):
    b, s, m = keys.shape
    k2 = keys.reshape(b * s, m)
    idx = np.argwhere(k2 >= 0)
    return tf.SparseTensor(idx, k2[k2 >= 0], k2.shape)


def _csr(keys):
    b, s, m = keys.shape
    k2 = keys.reshape(b * s, m)
    counts = (k2 >= 0).sum(1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return (tf.constant(offsets), tf.constant(k2[k2 >= 0]))


# ---- forward / input forms ----------------------------------------------------------------

@pytest.mark.parametrize("form", ["dense", "coo3", "coo2", "csr"])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_forward_all_input_forms(rng, form, combiner):
    V, D, S, M, B = 60, 5, 4, 3, int(rng.integers(1, 9))
    table = rng.standard_normal((V, D)).astype(np.float32)
    emb = plugin.EmbeddingLayer(V, D, S, M, combiner=combiner, initializer=table)
    keys = _keys(rng, B, S, M, V, empty_slot=int(rng.integers(S)))
    x = {"dense": lambda: tf.constant(keys), "coo3": lambda: _coo3(keys), "coo2": lambda: _coo2(keys),
         "csr": lambda: _csr(keys)}[form]()
    out = emb(x).numpy()
    assert out.shape == (B, S, D)
    np.testing.assert_allclose(out, _oracle(table, keys, combiner), rtol=1e-5, atol=1e-5)
    dense = emb(tf.constant(keys)).numpy()
    assert np.array_equal(out, dense)          # every form pools the same keys in the same order


def test_hugectr_accuracy_recipe():
    # HugeCTR's plugin check: 8x4 table valued 1..32, 3 slots, max_nnz 2, batch 4, one slot all -1;
    # forward vs tf.nn.embedding_lookup_sparse, then Adam(0.1, 0.9, 0.99, 1e-3) twice.
    init = np.arange(1, 33, dtype=np.float32).reshape(8, 4)
    keys = np.array([[[0, 1], [-1, -1], [2, -1]], [[3, 4], [-1, -1], [5, 6]],
                     [[7, -1], [-1, -1], [0, 2]], [[1, 1], [-1, -1], [4, -1]]], np.int64)
    emb = plugin.EmbeddingLayer(8, 4, 3, 2, combiner="sum", initializer=init,
                                optimizer=eopt.Adam(0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-3))
    ref_table = tf.Variable(init)
    ref_opt = keras.optimizers.Adam(0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
    sp = _coo2(keys)

    def ref_forward():
        # One pooled row per (sample, slot) row of the [12, 2] SparseTensor; empty rows are zeros.
        pooled = tf.nn.embedding_lookup_sparse(ref_table, tf.sparse.reorder(sp), None, combiner="sum")
        return tf.reshape(pooled, [4, 3, 4])

    for step in range(3):
        with tf.GradientTape(persistent=True) as tape:
            ours = emb(tf.constant(keys))
            theirs = ref_forward()
            l1, l2 = tf.reduce_sum(ours * ours), tf.reduce_sum(theirs * theirs)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
        assert not ours.numpy()[:, 1].any()
        if step == 2:
            break
        tape.gradient(l1, emb.trainable_variables)           # runs the layer's own Adam
        g = tape.gradient(l2, ref_table)
        ref_opt.apply_gradients([(g, ref_table)])
        np.testing.assert_allclose(emb.get_table(), ref_table.numpy(), rtol=1e-6, atol=1e-6)


def test_initializers_are_per_key_and_seeded():
    a = plugin.EmbeddingLayer(100, 6, 2, 1, seed=3).get_table()
    b = plugin.EmbeddingLayer(100, 6, 2, 1, seed=3).get_table()
    c = plugin.EmbeddingLayer(100, 6, 2, 1, seed=4).get_table()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.abs(a).max() <= 0.05 and a.std() > 0.02
    assert np.array_equal(a[[5, 77]], plugin.initial_values(np.array([5, 77]), 6, seed=3))
    assert (plugin.EmbeddingLayer(5, 2, 1, 1, initializer=0.25).get_table() == 0.25).all()
    with pytest.raises(ValueError, match="initializer"):
        plugin.EmbeddingLayer(5, 2, 1, 1, initializer=np.ones((4, 2)))


def test_init_is_callable_again_and_checks_devices():
    cfg1 = plugin.init(seed=1)
    cfg2 = plugin.init(["/CPU:0"], seed=2)
    assert cfg1.devices == cfg2.devices and cfg2.seed == 2
    assert plugin.EmbeddingLayer(10, 2, 1, 1).seed == 2
    with pytest.raises(ValueError, match="CPU:97"):
        plugin.init(["/CPU:97"])
    with pytest.raises(ValueError, match="seed"):
        plugin.init(seed=-1)


def test_split_cpu_after_start_says_what_to_do():
    tf.constant(1.0)                                  # TensorFlow has started in this process
    have = len(tf.config.list_logical_devices("CPU"))
    assert plugin.split_cpu(have) == [d.name for d in tf.config.list_logical_devices("CPU")]  # same n: no-op
    with pytest.raises(RuntimeError, match="before any TensorFlow op"):
        plugin.split_cpu(have + 3)


# ---- training ---------------------------------------------------------------------------

@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_gradient_is_indexed_slices_and_matches_oracle(rng, combiner):
    V, D, S, M, B = 40, 3, 3, 2, 6
    table = rng.standard_normal((V, D)).astype(np.float32)
    emb = plugin.EmbeddingLayer(V, D, S, M, combiner=combiner, initializer=table)
    keys = _keys(rng, B, S, M, V)
    dy = rng.standard_normal((B, S, D)).astype(np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(emb(tf.constant(keys)) * dy)
    (g,) = tape.gradient(loss, emb.trainable_variables)
    assert isinstance(g, tf.IndexedSlices)
    want = ref.np_lookup_grad(dy.reshape(B * S, D), np.arange(B * S + 1) * M, keys.reshape(-1), V, None, combiner)
    dense = tf.convert_to_tensor(g).numpy()
    np.testing.assert_allclose(dense, want, rtol=1e-5, atol=1e-6)


def test_own_optimizer_equals_external_optimizer(rng):
    V, D, S, M, B = 50, 4, 3, 2, 8
    keys = [_keys(rng, B, S, M, V) for _ in range(3)]
    own = plugin.EmbeddingLayer(V, D, S, M, optimizer=eopt.Adam(0.05))
    ext = plugin.EmbeddingLayer(V, D, S, M)
    ext_opt = eopt.Adam(0.05)
    assert [w.name for w in own.trainable_weights] == ["bp_trigger"]
    for k in keys:
        with tf.GradientTape() as t1:
            l1 = tf.reduce_sum(tf.square(own(tf.constant(k))))
        assert float(t1.gradient(l1, own.bp_trigger)) == 0.0
        with tf.GradientTape() as t2:
            l2 = tf.reduce_sum(tf.square(ext(tf.constant(k))))
        ext_opt.apply_gradients(zip(t2.gradient(l2, ext.trainable_variables), ext.trainable_variables))
    assert np.array_equal(own.get_table(), ext.get_table())
    assert int(own.optimizer.iterations) == 3


def _tiny_model(emb, S, M):
    inp = keras.Input((S, M), dtype="int64")
    h = keras.layers.Flatten()(emb(inp))
    return keras.Model(inp, keras.layers.Dense(1, activation="sigmoid")(h))


@pytest.mark.parametrize("own", [False, True])
def test_model_fit_trains(rng, own):
    V, D, S, M, n = 200, 4, 3, 2, 1024
    keys = _keys(rng, n, S, M, V, pad=0.2)
    y = ((np.where(keys[:, 0, 0] >= 0, keys[:, 0, 0], 0) % 2) == 0).astype(np.float32)
    emb = plugin.EmbeddingLayer(V, D, S, M, optimizer=eopt.Adam(0.05) if own else None)
    model = _tiny_model(emb, S, M)
    model.compile(eopt.Adam(0.05), "binary_crossentropy")
    before = emb.get_table()
    h = model.fit(keys, y, batch_size=128, epochs=5, verbose=0)
    assert h.history["loss"][-1] < 0.85 * h.history["loss"][0]
    after = emb.get_table()
    used = np.unique(keys[keys >= 0])
    unused = np.setdiff1d(np.arange(V), used)
    assert not np.array_equal(before[used], after[used])
    assert np.array_equal(before[unused], after[unused])
    if own:
        assert float(emb.bp_trigger.numpy()) == 0.0
        assert int(emb.optimizer.iterations) == 5 * (n // 128)


def test_large_table_stays_aligned_through_fit_save_and_restore(rng, tmp_path):
    """A table of 32 MiB and more starts 2 MiB-aligned (embedlab.tables) with the same initial
    values, and stays so through model.fit with the layer's optimizer, restore and set_table."""
    from embedlab import tables as _tables
    V, D, S, M = 1 << 20, 8, 2, 2
    emb = plugin.EmbeddingLayer(V, D, S, M, optimizer=eopt.SGD(0.1), seed=3)
    (table,) = emb.tables
    assert _tables.address(table) % _tables.ALIGNMENT == 0
    assert table.numpy().tobytes() == plugin.initial_values(np.arange(V), D, 3).tobytes()
    keys = _keys(rng, 256, S, M, V)
    model = _tiny_model(emb, S, M)
    model.compile(eopt.Adam(0.05), "binary_crossentropy")
    model.fit(keys, (keys[:, 0, 0] % 2).astype(np.float32), batch_size=64, epochs=1, verbose=0)
    assert _tables.address(table) % _tables.ALIGNMENT == 0
    trained = emb.get_table()
    path = emb.save(tmp_path / "emb.bin")
    emb.set_table(np.zeros((V, D), np.float32))
    emb.restore(path)
    assert _tables.address(table) % _tables.ALIGNMENT == 0
    assert emb.get_table().tobytes() == trained.tobytes()


def test_tf_function_varying_batch(rng):
    V, D, S, M = 30, 2, 2, 3
    table = rng.standard_normal((V, D)).astype(np.float32)
    emb = plugin.EmbeddingLayer(V, D, S, M, combiner="mean", initializer=table)
    f = tf.function(emb, reduce_retracing=True)
    for b in (1, 5, 3, 12):
        k = _keys(rng, b, S, M, V)
        np.testing.assert_allclose(f(tf.constant(k)).numpy(), _oracle(table, k, "mean"), rtol=1e-5, atol=1e-6)


# ---- save / restore -----------------------------------------------------------------------

def test_save_restore_round_trip_and_atomic(rng, tmp_path, monkeypatch):
    V, D = 70, 3
    a = plugin.EmbeddingLayer(V, D, 2, 1, seed=5)
    a.set_table(rng.standard_normal((V, D)).astype(np.float32))
    path = a.save(tmp_path / "ckpt" / "emb.bin")
    b = plugin.EmbeddingLayer(V, D, 2, 1, seed=9)
    b.restore(path)
    assert np.array_equal(a.get_table(), b.get_table())
    assert sorted(os.listdir(path.parent)) == ["emb.bin"]        # no temp file left behind
    # A crash while writing leaves the previous file intact.
    old = path.read_bytes()
    a.set_table(np.zeros((V, D), np.float32))

    def boom(*_a, **_k):
        raise OSError("simulated crash")

    monkeypatch.setattr(_io.os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        a.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == old and sorted(os.listdir(path.parent)) == ["emb.bin"]


@pytest.mark.parametrize("damage", ["flip_payload", "flip_header", "truncate", "magic", "shape", "missing"])
def test_restore_rejects_bad_files_and_changes_nothing(rng, tmp_path, damage):
    V, D = 20, 2
    src = plugin.EmbeddingLayer(V, D, 1, 1, seed=1)
    path = src.save(tmp_path / "emb.bin")
    data = bytearray(path.read_bytes())
    if damage == "flip_payload":
        data[-5] ^= 0x10
    elif damage == "flip_header":
        data[20] ^= 0x01
    elif damage == "truncate":
        data = data[:-8]
    elif damage == "magic":
        data[:8] = b"NOTEMBED"
    if damage == "shape":
        path = plugin.EmbeddingLayer(V + 1, D, 1, 1).save(tmp_path / "other.bin")
    elif damage == "missing":
        path = tmp_path / "nope.bin"
    else:
        path.write_bytes(bytes(data))
    dst = plugin.EmbeddingLayer(V, D, 1, 1, seed=2)
    before = dst.get_table()
    with pytest.raises(plugin.CheckpointError) as e:
        dst.restore(path)
    assert str(path) in str(e.value) and dst.name in str(e.value)
    assert np.array_equal(dst.get_table(), before)


# ---- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["key_too_big", "key_below_minus_one", "float_keys", "rank2", "slots",
                                  "nnz", "csr_len", "coo_shape", "ssa_range"])
def test_bad_input_names_layer_argument_value(case):
    V, S, M = 10, 3, 2
    emb = plugin.EmbeddingLayer(V, 2, S, M, name="my_emb", optimizer=eopt.SGD(0.1),
                                slot_size_array=[3, 3, 4] if case == "ssa_range" else None)
    before = emb.get_table()
    good = np.zeros((2, S, M), np.int64)
    x, value = {
        "key_too_big": (np.where(np.arange(12).reshape(2, S, M) == 7, 10, 0), "10"),
        "key_below_minus_one": (np.where(np.arange(12).reshape(2, S, M) == 3, -3, 0), "-3"),
        "float_keys": (good.astype(np.float32), "float32"),
        "rank2": (good.reshape(2, -1), "(2, 6)"),
        "slots": (np.zeros((2, S + 1, M), np.int64), "4"),
        "nnz": (np.zeros((2, S, M + 1), np.int64), "3"),
        "csr_len": ((np.array([0, 1, 2, 3, 4], np.int64), np.zeros(4, np.int64)), "4"),
        "coo_shape": (tf.SparseTensor([[0, 0, 0]], np.array([1], np.int64), [1, S + 2, M]), "5"),
        "ssa_range": (np.where(np.arange(12).reshape(2, S, M) == 2, 0,
                               np.broadcast_to(np.array([0, 3, 6])[None, :, None], (2, S, M))), "slot 1"),
    }[case]
    if isinstance(x, np.ndarray):
        x = tf.constant(x)
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError)) as e:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(x))
        tape.gradient(loss, emb.trainable_variables)
    msg = str(e.value)
    assert "my_emb" in msg and value in msg, msg
    assert np.array_equal(emb.get_table(), before)


@pytest.mark.parametrize("bad", [12, -5])
@pytest.mark.parametrize("ssa", [None, [4, 6]])
def test_bad_key_in_graph_mode_is_invalid_argument(bad, ssa):
    emb = plugin.EmbeddingLayer(10, 2, 2, 2, name="g_emb", slot_size_array=ssa, optimizer=eopt.SGD(0.1))
    before = emb.get_table()

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(emb(x))
        return tape.gradient(loss, emb.trainable_variables)

    with pytest.raises(tf.errors.InvalidArgumentError, match="g_emb") as e:
        step(tf.constant([[[1, -1], [4, bad]]], tf.int64))
    assert str(bad) in str(e.value)
    assert np.array_equal(emb.get_table(), before)


@pytest.mark.parametrize("offsets,values", [([0, 1, 2], [1, 2]),            # 2 rows for 3 slots
                                            ([0, 2, 1, 3], [1, 2, 3]),      # decreasing
                                            ([0, 3, 3, 3], [1, 2, 3]),      # 3 keys > max_nnz 2
                                            ([0, 1, 1, 5], [1, 2, 3])])     # ends past len(values)
def test_bad_csr_in_graph_mode(offsets, values):
    emb = plugin.EmbeddingLayer(10, 2, 3, 2, name="csr_emb")
    f = tf.function(lambda o, v: emb((o, v)))
    # A length that static shapes already rule out fails while tracing (ValueError); the rest
    # when the graph runs (InvalidArgumentError).
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match="csr_emb.*row_offsets"):
        f(tf.constant(offsets, tf.int64), tf.constant(values, tf.int64))
    g = tf.function(lambda o, v: emb((o, v)), input_signature=[tf.TensorSpec([None], tf.int64)] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="csr_emb.*row_offsets"):
        g(tf.constant(offsets, tf.int64), tf.constant(values, tf.int64))
    with pytest.raises(ValueError, match="csr_emb.*row_offsets"):      # eager: the specific check
        emb((tf.constant(offsets, tf.int64), tf.constant(values, tf.int64)))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="combiner"):
        plugin.EmbeddingLayer(10, 2, 1, 1, combiner="max")
    with pytest.raises(ValueError, match="embedding_type"):
        plugin.EmbeddingLayer(10, 2, 1, 1, embedding_type="mirrored")
    with pytest.raises(ValueError, match="slot_size_array"):
        plugin.EmbeddingLayer(10, 2, 2, 1, slot_size_array=[3, 3])
    with pytest.raises(ValueError, match="optimizer"):
        plugin.EmbeddingLayer(10, 2, 2, 1, optimizer=keras.optimizers.Adam())
    with pytest.raises(ValueError, match="vocabulary_size"):
        plugin.EmbeddingLayer(0, 2, 2, 1)


# ---- several logical devices (child process) ------------------------------------------------

def test_multidev_suite():
    if _NDEV:
        pytest.skip("this is the child process")
    env = dict(os.environ, EMBEDLAB_TEST_LOGICAL_CPUS="4", TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=str(EMBEDLAB_HOME) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "multidev",
                        str(Path(__file__))], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "1 skipped" in last, r.stdout[-2000:]


def _train(emb, batches, steps=3):
    outs = []
    for k in batches[:steps]:
        with tf.GradientTape() as tape:
            y = emb(tf.constant(k))
            loss = tf.reduce_sum(y * y) + tf.reduce_sum(y)
        tape.gradient(loss, emb.trainable_variables)
        outs.append(y.numpy())
    outs.append(emb(tf.constant(batches[-1])).numpy())
    return outs, emb.get_table()


@multidev
@pytest.mark.parametrize("etype,ssa", [("distributed", False), ("localized", False), ("localized", True),
                                       ("distributed", True)])
@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_multidev_bitwise_identical_over_device_counts(rng, etype, ssa, combiner):
    S, M, D, B = 5, 3, 4, 16
    sizes = [int(x) for x in rng.integers(3, 30, S)]
    V = sum(sizes)
    offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    batches = []
    for _ in range(4):
        local = rng.integers(0, 1 << 30, (B, S, M)) % np.array(sizes)[None, :, None]
        k = np.where(rng.random((B, S, M)) < 0.25, -1, local + offs[None, :, None]).astype(np.int64)
        k[0, 2] = -1                                                   # an all-invalid slot
        batches.append(k)
    results = []
    for n in (1, 2, 4):
        emb = plugin.EmbeddingLayer(V, D, S, M, combiner=combiner, embedding_type=etype,
                                    devices=[f"/CPU:{i}" for i in range(n)], seed=7,
                                    slot_size_array=sizes if ssa else None, optimizer=eopt.Adam(0.05))
        assert [t.value.device.split("/")[-1] for t in emb.tables] == [f"device:CPU:{i}" for i in range(n)]
        results.append(_train(emb, batches))
    np.testing.assert_allclose(results[0][0][0], _oracle(plugin.initial_values(np.arange(V), D, 7), batches[0],
                                                         combiner), rtol=1e-5, atol=1e-6)
    for outs, table in results[1:]:
        for a, b in zip(results[0][0], outs):
            assert np.array_equal(a, b)
        assert np.array_equal(results[0][1], table)


@multidev
@pytest.mark.parametrize("etype", ["distributed", "localized"])
def test_multidev_model_optimizer_trains_shards_identically(rng, etype):
    # optimizer=None: the model's (Keras) optimizer gets one IndexedSlices per device table.
    S, M, D, V, n = 4, 2, 3, 40, 256
    sizes = [10, 10, 10, 10]
    keys = (rng.integers(0, 10, (n, S, M)) + np.arange(0, 40, 10)[None, :, None]).astype(np.int64)
    keys[rng.random(keys.shape) < 0.3] = -1
    y = (rng.random(n) < 0.5).astype(np.float32)
    tables = []
    for ndev in (1, 4):
        keras.utils.set_random_seed(3)
        emb = plugin.EmbeddingLayer(V, D, S, M, embedding_type=etype, slot_size_array=sizes,
                                    devices=[f"/CPU:{i}" for i in range(ndev)])
        model = _tiny_model(emb, S, M)
        model.compile(keras.optimizers.Adagrad(0.1), "binary_crossentropy")
        model.fit(keys, y, batch_size=64, epochs=2, verbose=0, shuffle=False)
        tables.append(emb.get_table())
    assert np.array_equal(tables[0], tables[1])
    assert not np.array_equal(tables[0], plugin.initial_values(np.arange(V), D, 0))


@multidev
def test_multidev_shards_hold_their_keys():
    emb = plugin.EmbeddingLayer(10, 1, 1, 1, devices=["/CPU:0", "/CPU:1", "/CPU:2"],
                                initializer=np.arange(10, dtype=np.float32)[:, None])
    assert [t.numpy()[:, 0].tolist() for t in emb.tables] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    loc = plugin.EmbeddingLayer(10, 1, 3, 1, embedding_type="localized", slot_size_array=[2, 3, 5],
                                devices=["/CPU:0", "/CPU:1"], initializer=np.arange(10, dtype=np.float32)[:, None])
    assert [t.numpy()[:, 0].tolist() for t in loc.tables] == [[0, 1, 5, 6, 7, 8, 9], [2, 3, 4]]


@multidev
def test_multidev_save_restore_across_device_counts(rng, tmp_path):
    V, D, S, M = 60, 3, 3, 2
    a = plugin.EmbeddingLayer(V, D, S, M, devices=[f"/CPU:{i}" for i in range(4)], optimizer=eopt.SGD(0.5))
    keys = _keys(rng, 8, S, M, V)
    _train(a, [keys, keys])
    path = a.save(tmp_path / "a.bin")
    for n, etype in ((1, "distributed"), (2, "localized"), (3, "distributed")):
        b = plugin.EmbeddingLayer(V, D, S, M, devices=[f"/CPU:{i}" for i in range(n)], embedding_type=etype,
                                  slot_size_array=[20, 20, 20] if etype == "localized" else None, seed=99)
        b.restore(path)
        assert np.array_equal(b.get_table(), a.get_table())
        if etype != "localized":
            assert np.array_equal(b(tf.constant(keys)).numpy(), a(tf.constant(keys)).numpy())


@multidev
def test_multidev_localized_without_ssa_refuses_ambiguous_save(tmp_path):
    emb = plugin.EmbeddingLayer(10, 2, 2, 1, embedding_type="localized", devices=["/CPU:0", "/CPU:1"],
                                optimizer=eopt.SGD(0.1))
    with tf.GradientTape() as tape:                                    # key 3 in slots of both devices
        loss = tf.reduce_sum(emb(tf.constant([[[3], [3]]], tf.int64)))
    tape.gradient(loss, emb.trainable_variables)
    with pytest.raises(ValueError, match="key 3"):
        emb.save(tmp_path / "x.bin")
    assert not (tmp_path / "x.bin").exists()
