"""Fixtures for the serving tests: a small exported model and ONE shared real Triton server."""
from __future__ import annotations

import pytest

from serving_export import MAX_BATCH, make_export


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory, run_seed):
    return make_export(tmp_path_factory.mktemp("serving") / "export", seed=run_seed)


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
