"""Notebook 04's cost model and notebook verdicts: the byte counts follow the routing rules, the
link fit and the step prediction do their arithmetic, and a verdict picks a winner only outside
the noise."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab.tutorials import sok_cost as cost
from embedlab.tutorials.verdicts import compare, spread


def test_spread_and_compare_follow_the_interquartile_ranges(rng):
    fast = rng.normal(10, 0.5, 50)
    slow = rng.normal(20, 0.5, 50)
    assert compare("a", slow, "b", fast)[0] == "slower"
    assert compare("a", fast, "b", slow)[0] == "faster"
    kind, sentence = compare("a", fast, "b", fast + rng.normal(0, 0.5, 50))
    assert kind == "noise" and "within this machine's noise" in sentence
    s = spread([3, 1, 2])
    assert s["median"] == 2 and s["q25"] <= 2 <= s["q75"] and s["n"] == 3
    with pytest.raises(ValueError, match="need one or more finite samples"):
        spread([])


def test_exchange_volume_counts_padded_buckets_to_peers(rng):
    keys = rng.integers(0, 10_000, size=(256, 26))
    v1 = cost.exchange_volume(keys, 1)
    assert v1["bytes"] == 0 and v1["collectives"] == 0
    for n in (2, 4, 8):
        v = cost.exchange_volume(keys, n)
        local = keys.reshape(n, -1)
        P = max(np.bincount(k % n, minlength=n).max() for k in local)
        assert v["collectives"] == 8
        assert v["bytes"] == (n - 1) * P * (2 * 8 + 2 * 4 * (8 + 1))
        assert v["pad"] >= 1
    # a batch whose keys all belong to rank 0: the buffers are padded to the full bucket
    skew = np.zeros((4, 2), np.int64)
    assert cost.exchange_volume(skew, 2, dims=(4,))["bytes"] == 4 * (8 + 2 * 4 * 4)
    with pytest.raises(ValueError, match="workers=3"):
        cost.exchange_volume(keys, 3)


def test_link_fit_and_prediction_arithmetic():
    link = cost.fit_link([2.0, 2.0, 2.0], [12.0, 12.0, 12.0], big_bytes=5_000_004)
    assert link["alpha_ms"] == 2.0 and link["ms_per_mb"] == pytest.approx(2.0)
    ex = cost.explain_exchange(link, {"collectives": 8, "bytes": 1_000_000}, [25.0, 26.0, 27.0])
    assert ex["predicted_ms"] == pytest.approx(18.0) and ex["residual_ms"] == pytest.approx(8.0)
    vol = {"collectives": 8, "bytes": 1_000_000}
    two = cost.predict_step(24.0, 2, vol, 2.0, 2.0, dense_bytes=500_000, extra_ms=5.0)
    # 24/2 compute + 10 calls x 2 ms + (1 MB + 2 (1/2) 0.5 MB) x 2 ms/MB + 5
    assert two["step_ms"] == pytest.approx(12 + 20 + 3 + 5) and two["exchange_ms"] == pytest.approx(28)
    four = cost.predict_step(24.0, 4, vol, 2.0, 2.0, dense_bytes=500_000)
    assert four["compute_ms"] == 6 and four["bytes_ms"] == pytest.approx((1 + 2 * 3 / 4 * 0.5) * 2)
    one = cost.predict_step(24.0, 1, {"collectives": 0, "bytes": 0}, 2.0, 2.0, extra_ms=5.0)
    assert one["exchange_ms"] == 0 and one["step_ms"] == 24
    with pytest.raises(ValueError, match="workers must be >= 1"):
        cost.predict_step(1.0, 0, vol, 1.0, 1.0)
    assert cost.deepfm_dense_bytes(dim=8, hidden=(64, 32)) == 4 * ((26 * 8 + 13) * 64 + 64 + 64 * 32 + 32 + 32 + 1 + 13)
    with pytest.raises(ValueError, match="big_bytes"):
        cost.fit_link([1], [2], big_bytes=4)


def test_shard_bytes_split_rows_like_distributed_tables():
    assert cost.shard_bytes(17, 3, 2, slots=0) == [9 * 12, 8 * 12]
    assert sum(cost.shard_bytes(1001, 8, 4)) == 1001 * 8 * 4 * 2
    with pytest.raises(ValueError, match="workers=0"):
        cost.shard_bytes(10, 2, 0)


def test_memory_probe_on_two_workers_holds_half_the_table_each(tmp_path):
    import json
    import subprocess
    import sys
    out = tmp_path / "mem.json"
    cmd = [sys.executable, "-m", "embedlab.sok.launch", "-n", "2", "--timeout", "300", "-m", "embedlab.tutorials.sok_cost",
           "--rows", "20001", "--dim", "8", "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=360)
    assert p.returncode == 0, f"{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    ranks = json.loads(out.read_text())["ranks"]
    assert [r["shard_bytes"] for r in ranks] == cost.shard_bytes(20001, 8, 2) == [10001 * 8 * 4 * 2, 10000 * 8 * 4 * 2]
    assert all(r["peak_rss_mib"] >= r["rss_before_mib"] > 0 for r in ranks)


def _runs(rng, step2, exchange):
    one = {"step_samples_ms": list(rng.normal(10, 0.2, 20))}
    S = {"probe small": [2.0] * 15, "probe big": [2.0 + 4 * 2 ** 18 / 1e6 * 5] * 15, "exchange": list(exchange)}
    parts = {"lookup": 2.0, "dense": 2.0, "embedding update": 1.0, "exchange": float(np.median(exchange))}
    two = {"step_samples_ms": list(step2), "breakdown_samples_ms": S, "breakdown_ms": parts,
           "probe_bytes": {"small": 4, "big": 4 * 2 ** 18}}
    return one, two


def test_step_model_reads_the_residual_against_the_noise(rng):
    keys = rng.integers(0, 10_000, size=(512, 26))
    links = {"fitted": None, "fast": (0.02, 1 / 450)}
    one, two = _runs(rng, rng.normal(30, 0.3, 20), rng.normal(17, 0.2, 15))
    fit = cost.step_model(one, two, keys, links)
    assert fit["link"]["alpha_ms"] == 2.0 and fit["link"]["ms_per_mb"] == pytest.approx(5.0, rel=1e-4)
    text = "\n".join(fit["lines"])
    # model: 5 compute + 10 x 2 ms + bytes x 5 ms/MB; measured 30 with a 0.2 ms spread
    assert "The measured step is above the model by more than its noise" in text and "compute:" in text
    assert "fast: the model's step beats one worker's from 2 workers on" in text
    assert "fitted: no step up to 8 workers beats one worker's" in text
    p2 = fit["model2"]["step_ms"]
    one, two = _runs(rng, rng.normal(p2, 5.0, 20), rng.normal(17, 0.2, 15))
    text = "\n".join(cost.step_model(one, two, keys, links)["lines"])
    assert "within the measured step's noise" in text and "compute:" not in text


def test_link_fit_bounds_an_unresolved_bandwidth():
    link = cost.fit_link([5.0, 10.0, 15.0], [6.0, 11.0, 14.0], big_bytes=4_000_004)
    assert not link["resolved"]
    assert link["ms_per_mb"] == pytest.approx((12.5 - 7.5) / 4.0)        # q75(big) - q25(small), per MB
    assert cost.fit_link([1.0, 1.1, 1.2], [9.0, 9.1, 9.2], big_bytes=4_000_004)["resolved"]
