"""The device callback of the HPS op's GPU kernel (embedlab/hps/_tf_device.py), without TensorFlow.

Everywhere: its argument checks, its routing rule (a table that is not on the GPU tier of the
op's device goes through the host path) and errors that name the problem. Where the GPU tier
runs (the GPU machine: PyTorch or CuPy, no TensorFlow): the callback called as the kernel calls
it, with raw device pointers and a stream standing in for TensorFlow's, fills the output with
the bits the server returns on the host, for int64 and int32 keys, its work ordered after the
stream's earlier work; tables off the GPU tier get the host-path answer and an untouched output.
"""
import ctypes
import json
import logging

import numpy as np
import pytest

import embedlab.hps as hps
from embedlab.hps import HPSLookupError, _tf_device
from embedlab.hps.tiers import DeviceArrays, gpu_tier_available

from hps_testing import Table


def _config(tmp_path, tab, gpucache):
    cfg = {"volatile_db": {"type": "parallel_hash_map"}, "persistent_db": {"type": "disabled"},
           "models": [{"model": "lm", "sparse_files": [str(tab.path)], "embedding_vecsize_per_table": [tab.dim],
                       "gpucache": gpucache, "gpucacheper": 0.2, "deployed_device_list": [0],
                       "default_value_for_each_table": [0.5]}]}
    path = tmp_path / "hps.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture()
def served(tmp_path, rng):
    tab = Table(tmp_path / "t", n=500, dim=8, rng=rng, key_space=2**30)
    path = _config(tmp_path, tab, gpucache=False)
    ps = hps.get_server(path, global_batch_size=16)
    _tf_device._host_path_noted.clear()
    yield tab, path, ps
    hps.shutdown()


def _query(tab, m, absent):
    """m keys of the table (duplicates likely) and up to `absent` absent keys, all within int32."""
    a = [int(k) for k in tab.rng.integers(-2**31, 2**31, absent) if int(k) not in tab.oracle]
    return tab.rng.permutation(np.concatenate([tab.query(m), np.array(a, np.int64)]))


@pytest.mark.parametrize("args, match", [
    (dict(key_bytes=2), "key_bytes must be 8 .* or 4 .*got 2"),
    (dict(n=0), "n must be >= 1.*got 0"),
    (dict(dim=0), "emb_vec_size must be >= 1, got 0"),
    (dict(device=-1), "device must be a CUDA device ordinal >= 0, got -1"),
    (dict(keys_ptr=0), "keys is a null pointer"),
    (dict(out_ptr=None), "out is a null pointer"),
])
def test_argument_checks(args, match):
    a = dict(keys_ptr=0x1000, key_bytes=8, n=3, out_ptr=0x2000, dim=4, device=0)
    a.update(args)
    with pytest.raises(ValueError, match=match):
        _tf_device._check_device_args(**a)


def test_route_of_a_model_without_gpu_cache_is_the_host_path(served):
    tab, path, ps = served
    assert "model 'lm' has no GPU cache (cache_tier 'none'" in _tf_device._device_route(ps, "lm", 0, 8, 0)
    with pytest.raises(ValueError, match="emb_vec_size is 9 but table 0 of model 'lm' has vectors of 8"):
        _tf_device._device_route(ps, "lm", 0, 9, 0)
    with pytest.raises(HPSLookupError, match="model 'lm' has no table_id 3"):
        _tf_device._device_route(ps, "lm", 3, 8, 0)


def test_errors_name_the_problem(served):
    tab, path, ps = served
    keys = np.arange(3, dtype=np.int64)
    out = np.zeros((3, 8), np.float32)
    err = ctypes.create_string_buffer(512)

    def call(model=b"lm", table=0, key_bytes=8, dim=8, buf=err):
        return _tf_device._device_lookup_callback(path.encode(), model, table, 16, keys.ctypes.data, key_bytes, 3,
                                                  out.ctypes.data, dim, 0, 0, buf, len(buf))

    assert call(model=b"nope") == 1
    assert "HPSLookupError: HPS: unknown model 'nope'" in err.value.decode()
    assert call(table=2) == 1
    assert "model 'lm' has no table_id 2" in err.value.decode()
    assert call(dim=5) == 1
    assert "emb_vec_size is 5 but table 0 of model 'lm' has vectors of 8" in err.value.decode()
    assert call(key_bytes=16) == 1
    assert "ValueError: key_bytes must be 8" in err.value.decode()
    small = ctypes.create_string_buffer(10)        # a message longer than the buffer is cut, NUL-terminated
    assert call(model=b"nope", buf=small) == 1
    assert small.value == b"HPSLookup"
    assert not out.any()                           # nothing was written on any error


def test_host_path_answer_leaves_the_output_and_is_logged_once(served, caplog):
    tab, path, ps = served
    keys = np.ascontiguousarray(_query(tab, 20, 3))
    out = np.full((keys.size, 8), np.nan, np.float32)
    err = ctypes.create_string_buffer(512)
    with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
        for device in (0, 0, 1):
            rc = _tf_device._device_lookup_callback(path.encode(), b"lm", 0, 16, keys.ctypes.data, 8, keys.size,
                                                    out.ctypes.data, 8, device, 0, err, len(err))
            assert rc == _tf_device.HOST_PATH
    assert np.isnan(out).all()
    noted = [r.getMessage() for r in caplog.records if "served through the host path" in r.getMessage()]
    assert len(noted) == 2 and "cuda:0" in noted[0] and "cuda:1" in noted[1]   # once per device


# ---- where the GPU tier runs ---------------------------------------------------------------------

_NGPU, _WHY = gpu_tier_available()
needs_tier = pytest.mark.skipif(_NGPU == 0, reason=f"the HPS GPU tier cannot run here: {_WHY}")


class _Buffers:
    """Device buffers, their raw pointers and a side stream, in the GPU tier's framework."""

    def __init__(self):
        self.name = DeviceArrays().name
        if self.name == "torch":
            import torch
            self.t = torch
            self.stream = torch.cuda.Stream(device=0)
            self.stream_ptr = int(self.stream.cuda_stream)
        else:
            import cupy
            self.cp = cupy
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.stream_ptr = int(self.stream.ptr)

    def on_side_stream(self, host: np.ndarray):
        """A device copy of `host` made on the side stream, not waited for (as TF's keys are)."""
        if self.name == "torch":
            with self.t.cuda.stream(self.stream):
                return self.t.from_numpy(np.ascontiguousarray(host)).to("cuda:0", non_blocking=True)
        with self.stream:
            return self.cp.asarray(host)

    def poison(self, shape):
        if self.name == "torch":
            with self.t.cuda.stream(self.stream):
                return self.t.full(shape, float("nan"), dtype=self.t.float32, device="cuda:0")
        with self.stream:
            return self.cp.full(shape, np.nan, np.float32)

    def ptr(self, x) -> int:
        return int(x.data_ptr()) if self.name == "torch" else int(x.data.ptr)

    def host(self, x) -> np.ndarray:
        self.stream.synchronize()
        return x.cpu().numpy() if self.name == "torch" else self.cp.asnumpy(x)


@needs_tier
@pytest.mark.parametrize("key_dtype", [np.int64, np.int32])
def test_gpu_path_fills_the_output_on_the_given_stream(tmp_path, rng, key_dtype, caplog):
    tab = Table(tmp_path / "t", n=4000, dim=16, rng=rng, key_space=2**30)
    path = _config(tmp_path, tab, gpucache=True)
    try:
        ps = hps.get_server(path, global_batch_size=64)
        assert ps.table_info("lm", 0)["cache_tier"] == "gpu"
        b = _Buffers()
        err = ctypes.create_string_buffer(1024)
        _tf_device._host_path_noted.clear()
        with caplog.at_level(logging.WARNING, logger="embedlab.hps"):
            for _ in range(4):                     # misses (inserted), then hits
                q = _query(tab, 3000, 100).astype(key_dtype)
                keys = b.on_side_stream(q)
                out = b.poison((q.size, 16))
                rc = _tf_device._device_lookup_callback(path.encode(), b"lm", 0, 64, b.ptr(keys), q.itemsize, q.size,
                                                        b.ptr(out), 16, 0, b.stream_ptr, err, len(err))
                assert rc == 0, err.value
                want = tab.expect(q.astype(np.int64), default=0.5)
                np.testing.assert_array_equal(b.host(out).view(np.uint32), want.view(np.uint32))
                np.testing.assert_array_equal(want, ps.lookup("lm", 0, q.astype(np.int64)))
        assert not [r for r in caplog.records if "host path" in r.getMessage()]
        # A device the model is not deployed on: the host-path answer, the output untouched.
        out = b.poison((q.size, 16))
        rc = _tf_device._device_lookup_callback(path.encode(), b"lm", 0, 64, b.ptr(keys), q.itemsize, q.size,
                                                b.ptr(out), 16, 5, b.stream_ptr, err, len(err))
        assert rc == _tf_device.HOST_PATH
        assert "deployed on GPU device(s) [0] (deployed_device_list), not on cuda:5" in err.value.decode()
        assert np.isnan(b.host(out)).all()
        # An error inside the GPU path comes back as the error status's text.
        rc = _tf_device._device_lookup_callback(path.encode(), b"lm", 0, 64, b.ptr(keys), q.itemsize, q.size,
                                                b.ptr(out), 15, 0, b.stream_ptr, err, len(err))
        assert rc == 1 and "emb_vec_size is 15 but table 0 of model 'lm' has vectors of 16" in err.value.decode()
    finally:
        hps.shutdown()


@needs_tier
def test_views_are_zero_copy():
    b = _Buffers()
    v = _tf_device._get_views()
    x = b.on_side_stream(np.arange(12, dtype=np.int64))
    view = v.view(b.ptr(x), (12,), np.int64, 0)
    assert b.ptr(view) == b.ptr(x)
    with v.on_stream(b.stream_ptr, 0):
        v.copy(view, view[::-1].copy() if b.name == "cupy" else view.flip(0).clone())
    np.testing.assert_array_equal(b.host(x), np.arange(12)[::-1])
