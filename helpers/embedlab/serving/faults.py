"""Fault injection under load: kill the HPS's Redis tier while the server answers requests.

The served HPS falls through to the tiers that remain (embedding cache, RocksDB, which holds
every row), so every request must still succeed with the exact answer; the outage shows in the
HPS statistics that the `hps_embedding` model publishes on the metrics endpoint.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from .client import LoadResult, client_for, hps_stats, infer, run_load

__all__ = ["FaultRun", "kill_during_load"]


@dataclass
class FaultRun:
    result: LoadResult
    killed_at_s: float | None                 # seconds after the load started
    stats_before: dict = field(repr=False)
    stats_after: dict = field(repr=False)

    def changed(self, prefix: str = "tiers.volatile.") -> dict:
        """{stat: (before, after)} for the stats under `prefix` that changed."""
        keys = sorted(k for k in self.stats_after if k.startswith(prefix))
        return {k: (self.stats_before.get(k), self.stats_after[k]) for k in keys
                if self.stats_before.get(k) != self.stats_after[k]}


def kill_during_load(server, kill, key_batches, expected, *, kill_after_s: float = 1.0,
                     duration_s: float = 3.0, concurrency: int = 2, protocol: str = "http",
                     atol: float = 1e-5, outage_stat: str = "tiers.volatile.outages",
                     settle_s: float = 3.0) -> FaultRun:
    """Runs `run_load` and calls `kill()` (e.g. `redis.kill`) `kill_after_s` into it.

    After the run, a few more requests are sent until the HPS statistics show the outage
    (`outage_stat` above its value before), for at most `settle_s`: a tier is found down only
    by a lookup that reaches it, and a run answered from the cache alone may have none.

    Returns:
        `FaultRun` with the load result (failed / wrong counts, latencies over time), the time
        of the kill, and the HPS statistics before and after.
    """
    before = hps_stats(server)
    state = {"at": None}
    lock = threading.Lock()

    def on_progress(elapsed):
        if elapsed >= kill_after_s:
            with lock:
                if state["at"] is None:
                    state["at"] = elapsed
                    kill()

    res = run_load(server, key_batches, expected=expected, atol=atol, protocol=protocol,
                   concurrency=concurrency, duration_s=duration_s, on_progress=on_progress)
    after = hps_stats(server)
    deadline = time.monotonic() + settle_s
    with client_for(server, protocol) as c:
        while after.get(outage_stat, 0) <= before.get(outage_stat, 0) and time.monotonic() < deadline:
            out = infer(c, key_batches[0])
            if expected is not None and not np.allclose(out, expected[0], rtol=0, atol=atol):
                res.wrong += 1
                res.errors.append("wrong answer after the run, batch 0")
            time.sleep(0.05)
            after = hps_stats(server)
    return FaultRun(result=res, killed_at_s=state["at"], stats_before=before, stats_after=after)
