"""Shared fixtures for the embedlab.data tests: one small generated Criteo dataset per session."""
from __future__ import annotations

import os
import time
import zlib

import numpy as np
import pytest


@pytest.fixture(scope="session")
def fresh_seed():
    """A new seed every run (printed, so a failure can be replayed with EMBEDLAB_TEST_SEED)."""
    seed = int(os.environ.get("EMBEDLAB_TEST_SEED", time.time_ns() % 2**31))
    print(f"\n[embedlab.data tests] seed = {seed} (set EMBEDLAB_TEST_SEED={seed} to replay)")
    return seed


@pytest.fixture(scope="session")
def criteo_small(tmp_path_factory, fresh_seed):
    """A generated Criteo TSV of 6,000 lines and its preprocessed parquet folder."""
    from embedlab.data import criteo
    d = tmp_path_factory.mktemp("criteo")
    txt = criteo.generate(d / "day.txt", rows=6000, seed=fresh_seed, progress=False)
    res = criteo.preprocess(txt, d / "pq", freq_threshold=3, row_group_rows=1000,
                            progress=False)
    return txt, res


@pytest.fixture()
def rng(fresh_seed, request):
    # Distinct stream per test, reproducible from the printed session seed.
    return np.random.default_rng([fresh_seed, zlib.crc32(request.node.name.encode())])
