"""embedlab.tutorials.keras_rs_swap: the same Keras-RS model with Keras-RS's and EmbedLab's
DistributedEmbedding trains to the same losses and tables; the timing helper pairs rounds."""
from __future__ import annotations

import numpy as np
import pytest

keras_rs = pytest.importorskip("keras_rs", reason="keras-rs is not installed (pinned in requirements.txt)")

from embedlab.keras_rs import DistributedEmbedding  # noqa: E402
from embedlab.tutorials import keras_rs_swap as S  # noqa: E402

SIZE = S.Size(tables=3, rows=40, dim=4, batch=32, steps=4, repeats=3)


def test_swapped_layer_trains_to_the_same_losses_and_tables(rng):
    seed = int(rng.integers(0, 2**31 - 1))
    ref = S.Trainer(keras_rs.layers.DistributedEmbedding(S.feature_configs(SIZE, seed)), seed)
    swapped = S.Trainer(DistributedEmbedding(S.feature_configs(SIZE, seed)), seed)
    batches = S.make_batches(SIZE, SIZE.steps, seed)
    a = S.train_losses(ref, batches)
    b = S.train_losses(swapped, batches)
    assert a.shape == (SIZE.steps,) and np.all(np.isfinite(a))
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    ta, tb = ref.tables(), swapped.tables()
    assert sorted(ta) == sorted(tb) == [f"t{i}" for i in range(SIZE.tables)]
    init = S.feature_configs(SIZE, seed)["c0"].table.initializer((SIZE.rows, SIZE.dim))
    assert np.abs(ta["t0"] - np.asarray(init)).max() > 1e-4     # training moved the tables
    for k in ta:
        np.testing.assert_allclose(tb[k], ta[k], rtol=1e-5, atol=1e-6)

    t = S.time_steps({"keras-rs": ref, "embedlab": swapped}, batches[0], repeats=3, warmup=1)
    assert list(t) == ["keras-rs", "embedlab"]
    assert all(v.shape == (3,) and np.all(v > 0) for v in t.values())


def test_sizes_and_bad_arguments():
    assert [S.size_for(s).batch for s in ("ci", "small", "full")] == [512, 2048, 4096]
    with pytest.raises(ValueError, match="scale must be one of"):
        S.size_for("huge")
    with pytest.raises(ValueError, match="n must be an integer >= 1, got 0"):
        S.make_batches(SIZE, 0)
    with pytest.raises(ValueError, match="size must be a keras_rs_swap.Size"):
        S.feature_configs((3, 40, 4))
    cat, dense, labels = S.make_batches(SIZE, 1)[0]
    assert sorted(cat) == ["c0", "c1", "c2"] and dense.shape == (32, S.N_DENSE) and labels.shape == (32, 1)
    assert all(0 <= int(v.numpy().min()) and int(v.numpy().max()) < SIZE.rows for v in cat.values())
