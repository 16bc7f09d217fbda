"""What the served ensemble tells its clients, against a REAL tritonserver: the count of keys
answered with the default vector (per sample, in every response), clients that ignore that
output, and HPS statistics on the metrics endpoint that are current at every scrape."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from embedlab.serving import client_for, hps_stats, infer, make_inputs, predict, run_load
from serving_export import DEFAULT_VALUE, DIM, SLOTS, VOCAB_PER_SLOT, random_keys

ATOL = 1e-5
TABLE = "tables.served_dnn/0"


def _with_unknown_keys(rng, batch=7):
    """Keys with absent ones in known places: 10**15 (far outside every slot), a key just past
    the table, and a duplicated row of absent keys. Returns (keys, expected count per sample)."""
    keys = random_keys(rng, batch, unknown=False)
    keys[0, 1] = 10**15
    keys[2] = [10**15, 10**15 + 1, 2**62]
    keys[4, 0] = SLOTS * VOCAB_PER_SLOT + int(rng.integers(0, 1000))
    keys[5] = keys[2]                                  # the same absent keys again: counted again
    keys[6, 2] = 10**15                                # and the same absent key in another sample
    return keys, np.array([1, 0, 3, 0, 1, 3, 1], np.int32)


def _absent_per_sample(keys):
    # Independent of the server: the served table holds exactly the keys 0 .. SLOTS*VOCAB-1.
    return (keys >= SLOTS * VOCAB_PER_SLOT).sum(axis=1).astype(np.int32)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_defaulted_keys_per_sample(server, reference, rng, protocol):
    keys, want = _with_unknown_keys(rng)
    assert np.array_equal(_absent_per_sample(keys), want)
    with client_for(server, protocol) as c:
        before = hps_stats(server)
        p = predict(c, keys)
        after = hps_stats(server)
        known = random_keys(rng, 5, unknown=False)
        q = predict(c, known)
    assert p.defaulted_keys.dtype == np.int32 and p.defaulted_keys.shape == (keys.shape[0],)
    np.testing.assert_array_equal(p.defaulted_keys, want)
    assert p.total_defaulted == int(want.sum()) == 9
    np.testing.assert_allclose(p.output, reference.predict(keys), rtol=0, atol=ATOL)
    # The server's counter agrees with the response, key for key (duplicates included).
    got = after[f"{TABLE}.defaults_returned"] - before[f"{TABLE}.defaults_returned"]
    assert got == p.total_defaulted, (got, p.total_defaulted)
    np.testing.assert_array_equal(q.defaulted_keys, np.zeros(5, np.int32))
    assert q.total_defaulted == 0


def test_hps_embedding_reports_defaulted_keys(server, reference, rng):
    # The embedding model alone: DEFAULTED_KEYS beside OUTPUT0, and the rows it counts are the
    # default value.
    keys, want = _with_unknown_keys(rng)
    with client_for(server) as c:
        r = c.infer("hps_embedding", make_inputs(keys, keys_name="KEYS", numkeys_name="NUMKEYS"))
    vec, defaulted = r.as_numpy("OUTPUT0"), r.as_numpy("DEFAULTED_KEYS")
    assert defaulted.dtype == np.int32 and defaulted.shape == (keys.shape[0], 1)
    np.testing.assert_array_equal(defaulted[:, 0], want)
    np.testing.assert_array_equal(vec, reference.lookup(keys))
    np.testing.assert_array_equal(vec[keys >= SLOTS * VOCAB_PER_SLOT], DEFAULT_VALUE)
    assert vec.shape == (keys.shape[0], SLOTS, DIM)


def test_dynamic_batch_counts_each_request(server, rng):
    # Requests merged by the dynamic batcher are looked up in one call; each response still gets
    # its own samples' counts.
    cases = [_with_unknown_keys(rng) for _ in range(3)] + [(random_keys(rng, 4, unknown=False),
                                                           np.zeros(4, np.int32))]
    c = httpclient.InferenceServerClient(server.http_url, concurrency=4)
    try:
        pending = [c.async_infer("ensemble", make_inputs(k),
                                 outputs=[httpclient.InferRequestedOutput("DEFAULTED_KEYS")])
                   for k, _ in cases * 4]
        for (keys, want), req in zip(cases * 4, pending):
            np.testing.assert_array_equal(req.get_result().as_numpy("DEFAULTED_KEYS")[:, 0], want)
    finally:
        c.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_clients_that_ignore_the_new_output(server, reference, rng, protocol):
    # HugeCTR's client code: DENSE_OUTPUT requested by name, nothing else read.
    m = httpclient if protocol == "http" else grpcclient
    keys, _ = _with_unknown_keys(rng)
    want = reference.predict(keys)
    with client_for(server, protocol) as c:
        r = c.infer("ensemble", make_inputs(keys, protocol), outputs=[m.InferRequestedOutput("DENSE_OUTPUT")])
        np.testing.assert_allclose(r.as_numpy("DENSE_OUTPUT"), want, rtol=0, atol=ATOL)
        assert r.as_numpy("DEFAULTED_KEYS") is None      # asked for one output, got one
        # No outputs named: every output comes back, DENSE_OUTPUT unchanged.
        r = c.infer("ensemble", make_inputs(keys, protocol))
        np.testing.assert_allclose(r.as_numpy("DENSE_OUTPUT"), want, rtol=0, atol=ATOL)
        np.testing.assert_array_equal(r.as_numpy("DEFAULTED_KEYS")[:, 0], _absent_per_sample(keys))
        np.testing.assert_allclose(infer(c, keys), want, rtol=0, atol=ATOL)


def test_metrics_current_at_every_scrape(server, rng):
    # N lookups, then ONE scrape: it shows exactly N (it used to lag by up to all of them: the
    # model published its statistics at most every 0.25 s, and only while serving).
    with client_for(server) as c:
        for n in (1, 10, 3, 25):
            before = hps_stats(server)
            batch = int(rng.integers(1, 9))
            absent = 0
            for _ in range(n):
                keys = random_keys(rng, batch)
                absent += int(_absent_per_sample(keys).sum())
                infer(c, keys)
            after = hps_stats(server)
            d = {s: after[f"{TABLE}.{s}"] - before[f"{TABLE}.{s}"] for s in ("lookups", "keys", "defaults_returned")}
            assert d == {"lookups": n, "keys": n * batch * SLOTS, "defaults_returned": absent}, (n, batch, d)
            # The cache tier saw every lookup, too.
            assert after["tiers.cache.calls"] - before["tiers.cache.calls"] == n


def test_metrics_current_after_concurrent_load(server, rng):
    # 4 clients at once: the dynamic batcher merges requests (fewer lookups than requests), but
    # every key of every answered request is counted by the time of the next scrape.
    batch = 8
    batches = [random_keys(rng, batch) for _ in range(16)]
    before = hps_stats(server)
    res = run_load(server, batches, concurrency=4, duration_s=1.0, max_requests=150, warmup=0)
    after = hps_stats(server)
    assert res.failed == 0, res.errors
    lookups = after[f"{TABLE}.lookups"] - before[f"{TABLE}.lookups"]
    assert after[f"{TABLE}.keys"] - before[f"{TABLE}.keys"] == res.requests * batch * SLOTS
    assert 1 <= lookups <= res.requests


def test_parameter_server_marks_defaulted_keys(reference, rng):
    # What the model counts from: ParameterServer.lookup(..., return_defaulted=True), one flag
    # per key (duplicates included), and the same count in stats()'s defaults_returned.
    ps = reference.ps
    keys = np.concatenate([rng.integers(0, SLOTS * VOCAB_PER_SLOT, 20), [10**15, 10**15, 2**62, 0]])
    keys = rng.permutation(keys).astype(np.int64)
    before = ps.stats()["tables"]["served_dnn/0"]["defaults_returned"]
    vectors, defaulted = ps.lookup("served_dnn", 0, keys, return_defaulted=True)
    assert defaulted.dtype == bool and defaulted.shape == keys.shape
    np.testing.assert_array_equal(defaulted, keys >= SLOTS * VOCAB_PER_SLOT)
    np.testing.assert_array_equal(vectors, ps.lookup("served_dnn", 0, keys))
    assert ps.stats()["tables"]["served_dnn/0"]["defaults_returned"] - before == 2 * 3   # two lookups, 3 each
    empty_v, empty_d = ps.lookup("served_dnn", 0, np.zeros(0, np.int64), return_defaulted=True)
    assert empty_v.shape == (0, DIM) and empty_d.shape == (0,)


def test_metrics_of_two_instances_add_up(export_dir, tmp_path, rng):
    # Two hps_embedding instances, each with its own ParameterServer: each publishes under its
    # own `instance` label (they used to overwrite each other's values), and hps_stats adds up.
    from embedlab.serving import TritonServer, write_model_repository
    repo = write_model_repository(export_dir, tmp_path / "repo", max_batch_size=64, embedding_instances=2)
    batch = 8
    batches = [random_keys(rng, batch) for _ in range(16)]
    with TritonServer(repo, log_file=tmp_path / "triton.log") as s:
        res = run_load(s, batches, concurrency=4, duration_s=1.5, max_requests=120, warmup=0)
        per = hps_stats(s, per_instance=True)
        total = hps_stats(s)
    assert res.failed == 0, res.errors
    assert len(per) == 2, sorted(per)
    keys = [st[f"{TABLE}.keys"] for st in per.values()]
    assert sum(keys) == total[f"{TABLE}.keys"] == res.requests * batch * SLOTS, (keys, res.requests)
    assert total[f"{TABLE}.rows"] == SLOTS * VOCAB_PER_SLOT                # the same in both: not added
    calls = total["tiers.cache.calls"]
    assert total["tiers.cache.latency_ms_mean"] == pytest.approx(1e3 * total["tiers.cache.seconds"] / calls)
