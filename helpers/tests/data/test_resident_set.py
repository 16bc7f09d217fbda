"""embedlab.data.resident_set.peak_rss: the peak resident memory of work done in a fresh process."""
import os
from pathlib import Path

import pytest

from embedlab.data import resident_set

HERE = Path(__file__).resolve().parent


@pytest.fixture
def child_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    import _memory_target  # noqa: F401  (also importable here, for the function objects)
    return _memory_target


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="peak_rss reads /proc/self/status (Linux)")
def test_peak_rss_sees_the_work_and_not_the_caller(child_path):
    big, mem_big = resident_set.peak_rss(child_path.allocate, 160)
    small, mem_small = resident_set.peak_rss(child_path.allocate, 8)
    assert big == 160 << 18 and small == 8 << 18
    assert 150 <= mem_big.added_mib <= 400, mem_big
    assert mem_small.added_mib < 60, mem_small                   # not this process's memory
    assert mem_big.peak_mib >= mem_big.base_mib > 0


def test_peak_rss_reports_the_child_error(child_path):
    with pytest.raises(RuntimeError, match="allocate|fail") as e:
        resident_set.peak_rss(child_path.fail, "bad input 42")
    assert "bad input 42" in str(e.value)


def test_peak_rss_refuses_functions_a_child_cannot_import():
    def local():
        return 1
    with pytest.raises(ValueError, match="local function"):
        resident_set.peak_rss(local)
