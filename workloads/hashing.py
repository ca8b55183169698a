"""SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014): the hash behind
the host generator's uniforms (word ``j`` of a key's stream) and the virtual -> physical row map, and the
64-bit arithmetic the samplers need.

``splitmix_word`` and ``mulhi64`` are plain expressions over uint64 values: they run elementwise on numpy
uint64 arrays (which wrap modulo 2^64, as the hash wants) and, compiled by numba (workloads.alias_kernel),
on uint64 scalars -- one definition for both paths.
"""
from __future__ import annotations

import numpy as np

# SplitMix64's increment (the golden-ratio "gamma") and its two multipliers
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_M1, SPLITMIX_M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB

_GAMMA, _M1, _M2 = np.uint64(SPLITMIX_GAMMA), np.uint64(SPLITMIX_M1), np.uint64(SPLITMIX_M2)
_ONE, _S30, _S27, _S31 = np.uint64(1), np.uint64(30), np.uint64(27), np.uint64(31)
_LOW32, _S32 = np.uint64(0xFFFFFFFF), np.uint64(32)


def splitmix_word(key, index):
    """Word ``index`` of the SplitMix64 stream seeded with ``key``: the mix of ``key + (index + 1) * gamma``
    (uint64 in, uint64 out; elementwise on arrays)."""
    z = key + (index + _ONE) * _GAMMA
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output for state ``x`` (the mix of ``x + gamma``), elementwise on uint64 (int64 ids keep
    their bits)."""
    return splitmix_word(np.asarray(x).astype(np.uint64), np.uint64(0))


def mulhi64(a, b):
    """The high 64 bits of the 128-bit product ``a * b`` of uint64 values, from 32-bit halves:
    ``floor(a * b / 2^64)``, so ``mulhi64(w, size)`` of a uniform 64-bit ``w`` is uniform on ``[0, size)``
    to within ``size / 2^64``."""
    a_lo, a_hi = a & _LOW32, a >> _S32
    b_lo, b_hi = b & _LOW32, b >> _S32
    lo_lo, lo_hi, hi_lo = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo
    middle = (lo_lo >> _S32) + (lo_hi & _LOW32) + (hi_lo & _LOW32)
    return a_hi * b_hi + (lo_hi >> _S32) + (hi_lo >> _S32) + (middle >> _S32)


def umod_inplace(x: np.ndarray, n: int) -> None:
    """``x %= n`` for uint64 ``x`` as ``x - (x // n) * n``: numpy divides by a scalar with a precomputed
    reciprocal (libdivide), several times faster than its ``remainder`` loop; the same values."""
    d = np.uint64(n)
    q = x // d
    q *= d
    x -= q
