"""Vectorized text <-> number conversions on 8-byte words ("SIMD within a register").

Criteo fields are short ASCII numbers: 8 hex digits, or a few decimal digits. Rather than one
NumPy pass per character, each helper treats 8 characters as one little-endian uint64 (the
first character in the lowest byte) and converts them with a handful of word-wide integer
operations over the whole column: hex fields both ways (the parser and the generator), decimal
digits one way (the generator). All arithmetic wraps mod 2**64, as NumPy's uint64
does silently.
"""
from __future__ import annotations

import numpy as np

_U = np.uint64


def _c(x: int) -> np.uint64:
    return _U(x)


_ONES = _c(0x0101010101010101)
_ZEROS = _c(0x3030303030303030)       # eight '0' characters


def load_u64(padded: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The 8 bytes at each (unaligned) offset of a uint8 array, as little-endian uint64."""
    words = np.ndarray(shape=(len(padded) - 7,), dtype="<u8", buffer=padded, strides=(1,))
    return words[offsets]


def hex_encode(v: np.ndarray) -> np.ndarray:
    """uint32 values -> uint64 words holding their 8 lowercase hex characters (MSD first)."""
    y = v.astype(np.uint64)
    y = ((y & _c(0xFFFF0000)) << _c(16)) | (y & _c(0xFFFF))
    y = ((y & _c(0x0000FF000000FF00)) << _c(8)) | (y & _c(0x000000FF000000FF))
    y = ((y & _c(0x00F000F000F000F0)) << _c(4)) | (y & _c(0x000F000F000F000F))
    y = y.byteswap()                                   # most significant nibble first in memory
    ge10 = ((y + _c(0x0606060606060606)) >> _c(4)) & _ONES
    return y + _ZEROS + ge10 * _c(0x27)                # 0-9 -> '0'..'9', 10-15 -> 'a'..'f'


def hex_decode(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint64 words of 8 hex characters (either case) -> (uint32 values, bool valid)."""
    n = (w & _c(0x0F0F0F0F0F0F0F0F)) + ((w >> _c(6)) & _ONES) * _c(9)
    t = ((n & _c(0x000F000F000F000F)) << _c(4)) | ((n >> _c(8)) & _c(0x000F000F000F000F))
    u = (t & _c(0x000000FF000000FF)) | ((t >> _c(8)) & _c(0x0000FF000000FF00))
    v = ((u & _c(0xFFFF)) | ((u >> _c(16)) & _c(0xFFFF0000))).astype(np.uint32).byteswap()
    # Valid iff re-encoding gives the lower-cased input and no byte is a control character
    # (OR-ing 0x20 would otherwise turn bytes 0x10-0x19 into digits).
    ok = hex_encode(v) == (w | _c(0x2020202020202020))
    t2 = w & _c(0x6060606060606060)
    ok &= ((t2 | (t2 << _c(1))) & _c(0x4040404040404040)) == _c(0x4040404040404040)
    return v, ok


def encode8(x: np.ndarray) -> np.ndarray:
    """Values 0..99,999,999 -> uint64 words of their 8 decimal digits, zero-padded (MSD first)."""
    x = x.astype(np.uint64)
    y = (x // _c(10000)) | ((x % _c(10000)) << _c(32))                 # two 4-digit lanes
    hi = ((y * _c(5243)) >> _c(19)) & _c(0x0000007F0000007F)           # lane // 100
    y = hi | ((y - hi * _c(100)) << _c(16))                            # four 2-digit lanes
    tens = ((y * _c(103)) >> _c(10)) & _c(0x000F000F000F000F)          # lane // 10
    y = tens | ((y - tens * _c(10)) << _c(8))                          # eight 1-digit lanes
    return y + _ZEROS


BLOCK = 16_384   # elements per step: keeps every temporary word array inside the L2 cache


def blocked(fn, *arrays, out_dtypes):
    """Apply an element-wise `fn(*slices) -> tuple` over cache-sized slices of 1-D arrays.

    NumPy allocates a fresh temporary per operation; on multi-MB columns those temporaries
    fall out of cache and each step becomes memory-bound. Slicing makes the same work ~4x faster.
    """
    n = len(arrays[0])
    outs = [np.empty(n, dtype=d) for d in out_dtypes]
    for i in range(0, n, BLOCK):
        res = fn(*(a[i:i + BLOCK] for a in arrays))
        if not isinstance(res, tuple):
            res = (res,)
        for o, r in zip(outs, res):
            o[i:i + BLOCK] = r
    return outs
