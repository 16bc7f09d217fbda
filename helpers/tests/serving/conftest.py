"""Fixtures for the serving tests: a small exported model and ONE shared real Triton server."""
from __future__ import annotations

import os
import time
import zlib

import numpy as np
import pytest

from serving_export import MAX_BATCH, make_export


@pytest.fixture(scope="session")
def serving_seed():
    """A new seed every run (printed, so a failure can be replayed with EMBEDLAB_TEST_SEED)."""
    seed = int(os.environ.get("EMBEDLAB_TEST_SEED", time.time_ns() % 2**31))
    print(f"\n[embedlab.serving tests] seed = {seed} (set EMBEDLAB_TEST_SEED={seed} to replay)")
    return seed


@pytest.fixture
def rng(serving_seed, request):
    return np.random.default_rng([serving_seed, zlib.crc32(request.node.name.encode())])


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory, serving_seed):
    return make_export(tmp_path_factory.mktemp("serving") / "export", seed=serving_seed)


@pytest.fixture(scope="session")
def repository(export_dir):
    from embedlab.serving import write_model_repository
    return write_model_repository(export_dir, export_dir.parent / "repository", max_batch_size=MAX_BATCH)


@pytest.fixture(scope="session")
def server(repository):
    """One real tritonserver for the tests that only send requests."""
    from embedlab.serving import TritonServer
    with TritonServer(repository, log_file=repository.parent / "triton.log") as s:
        yield s


@pytest.fixture(scope="session")
def reference(export_dir):
    from embedlab.serving import InProcessModel
    m = InProcessModel(export_dir, threads=1)
    yield m
    m.close()
