"""SplitMix64 on numpy arrays: counter-based hashing for values that are a function of their inputs.

Initial embedding rows and synthetic data are computed from (seed, key, column) with no state,
so any shard, thread or process computes the same values for the same inputs. All arithmetic
is on ``uint64`` and wraps modulo 2**64.

- :func:`mix64` is SplitMix64's finalizer (a bijection of uint64).
- :func:`splitmix64` is one SplitMix64 step from state `x`: ``mix64(x + 0x9E3779B97F4A7C15)``,
  the generator's output for state `x` (Steele, Lea and Flood, 2014; Vigna's reference C).
"""
from __future__ import annotations

import numpy as np

__all__ = ["GAMMA", "mix64", "splitmix64"]

GAMMA = np.uint64(0x9E3779B97F4A7C15)      # SplitMix64's increment (2**64 / golden ratio, odd)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x) -> np.ndarray:
    """SplitMix64's finalizer of uint64 `x` (array or scalar), elementwise.

    Example:
        >>> hex(int(mix64(np.uint64(0x9E3779B97F4A7C15))))
        '0xe220a8397b1dcdaf'
    """
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def splitmix64(x) -> np.ndarray:
    """The SplitMix64 output for state `x` (uint64 array or scalar), elementwise.

    Example:
        >>> [int(v) for v in splitmix64(np.array([1234567, 1234567 + int(GAMMA)], np.uint64))]
        [6457827717110365317, 3203168211198807973]
    """
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix64(x + GAMMA)
