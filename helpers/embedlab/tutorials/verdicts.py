"""Spread-aware verdicts for the notebooks, in the shapes notebooks 04-06 print: a sentence about
two sets of measurements that names a winner only when their interquartile ranges do not overlap,
and otherwise says the difference is within this machine's noise.

The statistics are :mod:`embedlab.timing`'s (`spread`, and `compare` with unpaired samples, whose
ratio range holds 1 exactly when the two interquartile ranges overlap); this module only words
them and adds the medians with their ranges.
"""
from __future__ import annotations

from .. import timing

__all__ = ["spread", "compare", "compare_rates"]


def spread(samples_ms) -> dict:
    """Median and interquartile range of timings.

    Args:
        samples_ms: repeated timings (ms) of one thing.

    Returns:
        {"median", "q25", "q75", "n"} in ms.

    Raises:
        ValueError: no samples, or a non-finite one.

    Example:
        >>> spread([1.0, 2.0, 3.0, 4.0, 100.0])["median"]
        3.0
    """
    med, q25, q75 = timing.spread(samples_ms)
    return {"median": med, "q25": q25, "q75": q75, "n": len(list(samples_ms))}


def _fmt(s: dict, unit: str = " ms", digits: str = ".1f") -> str:
    return (f"{s['median']:{digits}}{unit} (interquartile {s['q25']:{digits}}-{s['q75']:{digits}}, "
            f"{s['n']} runs)")


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
    c = timing.compare(a_ms, b_ms, name_a, name_b, paired=False)
    if c.verdict == "noise":
        return "noise", (f"{name_a} ({_fmt(a)}) and {name_b} ({_fmt(b)}) are within this machine's noise: "
                         "their interquartile ranges overlap")
    kind = "faster" if c.ratio > 1 else "slower"
    word = f"{c.ratio:.1f}x faster than" if kind == "faster" else f"{1 / c.ratio:.1f}x slower than"
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
    c = timing.compare(a, b, name_a, name_b, paired=False, higher_is_better=True)
    if c.verdict == "noise":
        return "noise", (f"{name_a} ({_fmt(sa, unit, ',.0f')}) and {name_b} ({_fmt(sb, unit, ',.0f')}) are "
                         "within this machine's noise: their interquartile ranges overlap")
    kind = "higher" if c.ratio > 1 else "lower"
    return kind, (f"{name_a}: {sa['median'] / sb['median']:.{1 if kind == 'higher' else 2}f}x the rate of "
                  f"{name_b}, {_fmt(sa, unit, ',.0f')} against {_fmt(sb, unit, ',.0f')}")
