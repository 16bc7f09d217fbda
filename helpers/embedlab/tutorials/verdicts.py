"""Spread-aware verdicts for the notebooks: a sentence about two sets of timings that names a
winner only when their interquartile ranges do not overlap, and otherwise says the difference is
within this machine's noise."""
from __future__ import annotations

import numpy as np

__all__ = ["spread", "compare", "compare_rates"]


def spread(samples_ms) -> dict:
    """Median and interquartile range of timings.

    Args:
        samples_ms: repeated timings (ms) of one thing.

    Returns:
        {"median", "q25", "q75", "n"} in ms.

    Example:
        >>> spread([1.0, 2.0, 3.0, 4.0, 100.0])["median"]
        3.0
    """
    a = np.asarray(samples_ms, np.float64)
    if a.size == 0:
        raise ValueError("spread: samples_ms is empty")
    q25, med, q75 = np.percentile(a, [25, 50, 75])
    return {"median": float(med), "q25": float(q25), "q75": float(q75), "n": int(a.size)}


def _fmt(s: dict) -> str:
    return f"{s['median']:.1f} ms (interquartile {s['q25']:.1f}-{s['q75']:.1f}, {s['n']} runs)"


def compare(name_a: str, a_ms, name_b: str, b_ms) -> tuple[str, str]:
    """A verdict on two sets of timings that picks a winner only when their spreads do not overlap.

    Args:
        name_a, name_b: what was timed. a_ms, b_ms: repeated timings (ms) of each.

    Returns:
        (kind, sentence): kind is "slower" (a slower than b), "faster", or "noise" (the
        interquartile ranges overlap: within this machine's noise).

    Example:
        >>> compare("x", [10, 11, 12], "y", [1, 1.1, 1.2])[0]
        'slower'
        >>> compare("x", [1, 2, 3], "y", [2, 3, 4])[0]
        'noise'
    """
    a, b = spread(a_ms), spread(b_ms)
    if a["q25"] > b["q75"]:
        kind, word = "slower", f"{a['median'] / b['median']:.1f}x slower than"
    elif a["q75"] < b["q25"]:
        kind, word = "faster", f"{b['median'] / a['median']:.1f}x faster than"
    else:
        return "noise", (f"{name_a} ({_fmt(a)}) and {name_b} ({_fmt(b)}) are within this machine's noise: "
                         "their interquartile ranges overlap")
    return kind, f"{name_a} is {word} {name_b}: {_fmt(a)} against {_fmt(b)}; the ranges do not overlap"


def compare_rates(name_a: str, a, name_b: str, b, unit: str = "/s") -> tuple[str, str]:
    """Like `compare`, for rates (higher is better): "higher", "lower" or "noise".

    Args:
        name_a, name_b: what was measured. a, b: repeated rates of each. unit: printed after values.

    Returns:
        (kind, sentence).

    Example:
        >>> compare_rates("x", [10, 11, 12], "y", [1, 1.1, 1.2])[0]
        'higher'
    """
    sa, sb = spread(a), spread(b)
    def fmt(s):
        return f"{s['median']:,.0f}{unit} (interquartile {s['q25']:,.0f}-{s['q75']:,.0f}, {s['n']} runs)"
    if sa["q25"] > sb["q75"]:
        return "higher", f"{name_a}: {sa['median'] / sb['median']:.1f}x the rate of {name_b}, {fmt(sa)} against {fmt(sb)}"
    if sa["q75"] < sb["q25"]:
        return "lower", f"{name_a}: {sa['median'] / sb['median']:.2f}x the rate of {name_b}, {fmt(sa)} against {fmt(sb)}"
    return "noise", (f"{name_a} ({fmt(sa)}) and {name_b} ({fmt(sb)}) are within this machine's noise: their "
                     "interquartile ranges overlap")
