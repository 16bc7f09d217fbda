"""The thread pools of `_embedlab_core` (csrc/py/common.h: one pool per thread count, made on first
use and never destroyed) under callers that release the GIL at the same time.

Python threads call the kernels concurrently, each with a thread count of its own that changes
from call to call. A pool that a later call replaced while an earlier caller still ran on it
(with the GIL released) is freed under that caller: the process crashes, hangs, or writes wrong
rows. The calls run in a child process so that a crash or a hang fails this test instead of
taking pytest down.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent("""
    import sys, threading
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    import gpu_arrays
    core = gpu_arrays.load_core()
    seed, n_threads, iters = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    rng = np.random.default_rng(seed)
    rows, dim, batch, hot = 20000, 32, 2048, 8
    table = rng.standard_normal((rows, dim), dtype=np.float32)
    offsets = np.arange(0, batch * hot + 1, hot, dtype=np.int64)
    keys = rng.integers(0, rows, batch * hot, dtype=np.int64)
    want = np.empty((batch, dim), np.float32)
    core.lookup_forward([table], [offsets], [keys], None, ["sum"], [want], num_threads=1)
    rkeys = rng.integers(0, 1 << 40, 200000, dtype=np.int64)
    roff = np.array([0, len(rkeys)], np.int64)
    rwant = core.route_keys(rkeys, roff, [2], [0], [0], 4, -1, 1)
    bad = []
    gate = threading.Barrier(n_threads)

    def work(i):
        out = np.empty_like(want)
        gate.wait()
        for it in range(iters):
            t = 1 + (i + it) % 4  # every call a different count from its neighbours'
            out.fill(np.nan)
            core.lookup_forward([table], [offsets], [keys], None, ["sum"], [out], num_threads=t)
            if not np.array_equal(out, want):
                bad.append(f"lookup_forward, thread {i}, call {it}, num_threads {t}")
            got = core.route_keys(rkeys, roff, [2], [0], [0], 4, -1, t)
            if not all(np.array_equal(a, b) for a, b in zip(got[:3], rwant[:3])) or got[3] != rwant[3]:
                bad.append(f"route_keys, thread {i}, call {it}, num_threads {t}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("wrong results:", bad[:5] if bad else "none")
    sys.exit(1 if bad else 0)
""")


def test_concurrent_callers_with_different_thread_counts(run_seed):
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    try:
        r = subprocess.run([sys.executable, "-c", _CHILD, str(_TESTS), str(run_seed), "4", "60"],
                           capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"concurrent kernel calls hung (a pool was replaced under a caller?):\n"
                             f"{(e.stdout or b'')[-2000:]!r}\n{(e.stderr or b'')[-2000:]!r}") from None
    assert r.returncode == 0, (f"concurrent kernel calls with different thread counts failed "
                               f"(exit status {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    assert "wrong results: none" in r.stdout
