"""Notebook 04's models: the DeepFM of `embedlab.tutorials.sok_demo` trains to the same bits on 1 worker
(splits=2) and on 2 workers, the check that says so rejects a single wrong row, and the guide's
DemoModel learns its toy task."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from embedlab.data import criteo
from embedlab.tutorials import sok_demo as demo

STEPS, GLOBAL_BATCH, VOCAB, DIM = 12, 256, 1_000, 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, run_seed):
    """One DeepFM training on 2 workers (launched, profiled, dumped) and the same on 1 worker
    with splits=2, on fresh Criteo-format rows."""
    seed = run_seed
    d = tmp_path_factory.mktemp("deepfm")
    rows = criteo.generate(d / "rows.tsv", rows=STEPS * GLOBAL_BATCH + 100, seed=seed, progress=False)
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "400", "-m", "embedlab.tutorials.sok_demo",
           "--data", str(rows), "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--vocab", str(VOCAB),
           "--dim", str(DIM), "--out", str(d / "two.json"), "--table-out", str(d / "two_table0.npy"),
           "--dump", str(d / "dump"), "--profile"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=460)
    assert p.returncode == 0, f"2-worker job failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    two = json.loads((d / "two.json").read_text())
    two["table0"] = np.load(d / "two_table0.npy")
    one = demo.train(demo.load_criteo(rows), STEPS, GLOBAL_BATCH, VOCAB, DIM, splits=2)
    return one, two, d, p


def test_one_worker_in_two_slices_equals_two_workers_to_the_bit(runs):
    one, two, _, _ = runs
    demo.assert_same_training(one, two)
    assert len(one["losses"]) == STEPS and one["table0"].shape == (VOCAB, DIM)
    assert np.isfinite(one["losses"]).all() and np.abs(one["table0"]).sum() > 0


@pytest.mark.parametrize("ulps", [1, 1000])
def test_the_check_rejects_one_wrong_row(runs, ulps, rng):
    one, two, _, _ = runs
    row = int(rng.integers(VOCAB))
    bad = dict(two, table0=two["table0"].copy())
    for _ in range(ulps):
        bad["table0"][row] = np.nextafter(bad["table0"][row], np.float32(np.inf))
    with pytest.raises(AssertionError, match=f"first table differs in {DIM} of {VOCAB * DIM} elements, first at row "
                                             f"{row} column 0"):
        demo.assert_same_training(one, bad)


def test_the_check_rejects_one_wrong_loss(runs):
    one, two, _, _ = runs
    bad = dict(two, losses=list(two["losses"]))
    bad["losses"][5] = float(np.nextafter(np.float32(bad["losses"][5]), np.float32(0)))
    with pytest.raises(AssertionError, match="losses differ at 1 of 12 steps, first at step 5"):
        demo.assert_same_training(one, bad)


def test_dump_of_two_workers_loads_exactly(runs):
    import embedlab.optimizers as eopt
    import embedlab.sok as sok
    one, two, d, _ = runs
    t0 = sok.Variable(np.zeros((VOCAB, DIM), np.float32), name="slot0")
    t1 = sok.Variable(np.zeros((VOCAB, DIM), np.float32), name="slot1")
    opt = sok.OptimizerWrapper(eopt.Adagrad(learning_rate=0.05))
    sok.load(d / "dump", [t0, t1], opt)
    np.testing.assert_array_equal(t0.numpy(), two["table0"])
    np.testing.assert_array_equal(t0.numpy(), one["table0"])
    slots = {k: v.numpy() for k, v in opt.slots(t0).items()}
    assert slots.keys() == one["table0_slots"].keys() == {"accumulator"}
    np.testing.assert_array_equal(slots["accumulator"], one["table0_slots"]["accumulator"])


def test_profile_and_quiet_workers(runs):
    _, two, _, p = runs
    parts = two["breakdown_ms"]
    assert set(parts) == {"lookup", "exchange", "dense", "embedding update", "dense update", "step overhead", "step"}
    assert all(v >= 0 for v in parts.values()) and parts["step"] > 0 and two["input_ms"] >= 0
    # no TensorFlow start-up banner, no AutoGraph or retracing warnings from the workers
    for noise in ("oneDNN", "absl::InitializeLog", "AutoGraph", "retracing"):
        assert noise not in p.stderr, p.stderr[-3000:]


def test_bad_splits_are_refused():
    data = (np.zeros((64, 26), np.int64), np.zeros((64, 13), np.float32), np.zeros((64, 1), np.float32))
    with pytest.raises(ValueError, match="splits=3 must be >= 1 and divide the local batch 32"):
        demo.train(data, 1, 32, splits=3)
    with pytest.raises(ValueError, match="64 rows are fewer than one global batch \\(128\\)"):
        demo.train(data, 1, 128)


def test_guide_demo_model_learns_its_toy_task(run_seed):
    import embedlab
    tf = embedlab.import_tensorflow()
    import embedlab.sok as sok
    from embedlab.tutorials.sok_guide import DemoModel, guide_batches

    batches = list(guide_batches(256, 40, seed=run_seed))
    inputs, labels = batches[0]
    assert inputs.shape == (256, 10, 5) and labels.shape == (256, 1)
    np.testing.assert_array_equal(labels[:, 0], inputs[:, 0, 0] % 2 == 0)
    sok.Init(global_batch_size=256)
    model = DemoModel(max_vocabulary_size_per_gpu=1024, slot_num=10, nnz_per_slot=5, embedding_vector_size=16,
                      num_of_dense_layers=2)
    emb_opt, dense_opt = tf.keras.optimizers.Adam(learning_rate=0.1), tf.keras.optimizers.Adam(learning_rate=1e-3)
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        emb_var, other_var = sok.split_embedding_variable_from_others(model.trainable_variables)
        grads, emb_grads = tape.gradient(loss, [other_var, emb_var])
        with sok.OptimizerScope(emb_var):
            emb_opt.apply_gradients(zip(emb_grads, emb_var))
        dense_opt.apply_gradients(zip(grads, other_var))
        return loss

    losses = [float(step(tf.constant(x), tf.constant(y))) for x, y in batches]
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
