"""Fixtures of the embedlab.data tests: one small generated Criteo dataset per session.

`rng` and `run_seed` (the run's seed, printed; EMBEDLAB_TEST_SEED replays it) come from
helpers/tests/conftest.py.
"""
from __future__ import annotations

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
