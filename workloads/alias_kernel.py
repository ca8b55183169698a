"""workloads.zipf_alias's sampler as one numba-compiled pass (imported only through `compiled_alias_draw`, so
numba loads, and the loop compiles or comes from its on-disk cache, the first time a draw is large enough).

The same words and the same arithmetic as the numpy passes: the hash, the 128-bit product's high half, the
acceptance ratio and the rank -> id map are the very functions of workloads.hashing and workloads.zipf_law,
compiled. Each table's alias words are made a chunk at a time in a loop of their own, which the compiler
vectorizes; the lookups then run over the chunk, noting the draws that landed in wide blocks, whose ranks a
third loop completes (so no unpredictable branch sits in the lookup loop).

numba's on-disk cache checks this file's date only: after editing workloads/hashing.py or workloads/zipf_law.py,
delete workloads/__pycache__/alias_kernel.* (the bit-for-bit test against the numpy passes catches a stale one).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from workloads.hashing import mulhi64, splitmix_word
from workloads.zipf_law import rank_to_id_scalar, tail_mass_ratio

_word = njit(inline="always")(splitmix_word)
_mulhi = njit(inline="always")(mulhi64)
_ratio = njit(inline="always")(tail_mass_ratio)
_rank_to_id = njit(inline="always")(rank_to_id_scalar)

_CHUNK = 2048  # words made per vectorized pass (16 KiB: stays in L1)
_THRESHOLD_ONE = 4294967296.0


@njit(inline="always")
def _wide_block_rank(key, n, d, first, size, bound, rank, accept, b, log_form):  # pragma: no cover (compiled)
    """Attempt 0 drew `rank` and `accept`, at or past the block's bound: the exact test, then attempts 1, 2, ...
    until one is kept."""
    attempt = np.uint64(0)
    while not (accept < bound or np.float64(accept) < _ratio(np.float64(rank), np.float64(first), b, log_form)
               * _THRESHOLD_ONE):
        attempt += np.uint64(1)
        j = np.uint64(n) + np.uint64(2) * (attempt * np.uint64(n) + np.uint64(d))
        rank = first + np.int64(_mulhi(_word(key, j), size))
        accept = _word(key, j + np.uint64(1)) >> np.uint64(32)
    return rank


@njit(cache=True, nogil=True, boundscheck=False)
def alias_draw(keys, starts, counts, cell_shift, cells, singles, values, wide_rows, b, log_form, as_ids, n_ranks,
               multiplier, out):  # pragma: no cover (compiled)
    """Table t (keyed by keys[t]) draws out[starts[t]:starts[t] + counts[t]]; `values`: single_ids or single_ranks,
    `wide_rows`: the table's `wide` (workloads.zipf_alias.ZipfAlias)."""
    low32, s32 = np.uint64(0xFFFFFFFF), np.uint64(32)
    m_over_n = np.float64(multiplier) / np.float64(n_ranks)
    last_single = np.uint64(singles - 1)
    words = np.empty(_CHUNK, dtype=np.uint64)
    wide = np.empty(_CHUNK, dtype=np.int64)  # draws of the chunk in wide blocks, and their rows
    rows = np.empty(_CHUNK, dtype=np.uint64)
    rank_words, accept_words = np.empty(_CHUNK, dtype=np.uint64), np.empty(_CHUNK, dtype=np.uint64)
    for t in range(keys.shape[0]):
        key, start, n = keys[t], starts[t], counts[t]
        for c0 in range(0, n, _CHUNK):
            m = min(_CHUNK, n - c0)
            for i in range(m):
                words[i] = _word(key, np.uint64(c0 + i))
            if wide_rows.shape[0] == 0:  # every block holds one rank
                for i in range(m):
                    w = words[i]
                    cell = w >> cell_shift
                    entry = cells[cell]
                    out[start + c0 + i] = values[cell if (w & low32) < (entry >> s32) else (entry & low32)]
                continue
            count = 0
            for i in range(m):  # (no branch on the block's kind: a wide draw is noted, and finished below)
                w = words[i]
                cell = w >> cell_shift
                entry = cells[cell]
                block = cell if (w & low32) < (entry >> s32) else (entry & low32)
                out[start + c0 + i] = values[min(block, last_single)]
                wide[count] = i
                rows[count] = block - last_single - np.uint64(1)
                count += block > last_single
            for k in range(count):  # attempt 0's two words for every wide draw (vectorized)
                j = np.uint64(n) + np.uint64(2) * np.uint64(c0 + wide[k])
                rank_words[k] = _word(key, j)
                accept_words[k] = _word(key, j + np.uint64(1))
            for k in range(count):
                i, row = wide[k], rows[k]
                first, size, bound = np.int64(wide_rows[row, 0]), wide_rows[row, 1], wide_rows[row, 2]
                rank = first + np.int64(_mulhi(rank_words[k], size))
                accept = accept_words[k] >> s32
                if accept >= bound:  # (rare) the exact ratio, and more attempts if it rejects
                    rank = _wide_block_rank(key, n, c0 + i, first, size, bound, rank, accept, b, log_form)
                if as_ids:
                    rank = _rank_to_id(rank, n_ranks, multiplier, m_over_n)
                out[start + c0 + i] = rank
