"""The ensemble served by a REAL tritonserver: answers against the in-process reference
(HPS lookup + onnxruntime), over HTTP and gRPC; bad requests get a named error and the server
keeps serving; the configuration the server loaded; concurrent load with exact answers."""
from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from embedlab.serving import client_for, infer, make_inputs, run_load, hps_stats
from serving_export import DEFAULT_VALUE, DIM, MAX_BATCH, SLOTS, random_keys

ATOL = 1e-5


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_answers_match_reference(server, reference, rng, protocol):
    with client_for(server, protocol) as c:
        for batch in (1, 2, 7, MAX_BATCH):
            keys = random_keys(rng, batch)
            got = infer(c, keys)
            want = reference.predict(keys)
            assert got.shape == (batch, 1) and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"batch {batch}")


def test_lookup_vectors_are_the_table_rows(server, reference, rng):
    # The embedding model alone: OUTPUT0 is the sparse model's rows, and the default value for
    # a key the table does not hold.
    keys = random_keys(rng, 5)
    with client_for(server) as c:
        r = c.infer("hps_embedding", make_inputs(keys, keys_name="KEYS", numkeys_name="NUMKEYS"))
        vec = r.as_numpy("OUTPUT0")
    assert vec.shape == (5, SLOTS, DIM)
    np.testing.assert_array_equal(vec, reference.lookup(keys))
    np.testing.assert_array_equal(vec[1, 1], np.full(DIM, DEFAULT_VALUE, np.float32))


def test_config_as_loaded(server):
    for name in ("hps_embedding", "dense"):
        cfg = server.model_config(name)
        assert cfg["backend"] == "python" and cfg["max_batch_size"] == MAX_BATCH
        assert "dynamic_batching" in cfg
        assert cfg["instance_group"][0]["kind"] == "KIND_CPU"
    ens = server.model_config("ensemble")
    assert ens["platform"] == "ensemble" and ens["max_batch_size"] == MAX_BATCH
    steps = ens["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["hps_embedding", "dense"]
    assert steps[0]["input_map"] == {"KEYS": "EMB_KEY", "NUMKEYS": "EMB_N_KEY"}
    assert steps[0]["output_map"] == {"OUTPUT0": "LOOKUP_VECTORS", "DEFAULTED_KEYS": "DEFAULTED_KEYS"}
    assert steps[1]["output_map"] == {"DENSE_OUTPUT": "DENSE_OUTPUT"}
    assert {o["name"]: (o["data_type"], o["dims"]) for o in ens["output"]} == {
        "DENSE_OUTPUT": ("TYPE_FP32", [1]), "DEFAULTED_KEYS": ("TYPE_INT32", [1])}


def _bad(c, keys, match, **kw):
    with pytest.raises(InferenceServerException, match=match):
        infer(c, keys, **kw)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_requests_are_named_and_server_keeps_serving(server, reference, rng, protocol):
    keys = random_keys(rng, 4, unknown=False)
    with client_for(server, protocol) as c:
        # wrong dtypes: refused by Triton against the config, naming the input
        _bad(c, keys.astype(np.int32), r"(?s)EMB_KEY.*INT64|INT64.*EMB_KEY")
        _bad(c, keys, r"(?s)EMB_N_KEY.*INT32|INT32.*EMB_N_KEY", numkeys=np.full((4, 1), SLOTS, np.int64))
        _bad(c, keys.astype(np.float32), "EMB_KEY")
        # NUMKEYS disagreeing with KEYS: refused by the embedding model
        bad_n = np.full((4, 1), SLOTS, np.int32)
        bad_n[2] = SLOTS - 1
        _bad(c, keys, r"NUMKEYS \(ensemble input EMB_N_KEY\)\[2\] = 2 disagrees with KEYS", numkeys=bad_n)
        # HugeCTR-style total count [1, 1]: the batch sizes of the two inputs disagree
        _bad(c, keys, r"batch size does not match", numkeys=np.full((1, 1), SLOTS * 4, np.int32))
        # a negative key, named with its position
        neg = keys.copy()
        neg[3, 0] = -7
        _bad(c, neg, r"KEYS \(ensemble input EMB_KEY\)\[3, 0\] = -7 is a negative key")
        # a batch above max_batch_size
        big = random_keys(rng, MAX_BATCH + 1)
        _bad(c, big, rf"(?s)batch.*{MAX_BATCH}")
        # the wrong number of keys per sample
        _bad(c, keys[:, :2], "EMB_KEY")
        # ... and the next good request is answered, exactly
        good = random_keys(rng, 3)
        np.testing.assert_allclose(infer(c, good), reference.predict(good), rtol=0, atol=ATOL)
    assert server.running()


def test_concurrent_clients_exact_answers(server, reference, rng):
    # 4 threads at once: the dynamic batcher merges their requests; every answer stays exact.
    batches = [random_keys(rng, 8) for _ in range(16)]
    expected = [reference.predict(k) for k in batches]
    res = run_load(server, batches, expected=expected, concurrency=4, duration_s=1.0, max_requests=400)
    assert res.failed == 0 and res.wrong == 0, res.errors
    assert res.requests >= 20
    stats = hps_stats(server)
    assert stats, "the hps_embedding model publishes no statistics on the metrics endpoint"
