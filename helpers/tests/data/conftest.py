"""Fixtures of the embedlab.data tests: one small generated Criteo dataset per session, and
`kill_worker_during` (SIGKILL a Dask worker while it runs a given kind of task).

`rng` and `run_seed` (the run's seed, printed; EMBEDLAB_TEST_SEED replays it) come from
helpers/tests/conftest.py.
"""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest


@pytest.fixture(scope="session")
def criteo_small(tmp_path_factory, run_seed):
    """A generated Criteo TSV of 6,000 lines and its preprocessed parquet folder."""
    from embedlab.data import criteo
    d = tmp_path_factory.mktemp("criteo")
    txt = criteo.generate(d / "day.txt", rows=6000, seed=run_seed, progress=False)
    res = criteo.preprocess(txt, d / "pq", freq_threshold=3, row_group_rows=1000,
                            progress=False)
    return txt, res


def _kill_worker_during(client, run, key_prefix: str, timeout: float = 120.0):
    """Call `run()` in a thread; SIGKILL the process of the first worker seen processing a task
    whose key starts with `key_prefix`. Returns ({"res": run's result} or {"err": what it
    raised}, the killed pid); fails the test when no such task was caught running."""
    pids = client.run(os.getpid)
    out = {}

    def target():
        try:
            out["res"] = run()
        except BaseException as e:                         # noqa: BLE001 - the caller checks
            out["err"] = e

    t = threading.Thread(target=target)
    t.start()
    killed = None
    deadline = time.monotonic() + timeout
    while t.is_alive() and killed is None and time.monotonic() < deadline:
        for addr, keys in client.processing().items():
            if any(str(k).startswith(key_prefix) for k in keys):
                os.kill(pids[addr], signal.SIGKILL)
                killed = pids[addr]
                break
        time.sleep(0.005)
    t.join(300)
    assert not t.is_alive(), "the run did not end within 300 s of the kill"
    assert killed is not None, f"the run ended before a {key_prefix!r} task was caught running"
    return out, killed


@pytest.fixture
def kill_worker_during():
    """`kill_worker_during(client, run, key_prefix)`: see `_kill_worker_during`."""
    return _kill_worker_during
