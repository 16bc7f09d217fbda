"""Timing helpers for notebooks and benchmarks that compare cases on a shared, noisy machine.

`interleaved_ms` calls every case once per round, in turn, so a slow phase of the machine (other
processes, a VM's neighbours) hits all cases alike, and reports each case's median. Compare
cases measured in one call; absolute times move between runs.
"""
from __future__ import annotations

import time
from typing import Callable, Mapping

import numpy as np

__all__ = ["interleaved_ms"]


def _wait(result) -> None:
    # Eager TensorFlow returns before a kernel finishes only on GPUs; reading one value makes the
    # timing include the work either way (and costs a small copy).
    while isinstance(result, (list, tuple)) and result:
        result = result[0]
    if isinstance(result, dict) and result:
        result = next(iter(result.values()))
    if hasattr(result, "numpy"):
        result.numpy()


def interleaved_ms(cases: Mapping[str, Callable[[], object]], repeats: int = 9, warmup: int = 1) -> dict:
    """Median milliseconds per case, the cases called in turn within each of `repeats` rounds.

    Args:
        cases: name -> a callable without arguments (e.g. `lambda: step(x)`).
        repeats: timed rounds. warmup: untimed rounds first (tracing, caches).

    Returns:
        {name: median ms}, in the order of `cases`.

    Example:
        >>> t = interleaved_ms({"a": lambda: sum(range(1000)), "b": lambda: sum(range(10))}, repeats=3)
        >>> sorted(t) == ["a", "b"]
        True
    """
    if repeats < 1:
        raise ValueError(f"interleaved_ms: repeats must be >= 1, got {repeats}")
    times = {name: [] for name in cases}
    for r in range(warmup + repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            _wait(fn())
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}
