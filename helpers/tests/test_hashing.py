"""embedlab._hashing: SplitMix64 against the reference generator's published outputs and a
pure-Python transcription of Vigna's C."""
import numpy as np

from embedlab import _hashing

MASK = (1 << 64) - 1


def _reference_next(state):
    """Vigna's splitmix64.c next(): returns (new_state, output), on Python ints."""
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def test_splitmix64_matches_published_sequences():
    # First outputs of SplitMix64 seeded with 0 and with 1234567 (the reference implementation's).
    assert int(_hashing.splitmix64(np.uint64(0))) == 0xE220A8397B1DCDAF
    states = np.array([(1234567 + k * int(_hashing.GAMMA)) & MASK for k in range(5)], np.uint64)
    assert [int(v) for v in _hashing.splitmix64(states)] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431,
        16408922859458223821]


def test_splitmix64_and_mix64_match_reference_on_random_states(rng):
    states = rng.integers(0, 2**63, 2000, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 2000, dtype=np.uint64)
    got = _hashing.splitmix64(states)
    want = [_reference_next(int(s))[1] for s in states]
    assert got.dtype == np.uint64 and [int(v) for v in got] == want
    # mix64 is the finalizer alone: splitmix64(x) == mix64(x + GAMMA), wrapping.
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(_hashing.mix64(states + _hashing.GAMMA), got)
    # Shape is kept, and a 2-D broadcast gives the same values as elementwise calls.
    grid = states[:40].reshape(8, 5)
    np.testing.assert_array_equal(_hashing.splitmix64(grid), got[:40].reshape(8, 5))


def test_mix64_is_a_bijection_on_a_sample(rng):
    x = np.unique(rng.integers(0, 2**63, 100_000, dtype=np.uint64))
    assert len(np.unique(_hashing.mix64(x))) == len(x)
