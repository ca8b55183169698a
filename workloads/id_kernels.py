"""The Zipf stream's hot loop compiled with numba: the bucket lookup of `workloads.ids.draw_zipf_grouped` in one
pass over the ids, where numpy needs five (shift, gather, widen, compare, find). Same values either way (a test
draws both and compares them bit for bit); numba is imported, and the loop compiled or read from its cache, only
the first time a batch is large enough for it to pay (COMPILED_MIN_IDS), so small workloads never wait for it.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Optional

# ids in one call from which the compiled loop is used (below: numpy, whose fixed cost per call is lower)
COMPILED_MIN_IDS = 1 << 17


def _bucket_lookup(words, shift, table, out, start, mixed, mixed_words, count):  # pragma: no cover (compiled)
    """out[i] = table[words[i] >> shift] for every i; where the bucket holds several ranks (-1) the position
    (plus `start`) and the word are appended to `mixed` and `mixed_words` from `count` on; returns the new
    count."""
    for i in range(words.shape[0]):
        word = words[i]
        value = table[word >> shift]
        out[i] = value
        if value < 0:
            mixed[count] = start + i
            mixed_words[count] = word
            count += 1
    return count


@lru_cache(maxsize=1)
def compiled_bucket_lookup() -> Optional[Callable]:
    """`_bucket_lookup` compiled (cached on disk next to this file), or None without numba."""
    try:
        from numba import njit
    except ImportError:
        return None
    return njit(cache=True, nogil=True, boundscheck=False)(_bucket_lookup)
