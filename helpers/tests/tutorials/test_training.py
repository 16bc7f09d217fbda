"""embedlab.tutorials.training: the optimizer step that notebook 01 times against the table size."""
from __future__ import annotations

import logging

import keras
import numpy as np
import pytest

from embedlab import optimizers as eopt
from embedlab.tutorials.training import (WARMUP_STEPS, sparse_update_ms, sparse_update_step, train_steps,
                                        train_steps_interleaved)


@pytest.mark.parametrize("make", [lambda: eopt.Adam(1e-2), lambda: keras.optimizers.Adam(1e-2)], ids=["embedlab", "keras"])
def test_sparse_update_step_applies_the_gradient_rows(make):
    step = sparse_update_step(make, rows=500, dim=3, touched=40, seed=3)       # traced and warmed up
    before = step.table.numpy()
    touched = np.zeros(500, bool)
    touched[step.touched_rows.numpy()] = True
    assert touched.sum() == 40
    assert int(step().numpy()) == WARMUP_STEPS + 1                             # the optimizer's step counter
    after = step.table.numpy()
    assert (after[touched] != before[touched]).all()
    # Every step has the same gradient rows, so the other rows' moments stay 0 and they stay put
    # (Keras' Adam still decays and rewrites them: that is the cost the notebook times).
    assert np.array_equal(after[~touched], before[~touched])


def test_building_several_steps_does_not_warn_of_retracing():
    seen = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    tf_logger = logging.getLogger("tensorflow")
    tf_logger.addHandler(handler)
    try:
        for rows in (100, 200, 300, 400, 500, 600, 700):
            sparse_update_step(lambda: eopt.Adam(1e-3), rows=rows, dim=2, touched=50)
    finally:
        tf_logger.removeHandler(handler)
    assert not [m for m in seen if "retracing" in m], seen


def test_sparse_update_ms_and_bad_sizes():
    assert sparse_update_ms(lambda: eopt.Adam(1e-3), rows=1000, dim=4, touched=100, repeats=3) > 0
    with pytest.raises(ValueError, match="touched"):
        sparse_update_step(lambda: eopt.Adam(1e-3), rows=10, dim=4, touched=11)
    with pytest.raises(ValueError, match="touched"):
        sparse_update_step(lambda: eopt.Adam(1e-3), rows=10, dim=4, touched=0)


def test_interleaved_training_is_each_model_trained_alone():
    rng = np.random.default_rng()
    x, y = {"f": rng.standard_normal((96, 4)).astype(np.float32)}, rng.integers(0, 2, 96).astype(np.float32)

    def make(seed):
        inp = keras.Input((4,), name="f")
        m = keras.Model({"f": inp}, keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed))(inp))
        m.compile(keras.optimizers.SGD(0.1), "mse")
        return m

    both = train_steps_interleaved({"a": make(1), "b": make(2)}, x, y, batch_size=16, steps=8, seed=5)
    alone = train_steps(make(2), x, y, batch_size=16, steps=8, seed=5)
    assert both["b"]["loss"] == alone["loss"] and both["a"]["loss"] != both["b"]["loss"]
    assert all(len(r["seconds"]) == 8 and r["examples_per_second"] > 0 for r in both.values())
    with pytest.raises(ValueError, match="batch_size"):
        train_steps_interleaved({"a": make(1)}, x, y, batch_size=200, steps=1)
    with pytest.raises(ValueError, match="empty"):
        train_steps_interleaved({}, x, y, batch_size=16, steps=1)
