"""Peak resident memory of a piece of work, measured in a fresh process.

`peak_rss(fn, *args)` runs `fn(*args)` in a new Python interpreter, so the numbers are the
work's own and not the caller's history: `base_mib` is the resident set after the imports
`preload` names, `peak_mib` the highest resident set while `fn` ran (Linux `VmHWM`, reset
before `fn` through /proc/self/clear_refs where the kernel allows it, else the process's peak
since it started). `fn` must be a module-level function of an importable module; arguments and
result travel by pickle.

    >>> from embedlab.data import criteo, resident_set
    >>> txt = criteo.generate("day.txt", rows=2000, seed=0, progress=False)
    >>> _ = criteo.preprocess(txt, "parquet", progress=False)
    >>> rows, mem = resident_set.peak_rss(resident_set.loader_epoch, "parquet/train", 512,
    ...                                     preload=("tensorflow",))
    >>> rows                                # the loader's return value
    1599
    >>> mem                                 # mem.added_mib: what one loader epoch added
    MemoryUse(base_mib=..., peak_mib=...)
"""
from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["MemoryUse", "peak_rss", "loader_epoch"]


@dataclass(frozen=True)
class MemoryUse:
    base_mib: float     # resident set after the preloaded imports, before the work
    peak_mib: float     # highest resident set during the work

    @property
    def added_mib(self) -> float:
        return self.peak_mib - self.base_mib


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field} (peak_rss needs Linux)")


def _child(job: str) -> None:
    with open(job, "rb") as f:
        module, qualname, args, kwargs, preload = pickle.load(f)
    for name in preload:
        importlib.import_module(name)
    fn = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    base = _status_kib("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")       # resets VmHWM to the current RSS
    except OSError:
        pass
    result = fn(*args, **kwargs)
    peak = _status_kib("VmHWM")
    with open(job, "wb") as f:
        pickle.dump((result, base, peak), f)


def peak_rss(fn, *args, preload=(), **kwargs):
    """Runs `fn(*args, **kwargs)` in a fresh interpreter; returns `(its result, MemoryUse)`.

    Args:
        fn: a module-level function of an importable module; its arguments and result pickle.
        preload: modules imported before `base_mib` is taken (e.g. ("tensorflow",)), so their
            memory counts as base, not as the work's.

    Raises:
        RuntimeError: `fn` failed (the message holds the child's error output).
    """
    if "." in fn.__qualname__.split("<locals>")[0] and "<locals>" in fn.__qualname__:
        raise ValueError(f"peak_rss: {fn.__qualname__} is a local function; pass a module-level one")
    if fn.__module__ == "__main__":
        raise ValueError(f"peak_rss: {fn.__name__} is defined in __main__; put it in a module")
    fd, job = tempfile.mkstemp(suffix=".pkl", prefix="embedlab_peak_rss_")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump((fn.__module__, fn.__qualname__, args, kwargs, tuple(preload)), f)
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        r = subprocess.run([sys.executable, "-c", "import sys; from embedlab.data.resident_set import _child; "
                            "_child(sys.argv[1])", job], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError(f"peak_rss: {fn.__qualname__} failed in the child process "
                               f"(exit code {r.returncode}):\n{r.stderr[-3000:]}")
        with open(job, "rb") as f:
            result, base, peak = pickle.load(f)
    finally:
        os.unlink(job)
    return result, MemoryUse(base / 1024.0, peak / 1024.0)


def loader_epoch(path, batch_size: int, **loader_kwargs) -> int:
    """One epoch of `ParquetLoader(path, batch_size, **loader_kwargs)`; returns the rows read."""
    from .loader import ParquetLoader
    rows = 0
    for _, y in ParquetLoader(path, batch_size, **loader_kwargs):
        rows += int(y.shape[0])
    return rows
