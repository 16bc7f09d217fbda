"""embedlab.timing: interleaved rounds, spreads, and verdicts whose words follow the numbers."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab import timing


def test_interleaved_samples_keeps_every_round_in_turn():
    calls = []
    t = timing.interleaved_samples({"slow": lambda: (calls.append("s"), sum(range(100_000)))[1],
                                    "fast": lambda: calls.append("f")}, repeats=3, warmup=2)
    assert calls == ["s", "f"] * 5
    assert list(t) == ["slow", "fast"] and all(len(v) == 3 for v in t.values())
    assert np.median(t["slow"]) > np.median(t["fast"]) >= 0
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="repeats"):
            timing.interleaved_samples({"a": lambda: None}, repeats=bad)
    with pytest.raises(ValueError, match="warmup"):
        timing.interleaved_samples({"a": lambda: None}, warmup=-1)


def test_spread_and_format():
    rng = np.random.default_rng()
    x = rng.uniform(1, 2, 41)
    med, q1, q3 = timing.spread(x)
    assert (med, q1, q3) == tuple(np.percentile(x, [50, 25, 75]))
    assert timing.format_spread([1.0, 2.0, 3.0, 4.0, 100.0], ".1f") == "3.0 ms (2.0-4.0)"
    with pytest.raises(ValueError, match="samples"):
        timing.spread([])
    with pytest.raises(ValueError, match="samples"):
        timing.spread([1.0, float("nan")])


def test_compare_names_the_faster_case_only_outside_the_noise():
    rng = np.random.default_rng()
    base = rng.uniform(9, 11, 15)
    clear = timing.compare(base, 2 * base * rng.uniform(0.97, 1.03, 15), "fused", "unfused")
    assert clear.verdict == clear.faster == "fused" and 1.9 < clear.ratio < 2.1
    assert clear.sentence().startswith("Fused was") and "as fast as unfused" in clear.sentence()
    swapped = timing.compare(2 * base, base, "fused", "unfused")
    assert swapped.verdict == "unfused" and swapped.sentence().startswith("Unfused was 2.00x")
    # Ratios scattered on both sides of 1: no winner, whatever the median says.
    noisy = timing.compare(base, base * np.tile([0.8, 1.25, 1.1], 5), "x", "y")
    assert noisy.verdict == "noise" and noisy.faster is None
    assert "within this machine's noise" in noisy.sentence()
    # A clear but negligible difference counts as noise under a tolerance.
    tiny = timing.compare(base, base * 1.01, "x", "y", tolerance=0.02)
    assert tiny.verdict == "noise" and timing.compare(base, base * 1.01, "x", "y").verdict == "x"


def test_compare_rates_and_unpaired_samples():
    fast = timing.compare([200, 210, 190], [100, 105, 95], "a", "b", higher_is_better=True)
    assert fast.verdict == "a" and fast.ratio == pytest.approx(2.0)
    # Unpaired: the crossed quartiles must both exceed 1 for a verdict.
    overlap = timing.compare([10, 11, 12, 13], [11, 12, 13, 14], "a", "b", paired=False)
    assert overlap.verdict == "noise" and overlap.low < 1 < overlap.high
    apart = timing.compare([10, 11, 12, 13], [20, 21, 22, 23], "a", "b", paired=False)
    assert apart.verdict == "a" and apart.low > 1


@pytest.mark.parametrize("a, b, match", [([], [1.0], "a_samples"), ([1.0], [float("inf")], "b_samples"),
                                         ([1.0, 2.0], [1.0], "same length"), ([0.0], [1.0], "> 0")])
def test_compare_refuses_bad_samples(a, b, match):
    with pytest.raises(ValueError, match=match):
        timing.compare(a, b)
    with pytest.raises(ValueError, match="tolerance"):
        timing.compare([1.0], [1.0], tolerance=-0.1)
