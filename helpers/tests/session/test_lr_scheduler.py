"""get_learning_rate_scheduler / LearningRateScheduler (HugeCTR v2.3's `hugectr` module): the schedule
against its formula, the JSON fields it reads for every optimizer, bad input, and a Session trained
with it the way v2.3's model_prefetch_wdl_1gpu.py does (get_next -> set_learning_rate -> train)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from embedlab.session import (LearningRateScheduler, ModelError, Session, get_learning_rate_scheduler,
                              solver_parser_helper)

from sessionlib import dump, wdl_json, write_lists


def oracle(step, base, warmup, decay_start, decay_steps, power, end):
    """The schedule written from its definition (float64): a linear warm-up to `base` over
    `warmup` steps; then `base` until `decay_start` (0: forever); then a polynomial decay of
    `power` over `decay_steps` steps, never below `end`; then `end`."""
    if step <= warmup:
        return base * step / warmup
    if decay_start == 0 or step <= decay_start:
        return base
    if step <= decay_start + decay_steps:
        return max(base * ((decay_start + decay_steps - step) / decay_steps) ** power, end)
    return end


@pytest.mark.parametrize("trial", range(6))
def test_schedule_follows_the_formula(rng, trial):
    base = float(rng.uniform(1e-4, 2.0))
    warmup = int(rng.integers(1, 40))
    decay_start = 0 if trial == 0 else warmup + int(rng.integers(0, 30))
    decay_steps = int(rng.integers(1, 50))
    power = float(rng.choice([1.0, 2.0, float(rng.uniform(1.0, 4.0))]))
    end = 0.0 if trial < 2 else float(rng.uniform(0, base / 2))
    s = LearningRateScheduler(base, warmup, decay_start, decay_steps, power, end)
    assert s.get_step() == 0 and s.get_lr() == 0.0
    total = warmup + decay_start + decay_steps + 20
    for step in range(1, total + 1):
        lr = s.get_next()
        assert isinstance(lr, float)                       # Session.set_learning_rate takes it as is
        want = oracle(step, base, warmup, decay_start, decay_steps, power, end)
        assert lr == pytest.approx(want, rel=2e-6, abs=1e-12), (step, lr, want)
        assert s.get_step() == step and s.get_lr() == lr
    if decay_start:
        assert s.get_lr() == pytest.approx(end, rel=2e-6, abs=1e-12)   # after the decay: end_lr
    else:
        assert s.get_lr() == pytest.approx(base, rel=2e-6)            # no decay: base_lr


def test_defaults_and_keywords():
    s = LearningRateScheduler(base_lr=0.5)             # warmup_steps=1: base from the first step on
    assert [s.get_next() for _ in range(3)] == [0.5, 0.5, 0.5]
    s = LearningRateScheduler(0.8, warmup_steps=4, decay_start=6, decay_steps=2, decay_power=1.0, end_lr=0.1)
    got = [s.get_next() for _ in range(9)]
    np.testing.assert_allclose(got, [0.2, 0.4, 0.6, 0.8, 0.8, 0.8, 0.4, 0.1, 0.1], rtol=1e-6)


@pytest.mark.parametrize("kw, field", [({"base_lr": -1.0}, "base_lr"), ({"warmup_steps": 0}, "warmup_steps"),
                                       ({"decay_steps": 0}, "decay_steps"), ({"decay_power": 0.5}, "decay_power"),
                                       ({"end_lr": -0.1}, "end_lr"), ({"decay_start": -3}, "decay_start"),
                                       ({"warmup_steps": 2.5}, "warmup_steps")])
def test_bad_arguments_name_the_field(kw, field):
    args = dict(base_lr=0.1)
    args.update(kw)
    with pytest.raises(ValueError, match=field):
        LearningRateScheduler(**args)


HPARAM = {"SGD": "sgd_hparam", "Adam": "adam_hparam", "MomentumSGD": "momentum_sgd_hparam",
          "Nesterov": "nesterov_hparam"}


@pytest.mark.parametrize("opt", list(HPARAM))
def test_reads_the_optimizer_clause_of_every_type(tmp_path, opt):
    """The base rate is the optimizer's learning_rate; warmup_steps, decay_start, decay_steps,
    decay_power and end_lr come from the same hparam object, for every optimizer type."""
    hp = {"learning_rate": 0.3, "warmup_steps": 3, "decay_start": 5, "decay_steps": 4, "decay_power": 2.0,
          "end_lr": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7, "momentum_factor": 0.9}
    path = dump(tmp_path / "m.json", {"optimizer": {"type": opt, HPARAM[opt]: hp}, "layers": []})
    s = get_learning_rate_scheduler(path)
    got = [s.get_next() for _ in range(12)]
    want = [oracle(i, 0.3, 3, 5, 4, 2.0, 0.01) for i in range(1, 13)]
    np.testing.assert_allclose(got, want, rtol=2e-6)
    # without the schedule's fields: the defaults (warm-up of one step, no decay)
    bare = dump(tmp_path / "b.json", {"optimizer": {"type": opt, HPARAM[opt]: {"learning_rate": 0.25}}})
    s = get_learning_rate_scheduler(configure_file=bare)
    assert [s.get_next() for _ in range(4)] == [0.25] * 4


def test_config_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.json"):
        get_learning_rate_scheduler(str(tmp_path / "nope.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ModelError, match="bad.json"):
        get_learning_rate_scheduler(str(tmp_path / "bad.json"))
    cases = [({"layers": []}, "'optimizer'"),
             ({"optimizer": {"type": "Adagrad", "adagrad_hparam": {"learning_rate": 1}}}, "Adagrad"),
             ({"optimizer": {"type": "SGD", "adam_hparam": {"learning_rate": 1}}}, "sgd_hparam"),
             ({"optimizer": {"type": "SGD", "sgd_hparam": {}}}, "learning_rate"),
             ({"optimizer": {"type": "SGD", "sgd_hparam": {"learning_rate": 0.1, "warmup_steps": 0}}},
              "warmup_steps"),
             ({"optimizer": {"type": "SGD", "sgd_hparam": {"learning_rate": 0.1, "decay_power": "2"}}},
              "decay_power")]
    for i, (j, match) in enumerate(cases):
        with pytest.raises((ModelError, ValueError), match=match):
            get_learning_rate_scheduler(dump(tmp_path / f"c{i}.json", j))


def test_drives_a_session_like_model_prefetch_wdl(tmp_path, rng):
    """v2.3's model_prefetch_wdl_1gpu.py loop: lr = get_next(); set_learning_rate(lr); train().
    The schedule warms up, decays to end_lr = 0 and stays there: the weights change while the
    rate is positive and not once it is 0 (the rate reaches the dense and embedding optimizers)."""
    lists, keysets, ev = write_lists(tmp_path / "d", rng, [(1, 2), (4, 1)], n_lists=2, per_file=64, vocab=30)
    j = wdl_json(optimizer={"type": "SGD", "sgd_hparam": {"learning_rate": 0.5, "warmup_steps": 2,
                                                          "decay_start": 3, "decay_steps": 2, "end_lr": 0.0}})
    path = dump(tmp_path / "m.json", j)
    lr_sch = get_learning_rate_scheduler(path)
    sess = Session(solver_parser_helper(batchsize=16, seed=1), path, True, str(tmp_path / "temp"))
    reader = sess.get_data_reader_train()
    sess.get_data_reader_eval().set_file_list_source(ev)
    lrs, changed = [], []
    for file_list, keyset in zip(lists, keysets):
        reader.set_file_list_source(file_list)
        sess.get_model_oversubscriber().update(keyset)
        while True:
            lr = lr_sch.get_next()
            sess.set_learning_rate(lr)
            before = [w.numpy().copy() for w in sess.dense.weights()]
            used = sess.embeddings[1].rows_in_use          # rows of new keys are initialised, not trained
            table = sess.embeddings[1].table.numpy()[:used].copy()
            if not sess.train():
                break
            after = [w.numpy() for w in sess.dense.weights()]
            dense_moved = any(not np.array_equal(a, b) for a, b in zip(before, after))
            table_moved = not np.array_equal(sess.embeddings[1].table.numpy()[:used], table)
            lrs.append(lr)
            changed.append((dense_moved, table_moved))
    assert len(lrs) >= 8
    np.testing.assert_allclose(lrs[:6], [0.25, 0.5, 0.5, 0.125, 0.0, 0.0], rtol=1e-6)
    assert changed[0][0] and all(c == (True, True) for c in changed[1:4]), changed[:4]   # step 1: no row yet
    assert all(c == (False, False) for c in changed[4:]), changed
    sess.evaluation()
