"""The HPS op's GPU kernel and its device callback (embedlab/hps/layers.py, csrc/tf/hps_kernels_gpu.cc).

Here (TensorFlow without CUDA): the device callback is registered with the op library; the host
path as the kernel runs it (the device callback answers 2 without touching the buffers, said
once in the log, then the host callback fills the rows); the CPU op as before. The callback's
own checks and its GPU path: test_hps_tf_device_callback.py (no TensorFlow, so it runs on the
GPU machine). With a CUDA TensorFlow, a GPU and the GPU tier: the op on a GPU gives the same
bits as the server on the host, for int64 and int32 ids, on the GPU tier and through the host
path. That test skips, with its reason, where any of those is missing.
"""
import ctypes
import json
import logging

import numpy as np
import pytest
import tensorflow as tf

import embedlab.hps as hps
from embedlab import _native
from embedlab.hps import _tf_device, layers
from embedlab.hps.tiers import gpu_tier_available

from hps_testing import Table


@pytest.fixture()
def served(tmp_path, rng):
    tab = Table(tmp_path / "t", n=500, dim=8, rng=rng, key_space=2**30)   # int32 ids reach its keys
    cfg = {"volatile_db": {"type": "parallel_hash_map"}, "persistent_db": {"type": "disabled"},
           "models": [{"model": "lm", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [8],
                       "gpucache": False, "default_value_for_each_table": [0.5]}]}
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(cfg))
    ps = hps.get_server(str(path), global_batch_size=16)
    _tf_device._host_path_noted.clear()
    yield tab, str(path), ps
    hps.shutdown()


def _query(tab, m, absent):
    """m keys of the table (duplicates likely) and up to `absent` absent keys, all within int32."""
    a = [int(k) for k in tab.rng.integers(-2**31, 2**31, absent) if int(k) not in tab.oracle]
    return tab.rng.permutation(np.concatenate([tab.query(m), np.array(a, np.int64)]))


def _lib():
    return layers._registered[0]


def _err():
    return ctypes.create_string_buffer(512)


def test_device_callback_is_registered_with_the_op_library():
    lib = _lib()
    assert lib.embedlab_hps_has_lookup_callback() == 1
    assert lib.embedlab_hps_has_device_lookup_callback() == 1
    # The library holds the GPU kernel exactly where the build says it compiled TF's GPU kernels.
    assert lib.embedlab_hps_has_gpu_kernel() == int(_native.build_info()["tf_gpu_kernels"])


@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
def test_host_path_as_the_gpu_kernel_runs_it(served, key_dtype, caplog):
    """The kernel's protocol with host buffers standing in for the device ones: the device
    callback answers 2 (host path) with the reason and writes nothing; the kernel then hands
    int64 keys (int32 widened) to the host callback, whose rows are the server's."""
    tab, path, ps = served
    q = _query(tab, 40, absent=5)
    keys = np.ascontiguousarray(q.astype(key_dtype))
    out = np.full((keys.size, 8), np.nan, np.float32)
    err = _err()
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        for _ in range(2):
            rc = _tf_device._device_lookup_callback(path.encode(), b"lm", 0, 16, keys.ctypes.data, keys.itemsize,
                                                keys.size, out.ctypes.data, 8, 0, 0, err, len(err))
            assert rc == _tf_device.HOST_PATH == 2
            assert err.value.decode().startswith("model 'lm' has no GPU cache")
    assert np.isnan(out).all()                     # the host path leaves the copies to the kernel
    noted = [r for r in caplog.records if "served through the host path" in r.getMessage()]
    assert len(noted) == 1                         # said once per model, table and device
    assert "cuda:0, table 0 of model 'lm'" in noted[0].getMessage()
    k64 = np.ascontiguousarray(keys.astype(np.int64))
    rc = layers._lookup_callback(path.encode(), b"lm", 0, 16, k64.ctypes.data, k64.size, out.ctypes.data, 8, err,
                                 len(err))
    assert rc == 0, err.value
    np.testing.assert_array_equal(out.view(np.uint32), ps.lookup("lm", 0, k64).view(np.uint32))
    np.testing.assert_array_equal(out, tab.expect(k64, default=0.5))


def test_cpu_op_is_unchanged_by_the_device_callback(served):
    """The op on the CPU still runs the host kernel (the GPU kernel exists only in CUDA builds)."""
    tab, path, ps = served
    q = _query(tab, 33, absent=3)
    with tf.device("/CPU:0"):
        got = layers.hps_lookup(tf.constant(q), "lm", 0, 8, path)
    np.testing.assert_array_equal(got.numpy(), ps.lookup("lm", 0, q))


# ---- with a CUDA TensorFlow, a GPU and the GPU tier ---------------------------------------------

def _tf_gpu_skip_reason() -> str:
    if not int(_native.build_info()["tf_gpu_kernels"]):
        return "the op library has no GPU kernels (TensorFlow here is a CPU build: build_info()['tf_gpu_kernels'])"
    if not tf.config.list_physical_devices("GPU"):
        return "TensorFlow sees no GPU"
    n, why = gpu_tier_available()
    if not n:
        return f"the HPS GPU tier cannot run here: {why}"
    return ""


@pytest.mark.skipif(bool(_tf_gpu_skip_reason()), reason=_tf_gpu_skip_reason() or "runs")
@pytest.mark.parametrize("gpucache", [True, False])
def test_op_on_gpu_matches_host_lookup(tmp_path, rng, gpucache, caplog):
    tab = Table(tmp_path / "t", n=3000, dim=16, rng=rng, key_space=2**30)   # int32 ids reach its keys
    cfg = {"volatile_db": {"type": "parallel_hash_map"}, "persistent_db": {"type": "disabled"},
           "models": [{"model": "g", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [16],
                       "gpucache": gpucache, "gpucacheper": 0.2, "deployed_device_list": [0],
                       "default_value_for_each_table": [0.25]}]}
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(cfg))
    try:
        ps = hps.get_server(str(path), global_batch_size=64)
        assert ps.table_info("g", 0)["cache_tier"] == ("gpu" if gpucache else "cpu")
        _tf_device._host_path_noted.clear()
        with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
            for key_dtype in (tf.int64, tf.int32):
                for _ in range(3):                     # misses, then hits (and inserts between)
                    q = _query(tab, 2048, absent=64)
                    with tf.device("/GPU:0"):
                        got = layers.hps_lookup(tf.constant(q, key_dtype), "g", 0, 16, str(path))
                    assert "GPU" in got.device
                    np.testing.assert_array_equal(got.numpy().view(np.uint32),
                                                  tab.expect(q.astype(np.int64), default=0.25).view(np.uint32))
        noted = [r for r in caplog.records if "served through the host path" in r.getMessage()]
        assert len(noted) == (0 if gpucache else 1)
        with pytest.raises(tf.errors.InvalidArgumentError, match=r"model_name='g', table_id=0\) on a GPU.*emb_vec_size"):
            with tf.device("/GPU:0"):
                layers.hps_lookup(tf.constant(q[:4]), "g", 0, 15, str(path)).numpy()
    finally:
        hps.shutdown()
