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
    assert "50 rows at the phase's first lookup, 10 at its last, fewer as Redis fills up" in text


def test_outage_report_says_when_nothing_was_written_back():
    events = {4: "Redis killed", 8: "Redis restarted, empty"}
    outage = _run("o", [5.0] * 12, events=events)
    rocks = _run("rocks", [5.0] * 12)
    text = "\n".join(outage_report(outage, outage, rocks))
    assert "no row the cache missed was written into Redis" in text and "fills up" not in text
    with pytest.raises(ValueError, match="no phase 'Redis killed'"):
        outage_report(_run("x", [1.0] * 4), outage, rocks)
