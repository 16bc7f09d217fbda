"""SOK's new API and Horovod calls as HugeCTR's own SOK tests use them (sparse_operation_kit
v23.02-v25.03 function tests): `sok.init(comm_tool)`, `sok.SGD`, `sok.filter_variables`,
`sok.tf_version`, and `embedlab.sok.compat.horovod` (our `horovod.tensorflow`) on 1 and 2 workers."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import embedlab.sok as sok
import embedlab.sok.compat.horovod as hvd


@pytest.fixture(scope="module", autouse=True)
def one_worker():
    sok.init()


def test_init_takes_sok_arguments():
    # SOK: init(comm_tool="horovod", use_legacy_optimizer=True); its tests call init("xyz") too
    ctx = sok.init()
    assert sok.init("horovod") is ctx
    assert sok.init(use_legacy_optimizer=False) is ctx
    with pytest.raises(ValueError, match="comm_tool must be a string"):
        sok.init(3)
    assert sok.tf_version[:2] == [int(x) for x in tf.__version__.split(".")[:2]]


def test_filter_variables():
    v1 = tf.Variable([[0.0, 1.0, 2.0]])
    v2 = sok.Variable(np.array([[3, 4, 5]], np.float32))
    v3 = sok.Variable(np.array([[6, 7, 8]], np.float32), mode="localized:0")
    v4 = sok.DynamicVariable(dimension=3, initializer="13")
    sok_vars, other = sok.filter_variables([v1, v2, v3, v4])
    assert sok_vars == [v2, v3, v4] and other == [v1]


def test_hierarchical_kv_only_apis_are_clear_errors():
    v = sok.DynamicVariable(dimension=2, initializer="1")
    ids = tf.ragged.constant([[1, 2]], dtype=tf.int64)
    with pytest.raises(NotImplementedError, match="sparse_read_and_evict: SOK's HierarchicalKV .* never evicts"):
        sok.sparse_read_and_evict(v, ids)
    with pytest.raises(NotImplementedError, match="incremental_model_dump: SOK's HierarchicalKV"):
        sok.incremental_model_dump([v], "path")


def test_sok_sgd_is_sparse_sgd(rng):
    full = rng.normal(size=(20, 3)).astype(np.float32)
    v = sok.Variable(full, name="sgd_t")
    opt = sok.SGD(lr=0.5)
    assert float(opt.lr.numpy()) == 0.5
    ids = tf.ragged.constant([[1, 4, 4], [7]], dtype=tf.int64)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(sok.lookup_sparse(v, ids, combiners="sum"))
    g = tape.gradient(loss, [v])
    opt.apply_gradients(zip(g, [v]))
    want = full.copy()
    for k, c in ((1, 1), (4, 2), (7, 1)):
        want[k] -= 0.5 * c
    np.testing.assert_array_equal(v.numpy(), want)
    opt.lr.assign(0.25)                          # SOK keeps lr in a tf.Variable
    opt.apply_gradients(zip(g, [v]))
    for k, c in ((1, 1), (4, 2), (7, 1)):
        want[k] -= 0.25 * c
    np.testing.assert_array_equal(v.numpy(), want)


def test_horovod_one_worker_and_bad_arguments():
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    x = tf.constant([1.0, 2.0])
    np.testing.assert_array_equal(hvd.allreduce(x), x)
    np.testing.assert_array_equal(hvd.allreduce(x, op=hvd.Sum), x)
    np.testing.assert_array_equal(hvd.broadcast(x, root_rank=0), x)
    with pytest.raises(ValueError, match="root_rank 1 is outside 0..0"):
        hvd.broadcast(x, root_rank=1)
    with pytest.raises(ValueError, match="op or average, not both"):
        hvd.allreduce(x, average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match="op 2 is not supported"):
        hvd.allreduce(x, op=hvd.Adasum)


_JOB = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    import embedlab.sok.compat.horovod as hvd
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    out = {}
    x = tf.constant([1.0 + r, 10.0 * (r + 1)])
    out["sum"] = hvd.allreduce(x, op=hvd.Sum).numpy().tolist()
    out["avg"] = hvd.allreduce(x).numpy().tolist()
    out["max"] = hvd.allreduce(x, op=hvd.Max).numpy().tolist()
    out["bcast"] = hvd.broadcast(tf.constant([r, r + 5], tf.int64), root_rank=1).numpy().tolist()
    out["gather"] = hvd.allgather(tf.range(r + 1, dtype=tf.int64)).numpy().tolist()
    sl = tf.IndexedSlices(tf.fill([r + 1, 2], float(r + 1)), tf.range(r + 1, dtype=tf.int64), tf.constant([4, 2], tf.int64))
    s = hvd.allreduce(sl, op=hvd.Sum)
    out["slices"] = [s.indices.numpy().tolist(), s.values.numpy().tolist()]
    @tf.function
    def step(v):
        return hvd.allreduce(v * 2.0, op=hvd.Sum)
    out["graph"] = step(tf.constant(float(r))).numpy().tolist()
    var = tf.Variable([float(r)])
    hvd.broadcast_variables([var], root_rank=0)
    out["var"] = var.numpy().tolist()
    print("RESULT", r, json.dumps(out))
""")


def test_horovod_shim_on_two_workers(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(_JOB)
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "180", str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    import json
    res = {}
    for line in p.stdout.splitlines():
        if "RESULT " in line:
            r, js = line.split("RESULT ", 1)[1].split(" ", 1)
            res[int(r)] = json.loads(js)
    assert sorted(res) == [0, 1]
    for r in (0, 1):
        o = res[r]
        assert o["sum"] == [3.0, 30.0] and o["avg"] == [1.5, 15.0] and o["max"] == [2.0, 20.0]
        assert o["bcast"] == [1, 6]
        assert o["gather"] == [0, 0, 1]
        assert o["slices"] == [[0, 0, 1], [[1.0, 1.0], [2.0, 2.0], [2.0, 2.0]]]
        assert o["graph"] == 2.0
        assert o["var"] == [0.0]
