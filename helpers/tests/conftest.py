"""Fixtures and markers of every EmbedLab test (the folders' conftest.py files add their own).

* `rng`: a NumPy Generator per test, drawn from ONE seed per run (fresh each run) mixed with the
  test's name. The seed is printed (pytest shows it with a failure); `EMBEDLAB_TEST_SEED=<seed>`
  replays the run, and every test draws the same numbers alone as with the others.
  `run_seed` is that seed, for session fixtures and child processes.
* `core`: the framework-free module `_embedlab_core` (the installed package's, or a standalone
  build on PYTHONPATH with `EMBEDLAB_CORE_STANDALONE=1`).
* `@pytest.mark.needs_gpu` / `@pytest.mark.needs_gpu("CudaEmbeddingCache")`: skip, with the
  reason, unless the module has that CUDA entry point, a GPU is visible and PyTorch or CuPy can
  put arrays on it (`gpu_arrays.needs_gpu`, the one (bool, reason) check).

This folder is on sys.path, so the tests of every folder import `reference` and `gpu_arrays`.
"""
from __future__ import annotations

import pytest

import gpu_arrays
import reference


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_gpu(entry='cuda_device_count'): skip, with the reason, unless the module's CUDA "
                   "entry point `entry` exists, a GPU is visible and PyTorch or CuPy can use it")


def pytest_report_header(config):
    return f"EMBEDLAB_TEST_SEED={reference.RUN_SEED} (set it to replay this run's random draws)"


def pytest_runtest_setup(item):
    for mark in item.iter_markers("needs_gpu"):
        ok, reason = gpu_arrays.needs_gpu(*mark.args, **mark.kwargs)
        if not ok:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def run_seed():
    """This run's seed (fresh each run, EMBEDLAB_TEST_SEED to replay)."""
    return reference.RUN_SEED


@pytest.fixture
def rng(request):
    """A NumPy Generator of its own for this test (printed seed; EMBEDLAB_TEST_SEED replays)."""
    return reference.seeded_rng(request)


@pytest.fixture(scope="session")
def core():
    """The framework-free module `_embedlab_core`."""
    return gpu_arrays.load_core()


@pytest.fixture(scope="module")
def users_redis():
    """Stands for the user's Redis (compose's service): a real password-protected redis-server
    on 127.0.0.1, not started by the code under test."""
    from embedlab.services.redis_server import start_redis
    r = start_redis()
    yield r
    r.stop()


@pytest.fixture
def users_redis_env(monkeypatch, users_redis):
    """EMBEDLAB_REDIS_ADDRESS / EMBEDLAB_REDIS_PASSWORD name users_redis for one test."""
    from embedlab.services.redis_server import ADDRESS_ENV, PASSWORD_ENV
    monkeypatch.setenv(ADDRESS_ENV, users_redis.address)
    monkeypatch.setenv(PASSWORD_ENV, users_redis.password)
    return users_redis
