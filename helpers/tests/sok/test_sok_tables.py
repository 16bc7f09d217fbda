"""embedlab.sok's large CPU tables (a worker's shards, their optimizer state, the first-generation
layers' tables) start 2 MiB-aligned on huge pages (`embedlab.tables`) and stay there through
training steps, sok.dump / sok.load and Saver restores, with the same values."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import embedlab.optimizers as eopt
import embedlab.sok as sok
from embedlab import tables as _tables

ROWS, DIM = 1 << 20, 8      # 32 MiB: the smallest table placed


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


def _placed(v) -> bool:
    return _tables.address(v) % _tables.ALIGNMENT == 0


def _ids(seed):
    r = np.random.default_rng(seed)
    return tf.RaggedTensor.from_row_lengths(r.integers(0, ROWS, 300), [1, 2, 3] * 50)


@pytest.mark.parametrize("make_opt", [lambda: eopt.Adam(0.01), lambda: tf.keras.optimizers.Adagrad(0.05)],
                         ids=["embedlab_adam", "keras_adagrad"])
def test_shards_and_their_state_stay_placed_through_training_dump_and_load(tmp_path, make_opt):
    x = np.random.default_rng(1).uniform(-1, 1, (ROWS, DIM)).astype(np.float32)
    a = sok.Variable(x, name="a")
    init = sok.Variable(tf.keras.initializers.Constant(0.5), shape=[ROWS, DIM], name="i")   # an initializer
    small = sok.Variable(x[:1000], name="s")
    assert _placed(a) and _placed(init) and float(init[7, 3]) == 0.5
    assert a.numpy().tobytes() == x.tobytes()
    opt = sok.OptimizerWrapper(make_opt())

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            out = sok.lookup_sparse([a, small], [ids, tf.RaggedTensor.from_row_lengths(ids.values % 1000,
                                                                                      ids.row_lengths())],
                                    combiners=["sum", "sum"])
            loss = tf.reduce_sum(out[0] ** 2) + tf.reduce_sum(out[1])
        opt.apply_gradients(zip(tape.gradient(loss, [a, small]), [a, small]))

    for s in range(3):
        step(_ids(s))
    slots = list(opt.slots(a).values())
    assert slots and all(_placed(v) for v in [a] + slots)
    sok.dump(tmp_path / "d", [a], opt)
    b = sok.Variable(np.zeros((ROWS, DIM), np.float32), name="a")
    opt_b = sok.OptimizerWrapper(make_opt())
    sok.load(tmp_path / "d", [b], opt_b)
    slots_b = list(opt_b.slots(b).values())
    assert all(_placed(v) for v in [b] + slots_b)
    assert b.numpy().tobytes() == a.numpy().tobytes()
    for s, t in zip(slots, slots_b):
        assert np.asarray(s).tobytes() == np.asarray(t).tobytes()


def test_first_generation_layer_table_is_placed_and_restored_in_place(tmp_path):
    layer = sok.DistributedEmbedding("sum", max_vocabulary_size_per_gpu=ROWS, embedding_vec_size=DIM, slot_num=2,
                                     max_nnz=1, use_hashtable=False)
    v = layer.embedding_variable
    assert _placed(v)
    sp = tf.SparseTensor([[0, 0], [1, 0], [3, 0]], tf.constant([1, 3, ROWS - 1], tf.int64), [4, 1])
    before = layer(sp).numpy()
    sok.Saver().dump_to_file(v, str(tmp_path))
    _tables.assign(v, np.zeros((ROWS, DIM), np.float32))
    sok.Saver().restore_from_file(v, str(tmp_path))
    assert _placed(v)
    np.testing.assert_array_equal(layer(sp).numpy(), before)
