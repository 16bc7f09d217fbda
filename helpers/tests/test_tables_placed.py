"""The other large CPU tables EmbedLab creates for its lookups and optimizers start 2 MiB-aligned
on huge pages (`embedlab.tables`) and stay there through training and checkpoints, with the
same values: the EmbedLab optimizers' state (Adam's moments, Adagrad's accumulators)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from embedlab import tables  # noqa: E402
from embedlab import optimizers as eopt  # noqa: E402

A = tables.ALIGNMENT
ROWS, DIM = 1 << 20, 8      # 32 MiB: the smallest table (and state) placed


def _placed(v) -> bool:
    return tables.address(v) % A == 0


# The same training in this process and in one with EMBEDLAB_ALIGNED_TABLES=0: fused steps in a
# tf.function (Adam, Adagrad), then an eager unfused apply_gradients; prints a digest of the
# tables and their state.
_TRAIN = textwrap.dedent("""
    import hashlib, numpy as np, tensorflow as tf
    from embedlab import tables, ops, optimizers as eopt
    ROWS, DIM = 1 << 20, 8

    def train():
        r = np.random.default_rng(7)
        ids = [tf.RaggedTensor.from_row_lengths(r.integers(0, ROWS, 300), [1, 2, 3] * 50) for _ in range(3)]
        out, placed = [], []
        for opt in (eopt.Adam(0.01), eopt.Adagrad(0.05)):
            t = tf.Variable(tables.aligned(r.uniform(-1, 1, (ROWS, DIM)).astype(np.float32)))
            opt.build([t])

            @tf.function
            def step(i):
                with tf.GradientTape() as tape:
                    loss = tf.reduce_sum(ops.fused_embedding_lookup([t], [i], "sum")[0] ** 2)
                opt.apply_gradients(zip(tape.gradient(loss, [t]), [t]))

            for i in ids[:2]:
                step(i)
            with tf.GradientTape() as tape:          # eager: IndexedSlices, the sparse update op
                loss = tf.reduce_sum(ops.fused_embedding_lookup([t], [ids[2]], "sum")[0])
            opt.apply_gradients(zip(tape.gradient(loss, [t]), [t]))
            slots = opt.slot_variables(t)
            out += [t] + slots
            placed += [tables.address(s) % tables.ALIGNMENT == 0 for s in slots]
        h = hashlib.sha256()
        for v in out:
            h.update(v.numpy().tobytes())
        return h.hexdigest(), placed
""")


def test_optimizer_state_is_placed_and_trains_the_same_bits():
    ns = {}
    exec(_TRAIN, ns)
    digest, placed = ns["train"]()
    assert placed == [True, True, True]          # Adam m, v; Adagrad accumulator
    code = _TRAIN + "d, p = train()\nprint(d, any(p))\n"
    env = dict(os.environ, EMBEDLAB_ALIGNED_TABLES="0", TF_CPP_MIN_LOG_LEVEL="3")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    other, any_placed = r.stdout.split()[-2:]
    assert any_placed == "False"                 # the off switch leaves the state in TensorFlow's buffers
    assert other == digest


def test_optimizer_state_keeps_its_initial_values():
    opt = eopt.Adam(0.01)
    small = tf.Variable(tf.zeros([1000, 8]))                 # under 32 MiB: Keras's state as it is
    opt.build([small])
    m, v = opt.slot_variables(small)
    assert m.shape == v.shape == (1000, 8) and not m.numpy().any() and not v.numpy().any()
    ada = eopt.Adagrad(0.1, initial_accumulator_value=0.25)
    big = tf.Variable(tables.aligned(tf.zeros([ROWS, DIM])))
    ada.build([big])
    (acc,) = ada.slot_variables(big)
    assert _placed(acc) and float(tf.reduce_min(acc)) == float(tf.reduce_max(acc)) == 0.25


def test_optimizer_state_stays_placed_through_keras_save_and_load(tmp_path):
    def model():
        inp = keras.Input(shape=(), dtype="int64")
        emb = keras.layers.Embedding(ROWS, DIM, embeddings_initializer=tables.initializer(
            keras.initializers.RandomUniform(-0.05, 0.05, seed=3)))
        return keras.Model(inp, keras.ops.sum(emb(inp), axis=-1))

    m = model()
    m.compile(optimizer=eopt.Adam(0.01), loss="mse")
    x = np.random.default_rng(1).integers(0, ROWS, 256)
    m.fit(x, np.ones(256, np.float32), batch_size=64, epochs=1, verbose=0)
    slots = m.optimizer.slot_variables(m.trainable_variables[0])
    assert all(_placed(s) for s in slots)
    path = str(tmp_path / "m.keras")
    m.save(path)
    m2 = model()
    m2.compile(optimizer=eopt.Adam(0.01), loss="mse")
    m2.optimizer.build(m2.trainable_variables)
    m2.load_weights(path)
    slots2 = m2.optimizer.slot_variables(m2.trainable_variables[0])
    assert all(_placed(s) for s in slots2)
    for a, b in zip(slots, slots2):
        assert a.numpy().tobytes() == b.numpy().tobytes()
    assert int(m2.optimizer.iterations) == int(m.optimizer.iterations) == 4

