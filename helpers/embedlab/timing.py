"""Timing helpers for notebooks and benchmarks that compare cases on a shared, noisy machine.

`interleaved_ms` calls every case once per round, in turn, so a slow phase of the machine (other
processes, a VM's neighbours) hits all cases alike, and reports each case's median. Compare
cases measured in one call; absolute times move between runs.

`interleaved_samples` keeps every round's time, and `compare` turns two cases' samples into a
verdict whose words follow the numbers and their spread: a difference that the spread of the
rounds covers is reported as "within this machine's noise", not as a winner.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

__all__ = ["interleaved_ms", "interleaved_samples", "spread", "format_spread", "Comparison", "compare"]


def _wait(result) -> None:
    # Eager TensorFlow returns before a kernel finishes only on GPUs; reading one value makes the
    # timing include the work either way (and costs a small copy).
    while isinstance(result, (list, tuple)) and result:
        result = result[0]
    if isinstance(result, dict) and result:
        result = next(iter(result.values()))
    if hasattr(result, "numpy"):
        result.numpy()


def interleaved_samples(cases: Mapping[str, Callable[[], object]], repeats: int = 9,
                        warmup: int = 1) -> dict:
    """Milliseconds of every timed round per case, the cases called in turn within each round.

    Args:
        cases: name -> a callable without arguments (e.g. `lambda: step(x)`).
        repeats: timed rounds. warmup: untimed rounds first (tracing, caches).

    Returns:
        {name: float64 array of `repeats` ms}, in the order of `cases`; element i of every
        array comes from the same round, so per-round ratios of two cases are paired.

    Example:
        >>> t = interleaved_samples({"a": lambda: sum(range(1000)), "b": lambda: None}, repeats=3)
        >>> [len(v) for v in t.values()]
        [3, 3]
    """
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"interleaved_samples: repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 0:
        raise ValueError(f"interleaved_samples: warmup must be an integer >= 0, got {warmup!r}")
    times = {name: [] for name in cases}
    for r in range(warmup + repeats):
        for name, fn in cases.items():
            t0 = time.perf_counter()
            _wait(fn())
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * np.asarray(t, dtype=np.float64) for name, t in times.items()}


def interleaved_ms(cases: Mapping[str, Callable[[], object]], repeats: int = 9, warmup: int = 1) -> dict:
    """Median milliseconds per case, the cases called in turn within each of `repeats` rounds.

    Args:
        cases: name -> a callable without arguments (e.g. `lambda: step(x)`).
        repeats: timed rounds. warmup: untimed rounds first (tracing, caches).

    Returns:
        {name: median ms}, in the order of `cases`. `interleaved_samples` keeps every round.

    Example:
        >>> t = interleaved_ms({"a": lambda: sum(range(1000)), "b": lambda: sum(range(10))}, repeats=3)
        >>> sorted(t) == ["a", "b"]
        True
    """
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"interleaved_ms: repeats must be >= 1, got {repeats}")
    return {name: float(np.median(t)) for name, t in interleaved_samples(cases, repeats, warmup).items()}


def _samples(values, arg: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"{arg}: need one or more finite samples, got {np.asarray(values).tolist()!r}")
    return x


def spread(samples: Sequence[float]) -> tuple:
    """(median, 25th percentile, 75th percentile) of repeated measurements.

    The middle half of the samples is the spread this module reports: robust to the odd slow
    round a loaded machine gives, and with 5+ samples, wider than a single lucky pair.

    Example:
        >>> spread([1.0, 2.0, 3.0, 4.0, 100.0])
        (3.0, 2.0, 4.0)
    """
    x = _samples(samples, "spread: samples")
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    return float(med), float(q1), float(q3)


def format_spread(samples: Sequence[float], fmt: str = ".2f", unit: str = " ms") -> str:
    """'median unit (q1-q3)' of repeated measurements, e.g. '4.31 ms (4.20-4.55)'.

    Example:
        >>> format_spread([1.0, 2.0, 3.0, 4.0, 100.0], ".1f")
        '3.0 ms (2.0-4.0)'
    """
    med, q1, q3 = spread(samples)
    return f"{med:{fmt}}{unit} ({q1:{fmt}}-{q3:{fmt}})"


def _capitalized(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class Comparison:
    """Two cases' costs compared: `ratio` = cost of `b` / cost of `a` (> 1: `a` is faster).

    `low`, `high`: the spread of that ratio (the middle half of the per-round ratios for paired
    samples; for unpaired ones, the ratios of the two cases' quartiles, crossed so the range is
    the wider one). `verdict` is "a", "b" (the faster case's name) or "noise" when the range
    holds 1 or the median ratio is within `tolerance` of 1.
    """
    a: str
    b: str
    ratio: float
    low: float
    high: float
    rounds: int
    paired: bool
    tolerance: float = 0.0

    @property
    def verdict(self) -> str:
        if self.low <= 1.0 <= self.high or abs(self.ratio - 1.0) <= self.tolerance:
            return "noise"
        return self.a if self.ratio > 1.0 else self.b

    @property
    def faster(self):
        """The faster case's name, or None where the difference is within the noise."""
        return None if self.verdict == "noise" else self.verdict

    def _faster_range(self) -> tuple:
        """(median, low, high) of how many times as fast the faster case is (a's within noise)."""
        if self.ratio >= 1.0 or self.verdict == "noise":
            return self.ratio, self.low, self.high
        return 1 / self.ratio, 1 / self.high, 1 / self.low

    def times(self) -> str:
        """'1.23x (1.10-1.31x)': how many times as fast the faster case is (a's, within noise)."""
        r, lo, hi = self._faster_range()
        return f"{r:.2f}x ({lo:.2f}-{hi:.2f}x)"

    def sentence(self) -> str:
        """One sentence whose words follow the numbers, e.g. 'A was 1.23x as fast as B (...)'."""
        how = ("the middle half of the per-round ratios" if self.paired else
               "the ratio of the two cases' quartiles")
        if self.verdict == "noise":
            return _capitalized(f"{self.a} and {self.b} are within this machine's noise of each other: {self.b} "
                                f"took {self.ratio:.2f}x the time of {self.a}, and {how} over {self.rounds} rounds "
                                f"spans {self.low:.2f}-{self.high:.2f}x, which holds 1")
        win, lose = (self.a, self.b) if self.ratio > 1 else (self.b, self.a)
        r, lo, hi = self._faster_range()
        return _capitalized(f"{win} was {r:.2f}x as fast as {lose} ({how} over {self.rounds} rounds: "
                            f"{lo:.2f}-{hi:.2f}x)")


def compare(a_samples: Sequence[float], b_samples: Sequence[float], a: str = "A", b: str = "B", *,
            paired: bool = True, higher_is_better: bool = False, tolerance: float = 0.0) -> Comparison:
    """Compares two cases from repeated measurements, with the spread, for a verdict in words.

    Args:
        a_samples, b_samples: the cases' measurements (ms per call, or a rate such as samples/s
            with `higher_is_better=True`).
        a, b: the cases' names for the sentence.
        paired: the samples come from the same rounds (`interleaved_samples`), so element i of
            each was measured side by side; the spread is then that of the per-round ratios.
            Unpaired (e.g. two training runs' step times), the spread is crossed quartiles.
        higher_is_better: the samples are rates, not costs.
        tolerance: a median ratio within this of 1 also counts as noise (a difference too small
            to matter, e.g. 0.02).

    Returns:
        `Comparison`; its `verdict` names the faster case or says "noise", and `sentence()`
        words it.

    Raises:
        ValueError: empty or non-finite samples, non-positive values, or paired samples of
            different lengths.

    Example:
        >>> c = compare([10, 11, 10, 12, 10], [20, 21, 19, 22, 20], "fused", "unfused")
        >>> c.verdict, round(c.ratio, 2)
        ('fused', 1.91)
        >>> compare([10, 12, 9, 11], [11, 10, 12, 9], "x", "y").verdict
        'noise'
    """
    xa, xb = _samples(a_samples, "compare: a_samples"), _samples(b_samples, "compare: b_samples")
    if (xa <= 0).any() or (xb <= 0).any():
        raise ValueError(f"compare: samples must be > 0, got {xa.tolist()} and {xb.tolist()}")
    if tolerance < 0:
        raise ValueError(f"compare: tolerance must be >= 0, got {tolerance}")
    ca, cb = (1 / xa, 1 / xb) if higher_is_better else (xa, xb)      # costs
    if paired:
        if len(ca) != len(cb):
            raise ValueError(f"compare: paired samples need the same length, got {len(ca)} and {len(cb)}")
        ratio, low, high = spread(cb / ca)
    else:
        ma, la, ha = spread(ca)
        mb, lb, hb = spread(cb)
        ratio, low, high = mb / ma, lb / ha, hb / la
    return Comparison(a, b, ratio, low, high, int(min(len(ca), len(cb))), paired, float(tolerance))
