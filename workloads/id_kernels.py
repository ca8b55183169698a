"""The Zipf stream's hot loop compiled with numba: the words and bucket lookup of `workloads.ids.draw_zipf_grouped`
in one pass over the ids, where numpy needs a dozen (the hash's steps, shift, gather, compare, find). Same values
either way (a test draws both and compares them bit for bit); numba is imported, and the loop compiled or read
from its cache, only the first time a batch is large enough for it to pay (COMPILED_MIN_IDS), so small workloads
never wait for it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

import numpy as np

# ids in one call from which the compiled loop is used (below: numpy, whose fixed cost per call is lower)
COMPILED_MIN_IDS = 1 << 17

# SplitMix64 (Steele et al.): its increment and two multipliers (workloads.ids.splitmix64 uses these too)
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_M1, SPLITMIX_M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_LOW32 = 0xFFFFFFFF


def _splitmix(key, index):  # pragma: no cover (compiled)
    """Word `index` of the SplitMix64 sequence of `key` (uint64 in, uint64 out)."""
    z = key + index * np.uint64(SPLITMIX_GAMMA) + np.uint64(SPLITMIX_GAMMA)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(SPLITMIX_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(SPLITMIX_M2)
    return z ^ (z >> np.uint64(31))


def _bucket_lookup(keys, starts, shift, low_bits, table, split_offsets, split_first, split_second, out, mixed,
                   mixed_u):  # pragma: no cover (compiled)
    """For each table t (keyed by keys[t], its draws at out[starts[t]:starts[t + 1]], n of them): draw d's U_hi is
    the low (even d) or high (odd d) half of SplitMix64 word d // 2 of its key (workloads.ids.zipf_stream_words),
    its bucket U_hi >> shift. A mixed draw (bucket value < 0) takes U_lo, the top `low_bits` bits of the table's
    next unused word (ceil(n / 2), ceil(n / 2) + 1, ...), as workloads.ids.draw_zipf_grouped does:
    - a bucket of one rank (value >= 0): out[d] = value;
    - of two ranks (value -2 - i): the draw's offset in the bucket, (U_hi's bits below the bucket) << low_bits |
      U_lo, against split_offsets[i]: split_first[i] below it, else split_second[i]; U_lo is computed only when
      U_hi's bits tie with the split's (its word is still used up);
    - of more (-1): the position goes to `mixed`, the whole uniform U_hi << low_bits | U_lo to `mixed_u`, for
      the formula. Returns how many of those there are.
    (Compiled: uint64 arithmetic wraps, as the hash wants.)"""
    low32, high, low_shift = np.uint64(_LOW32), np.uint64(32), np.uint64(64) - low_bits
    below_bucket = (np.uint64(1) << shift) - np.uint64(1)
    total = 0
    for t in range(keys.shape[0]):
        key, start, n = keys[t], starts[t], starts[t + 1] - starts[t]
        next_word = np.uint64((n + 1) // 2)
        for j in range((n + 1) // 2):
            z = _splitmix(key, np.uint64(j))
            d = start + 2 * j
            halves = 2 if 2 * j + 1 < n else 1
            for half in range(halves):
                word = (z & low32) if half == 0 else (z >> high)
                value = table[word >> shift]
                if value >= 0:
                    out[d + half] = value
                elif value == -1:
                    mixed[total] = d + half
                    mixed_u[total] = (word << low_bits) | (_splitmix(key, next_word) >> low_shift)
                    next_word += np.uint64(1)
                    total += 1
                else:
                    i = -2 - np.int64(value)
                    split = np.uint64(split_offsets[i])
                    above = (word & below_bucket) << low_bits
                    if above + (np.uint64(1) << low_bits) <= split:
                        out[d + half] = split_first[i]
                    elif above > split:
                        out[d + half] = split_second[i]
                    elif above + (_splitmix(key, next_word) >> low_shift) < split:
                        out[d + half] = split_first[i]
                    else:
                        out[d + half] = split_second[i]
                    next_word += np.uint64(1)
    return total


@lru_cache(maxsize=1)
def compiled_bucket_lookup() -> Optional[Callable]:
    """`_bucket_lookup` compiled (cached on disk next to this file), or None without numba."""
    try:
        from numba import njit
    except ImportError:
        return None
    global _splitmix  # the loop's calls resolve to this global when it compiles: the compiled hash, inlined
    _splitmix = njit(inline="always", cache=True)(_splitmix)
    return njit(cache=True, nogil=True, boundscheck=False)(_bucket_lookup)
