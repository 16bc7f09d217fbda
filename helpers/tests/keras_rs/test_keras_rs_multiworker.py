"""`DistributedEmbedding(sharding="row")` on 1 and 2 local workers (through embedlab.sok's
launcher, `MultiWorkerMirroredStrategy`): the same losses, trained tables and dense head, and on
one worker the same as the unsharded layer. The worker program is keras_rs_jobs.py; each job
costs TensorFlow's start-up per worker, so the model is tiny."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("keras_rs", reason="keras-rs is not installed (pinned in requirements.txt)")

import keras_rs_jobs as J  # noqa: E402
from reference import fresh_seed  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEED = fresh_seed()


def _launch(n, outdir):
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", str(n), "--timeout", "240",
           "--collective-timeout", "60", os.path.join(HERE, "keras_rs_jobs.py"), str(outdir), str(SEED)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in [env.get("PYTHONPATH")] if p])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{n}-worker job failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    return dict(np.load(os.path.join(outdir, f"keras_rs_w{n}.npz")))


def test_row_sharded_layer_trains_the_same_on_1_and_2_workers(tmp_path):
    print(f"[seed] EMBEDLAB_TEST_SEED={SEED}")
    one, two = _launch(1, tmp_path), _launch(2, tmp_path)
    init, kernel, _ = J.data(SEED)
    rows = {name: r for name, r, *_ in J.TABLES}

    # Row-wise: row i on rank i % 2, so rank 0 holds ceil(rows / 2) rows of each table.
    assert one["shard_rows"].tolist() == [rows[n] for n, *_ in J.TABLES]
    assert two["shard_rows"].tolist() == [(rows[n] + 1) // 2 for n, *_ in J.TABLES]

    # Sharded on one worker is the unsharded layer, bit for bit (the same kernels and updates).
    np.testing.assert_array_equal(one["losses"], one["plain/losses"])
    np.testing.assert_array_equal(one["head"], one["plain/head"])
    for name, *_ in J.TABLES:
        np.testing.assert_array_equal(one[f"table/{name}"], one[f"plain/table/{name}"])

    # Two workers: the same up to float32 summation order (gradients summed across workers).
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(two["head"], one["head"], rtol=1e-5, atol=1e-6)
    for name, *_ in J.TABLES:
        np.testing.assert_allclose(two[f"table/{name}"], one[f"table/{name}"], rtol=1e-5, atol=1e-6)
        # and training moved every table (each optimizer ran)
        assert np.abs(one[f"table/{name}"] - init[name]).max() > 1e-3, name
    assert np.abs(one["head"] - kernel).max() > 1e-3
    assert np.all(np.isfinite(one["losses"])) and len(one["losses"]) == J.STEPS
