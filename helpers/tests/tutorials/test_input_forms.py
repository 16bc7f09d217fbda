"""embedlab.tutorials.input_forms (notebook 01's key-form lesson) and training.step_time_report:
the cost split adds up per round, and the report's words follow the numbers and their spread."""
from __future__ import annotations

import numpy as np
import pytest

from embedlab.tutorials import input_forms as f
from embedlab.tutorials.training import step_time_report

OPS = {f.CSR: {"count": 37, "embedlab": ["EmbedLabFusedResourceLookup"]},
       f.SORTED: {"count": 18, "embedlab": ["EmbedLabFusedResourceSparseLookup"]},
       f.SHUFFLED: {"count": 18, "embedlab": ["EmbedLabFusedResourceSparseLookup"]},
       f.DENSE: {"count": 16, "embedlab": ["EmbedLabFusedResourceLookup"]}}


def _samples(rng, n, forward, call, convert, jitter=0.01):
    s = {}
    for form in forward:
        s[(form, "forward")] = forward[form] * rng.uniform(1 - jitter, 1 + jitter, n)
        s[(form, "call")] = np.full(n, call[form])
        if form in convert:
            s[(form, "convert")] = np.full(n, convert[form] + call[form])
    return s


def test_cost_split_per_round():
    rng = np.random.default_rng()
    s = _samples(rng, 7, {f.CSR: 4.0, f.SORTED: 3.5, f.SHUFFLED: 6.0, f.DENSE: 4.0},
                 {f.CSR: 1.0, f.SORTED: 1.5, f.SHUFFLED: 1.5, f.DENSE: 0.5}, {f.SORTED: 0.5, f.SHUFFLED: 2.0})
    split = f.cost_split(s)
    t = split[f.SHUFFLED]
    np.testing.assert_allclose(t["work"], s[(f.SHUFFLED, "forward")] - 1.5)
    np.testing.assert_allclose(t["predicted"], split[f.CSR]["work"] + 2.0)
    np.testing.assert_allclose(t["residual"], t["work"] - t["predicted"])
    assert "predicted" not in split[f.CSR] and "predicted" not in split[f.DENSE]
    with pytest.raises(ValueError, match="pre-built CSR"):
        f.cost_split({(f.SORTED, "forward"): [1.0], (f.SORTED, "call"): [1.0]})
    with pytest.raises(ValueError, match="call"):
        f.cost_split({(f.CSR, "forward"): [1.0]})


def test_report_follows_the_numbers():
    rng = np.random.default_rng()
    # CSR slower than sorted COO and the model over-predicting: the report must say so.
    slow_csr = f.cost_split(_samples(rng, 9, {f.CSR: 5.0, f.SORTED: 4.3, f.SHUFFLED: 6.0, f.DENSE: 4.4},
                                     {f.CSR: 1.0, f.SORTED: 1.2, f.SHUFFLED: 1.2, f.DENSE: 0.5},
                                     {f.SORTED: 0.6, f.SHUFFLED: 2.8}))
    text, c = f.input_form_report(slow_csr, OPS, keys=1000)
    assert c["sorted_vs_csr"].faster == "sorted COO" and "slower than sorted COO" in text
    assert "Build CSR" not in text and "buys nothing" in text
    assert "larger than the noise" in text and "less than the model predicts" in text
    assert "37 ops against 18" in text and "keep COO in row order" in text
    # All forms alike, the model exact: no winner, residual within the noise.
    alike = _samples(rng, 9, {f.CSR: 4.0, f.SORTED: 4.0, f.SHUFFLED: 4.0, f.DENSE: 4.0},
                     {f.CSR: 1.0, f.SORTED: 1.0, f.SHUFFLED: 1.0, f.DENSE: 1.0}, {f.SORTED: 0.0, f.SHUFFLED: 0.0}, jitter=0.0)
    for k in alike:                                          # the same scatter in every case of a round
        alike[k] = np.asarray(alike[k]) * np.tile([0.95, 1.05, 1.0], 3) if k[1] == "forward" else alike[k]
    text, c = f.input_form_report(f.cost_split(alike), OPS, keys=1000)
    assert c["sorted_vs_csr"].faster is None and "within this machine's noise" in text
    assert "the model accounts for the measurement" in text and "cost the same within the noise" in text
    assert "Shuffled and sorted COO were within the noise" in text
    with pytest.raises(ValueError, match="forms"):
        f.input_form_report({f.CSR: slow_csr[f.CSR]}, OPS, keys=1)


def test_step_time_report_says_whether_the_ratio_moved():
    steps = lambda s, n=12: [9.0, 9.0] + list(s * np.linspace(0.98, 1.02, n))
    moved = {("small", "a"): {"seconds": steps(1.0)}, ("small", "b"): {"seconds": steps(1.3)},
             ("large", "a"): {"seconds": steps(1.0)}, ("large", "b"): {"seconds": steps(0.8)}}
    lines, c = step_time_report(moved, "a", "b")
    assert c["small"].faster == "a" and c["large"].faster == "b"
    assert "moved beyond its spread" in lines[-1]
    scattered = [9.0, 9.0] + list(np.linspace(0.98, 1.02, 12) * np.tile([0.9, 1.12], 6))
    kept = {("small", "a"): {"seconds": steps(1.0)}, ("small", "b"): {"seconds": scattered},
            ("large", "a"): {"seconds": steps(1.0)}, ("large", "b"): {"seconds": scattered}}
    lines, c = step_time_report(kept, "a", "b")
    assert c["small"].faster is None and "stayed within its spread" in lines[-1]
    with pytest.raises(ValueError, match="lack"):
        step_time_report({("x", "a"): {"seconds": [1.0]}}, "a", "b")
