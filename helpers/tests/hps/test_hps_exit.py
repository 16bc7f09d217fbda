"""A script that ends right after lookups whose rows the background inserter is still putting in
the embedding cache must exit 0. Without the exit hook the inserter thread was inside the compiled
cache's insert (GIL released) when Python finalized, and the process aborted (status 134,
"terminate called without an active exception") in 8 of 8 runs of this script."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from embedlab.sparse_model import write_sparse_model

from hps_testing import needs_native_tiers

pytestmark = needs_native_tiers

SCRIPT = textwrap.dedent("""
    import sys, numpy as np
    from embedlab.hps import ParameterServer
    cfg = {"volatile_db": {"type": "hash_map"},
           "models": [{"model": "m", "sparse_files": [sys.argv[1]], "embedding_vecsize_per_table": [32],
                       "gpucache": True, "gpucacheper": 0.5, "hit_rate_threshold": 0.0}]}
    ps = ParameterServer(cfg)          # never closed: the script just ends
    rng = np.random.default_rng(0)
    for i in range(60):                # every lookup queues a background cache insertion
        ps.lookup("m", 0, rng.integers(0, 100_000, 20_000))
    print("done", flush=True)
""")


def test_script_ending_with_background_insertions_queued_exits_cleanly(tmp_path):
    rng = np.random.default_rng(3)
    path = write_sparse_model(tmp_path / "t", np.arange(100_000, dtype=np.int64),
                              rng.standard_normal((100_000, 32)).astype(np.float32))
    (tmp_path / "s.py").write_text(SCRIPT)
    for run in range(5):
        r = subprocess.run([sys.executable, str(tmp_path / "s.py"), str(path)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "done", \
            f"run {run}: exit status {r.returncode}\n{r.stdout}\n{r.stderr[-2000:]}"
