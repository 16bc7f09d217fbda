"""Notebook 05's reading of a Redis outage run: its sentences follow the numbers (a winner only
outside the noise, the write-back described as it happened)."""
from __future__ import annotations

import pytest

from embedlab.tutorials.hps_demo import TIERS, StreamRun, outage_report


def _run(name, latencies, volatile_ms=1.0, volatile_keys=100, persistent_ms=0.0, persistent_keys=0, inserted=None,
         events=None):
    r = StreamRun(name)
    n = len(latencies)
    r.latency_ms = list(latencies)
    r.cpu_ms = [x / 2 for x in latencies]
    r.preempted = [0] * n
    per = {"cache": (0.1, 300), "volatile": (volatile_ms, volatile_keys), "persistent": (persistent_ms, persistent_keys)}
    for t in TIERS:
        r.tier_ms[t] = [per[t][0]] * n
        r.tier_keys[t] = [per[t][1]] * n
        r.tier_inserted[t] = list(inserted) if (t == "volatile" and inserted is not None) else [0] * n
    r.exact = [True] * n
    r.events = events or {}
    return r


def test_outage_report_names_a_winner_only_outside_the_noise():
    events = {10: "Redis killed", 16: "Redis restarted, empty"}
    outage = _run("o", [5.0] * 10 + [9.0] * 6 + [6.0] * 4, inserted=[0] * 16 + [50, 40, 20, 10], events=events)
    same = _run("same", [4.8 + 0.02 * i for i in range(20)])       # spans 5.0
    rocks = _run("rocks", [2.0] * 20, volatile_ms=0.0, volatile_keys=0, persistent_ms=1.0, persistent_keys=300)
    text = "\n".join(outage_report(outage, same, rocks))
    assert "Redis down is 1.8x slower than Redis up" in text
    assert "within this machine's noise" in text                       # Redis up against the same stack
    assert '"Redis up" in this run is 2.5x slower than RocksDB alone' in text
    assert ("120 rows the cache missed were written into Redis over this phase's 4 lookups (50 at its first "
            "lookup, 10 at its last, fewer as Redis fills up)") in text


def test_outage_report_says_when_nothing_was_written_back():
    events = {4: "Redis killed", 8: "Redis restarted, empty"}
    outage = _run("o", [5.0] * 12, events=events)
    rocks = _run("rocks", [5.0] * 12)
    text = "\n".join(outage_report(outage, outage, rocks))
    assert "no row the cache missed was written into Redis" in text and "fills up" not in text
    with pytest.raises(ValueError, match="no phase 'Redis killed'"):
        outage_report(_run("x", [1.0] * 4), outage, rocks)


def test_stacks_report_reads_the_three_stacks():
    from embedlab.tutorials.hps_demo import stacks_report
    hm = _run("cache -> hash_map", [0.5] * 10, volatile_ms=0.1)
    red = _run("cache -> Redis -> RocksDB", [5.0] * 9 + [20.0], volatile_ms=4.0, volatile_keys=200)
    rock = _run("RocksDB only", [2.0] * 10, volatile_ms=0.0, volatile_keys=0, persistent_ms=1.5, persistent_keys=300)
    text = "\n".join(stacks_report([hm, red, rock], 1.8))
    assert "Per key, Redis costs 4.0x RocksDB" in text                     # 20 us against 5 us
    assert "cache -> Redis -> RocksDB is 2.5x slower than RocksDB alone" in text
    assert "cache -> Redis -> RocksDB: 1 of 10 lookups took more than twice the median" in text
    with pytest.raises(ValueError, match="3 runs"):
        stacks_report([hm], 1.0)


def _points(p50s, rows):
    """sweep-like points for batches 1 and 1024, 1 and 4 clients, from {(batch, clients): value}."""
    return [{"batch": b, "concurrency": c, "requests": 10, "p50_ms": p50s[b, c], "p99_ms": 2 * p50s[b, c],
             "rows_per_s": rows[b, c], "requests_per_s": rows[b, c] / b} for b in (1, 1024) for c in (1, 4)]


def test_sweep_rounds_and_serving_report_follow_the_spread():
    from embedlab.tutorials.hps_demo import serving_report, sweep_rounds
    rounds = iter([
        _points({(1, 1): 1.0, (1, 4): 2.0, (1024, 1): 3.0, (1024, 4): 6.0},
                {(1, 1): 1000, (1, 4): 2000, (1024, 1): 3e5, (1024, 4): 3.1e5}),
        _points({(1, 1): 1.1, (1, 4): 2.1, (1024, 1): 3.2, (1024, 4): 6.1},
                {(1, 1): 1100, (1, 4): 2100, (1024, 1): 3.2e5, (1024, 4): 2.9e5}),
        _points({(1, 1): 0.9, (1, 4): 1.9, (1024, 1): 3.1, (1024, 4): 5.9},
                {(1, 1): 900, (1, 4): 1900, (1024, 1): 3.1e5, (1024, 4): 3.0e5})])
    pts = sweep_rounds(lambda: next(rounds), rounds=3)
    p = {(x["batch"], x["concurrency"]): x for x in pts}
    assert p[1, 1]["p50_ms"] == 1.0 and p[1, 1]["requests"] == 30 and p[1024, 1]["p50_ms_rounds"] == [3.0, 3.2, 3.1]
    text = "\n".join(serving_report(pts, 2))
    assert "a request of 1,024 samples is 3.1x slower than a request of 1" in text
    assert "A straight line through those two points" in text
    assert "Concurrency at batch 1: 4 clients: 2.0x the rate of one client" in text
    assert "Concurrency at batch 1,024: 4 clients (" in text and "within this machine's noise" in text
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        sweep_rounds(lambda: [], rounds=0)
