"""Fixtures of the Session tests (the data builders are in sessionlib.py)."""
from __future__ import annotations

import os
import time
import zlib

import numpy as np
import pytest


SEED = int(os.environ.get("EMBEDLAB_TEST_SEED", time.time_ns() % 2**31))


@pytest.fixture()
def rng(request):
    print(f"seed {SEED} (EMBEDLAB_TEST_SEED={SEED} replays)")
    return np.random.default_rng([SEED, zlib.crc32(request.node.name.encode())])
