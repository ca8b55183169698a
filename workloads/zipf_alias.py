"""The host generator's Zipf sampler: an alias table over blocks of ranks (Walker 1977, Vose 1991).

The law is workloads.zipf_law's. Its ranks are cut into blocks: every rank its own block for spaces of up
to ``MAX_BLOCKS`` ranks; beyond, ranks ``1..SINGLE_RANKS`` one each and the rest in ``MAX_BLOCKS -
SINGLE_RANKS`` blocks of geometrically growing width, over which the law's density varies by a factor of at
most ``(n / SINGLE_RANKS)^(alpha / (MAX_BLOCKS - SINGLE_RANKS))`` (< 1.007 for alpha <= 1.5 and n <= 2^40).
An alias table over ``2^B`` cells (``B = ceil(log2(blocks))``; the cells past the last block have no mass)
picks the block with its exact mass; a wide block (one past the single ranks: near them a few hold only one)
then draws a rank uniformly and keeps it with probability ``g(rank) / g(first rank)`` (rejection,
`workloads.zipf_law.tail_mass_ratio`), first against a precomputed lower bound (the block's last rank: almost
always decisive), and only past it exactly.

Draw ``d`` of a table keyed by ``key`` (``n`` draws; ``W(j)``: word ``j`` of the key's SplitMix64 stream,
workloads.hashing.splitmix_word):

- ``w = W(d)``; cell ``c`` = the top ``B`` bits of ``w``; block ``c`` when the low 32 bits of ``w`` are below
  the cell's 32-bit threshold, else the cell's alias;
- in a wide block ``[first, first + size)``, attempt ``a = 0, 1, ...`` takes
  ``j = n + 2 (a n + d)``: rank ``first + mulhi64(W(j), size)``, kept when ``W(j + 1) >> 32`` is below the
  block's 32-bit bound, or below ``tail_mass_ratio(rank, first) * 2^32``.

So every rank's probability is the law's to within the 2^-32 steps of the thresholds (about 2^-33 per
cell that can yield it, each cell holding 2^-B of the mass) and of the acceptance; the words a draw uses
depend only on ``(key, n, d)``, so the numpy passes here and the compiled loop (workloads.alias_kernel) give
the same values, tested bit for bit. Building a table takes about 10-25 ms; the last 128 are kept.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from workloads.hashing import mulhi64, splitmix_word
from workloads.zipf_law import LOG_FORM_EPS, ZIPF_EXACT_HEAD, tail_mass, tail_mass_ratio, zipf_multiplier, \
    zipf_rank_to_id

# 2^14 cells (128 KiB), and for larger spaces 12,288 ranks of their own (96 KiB) and 4,096 wide blocks (128 KiB):
# all of a table stays in a core's L2 (tables of 2^16 cells and 2^15 single ranks drew a real-cardinality
# MLPerf batch 1.7x slower, their 1.8 MiB evicting each other between tables)
MAX_BLOCKS = 1 << 14
SINGLE_RANKS = 12288
_THRESHOLD_ONE = 1 << 32
_LOW32, _S32 = np.uint64(0xFFFFFFFF), np.uint64(32)


@dataclass(frozen=True)
class ZipfAlias:
    n_ranks: int
    cell_shift: np.uint64  # 64 - B: a word's top B bits are its cell
    cells: np.ndarray  # uint64 [2^B]: the 32-bit threshold << 32 | the alias block
    singles: int  # blocks 0 .. singles - 1 are ranks 1 .. singles; the others are "wide"
    single_ids: np.ndarray  # int64 [singles]: the id of rank block + 1
    single_ranks: np.ndarray  # int64 [singles]: block + 1
    # uint64 [blocks - singles, 4] (one 32-byte row per block): first rank, ranks in the block,
    # floor(g(last) / g(first) * 2^32) (kept outright below it), 0
    wide: np.ndarray
    b: float  # 1 - alpha
    log_form: bool
    multiplier: int  # zipf_multiplier(n_ranks)


def block_edges(n_ranks: int) -> np.ndarray:
    """First rank of each block, then ``n_ranks + 1`` (int64, strictly increasing)."""
    if n_ranks <= MAX_BLOCKS:
        return np.arange(1, n_ranks + 2, dtype=np.int64)
    wide = MAX_BLOCKS - SINGLE_RANKS
    geometric = np.geomspace(SINGLE_RANKS + 1, n_ranks + 1, wide + 1)
    edges = np.unique(np.rint(geometric).astype(np.int64))  # (rounded: near SINGLE_RANKS some coincide)
    edges[0], edges[-1] = SINGLE_RANKS + 1, n_ranks + 1
    return np.concatenate([np.arange(1, SINGLE_RANKS + 1, dtype=np.int64), edges])


def _vose(probabilities: np.ndarray) -> tuple:
    """Vose's alias method over ``len(probabilities)`` equally likely cells: (threshold, alias) per cell, where
    cell ``i`` yields ``i`` with probability ``threshold[i]`` and ``alias[i]`` otherwise."""
    cells = len(probabilities)
    scaled = (probabilities * cells).tolist()
    threshold, alias = [1.0] * cells, list(range(cells))
    small = [i for i in range(cells) if scaled[i] < 1.0]
    large = [i for i in range(cells) if scaled[i] >= 1.0]
    while small and large:
        s, big = small.pop(), large[-1]
        threshold[s], alias[s] = scaled[s], big
        scaled[big] = (scaled[big] + scaled[s]) - 1.0
        if scaled[big] < 1.0:
            small.append(large.pop())
    return np.array(threshold), np.array(alias, dtype=np.uint64)  # (leftovers: rounding, threshold 1)


@lru_cache(maxsize=128)
def zipf_alias(alpha: float, n_ranks: int) -> ZipfAlias:
    """The sampler's tables for one law (see the module docstring)."""
    edges = block_edges(n_ranks)
    first, size = edges[:-1], np.diff(edges)
    k = min(n_ranks, ZIPF_EXACT_HEAD)
    masses = np.empty(len(first))
    masses[:k] = np.arange(1, k + 1, dtype=np.float64) ** -alpha  # the exact head: blocks of one rank
    masses[k:] = [tail_mass(alpha, f - 0.5, f + s - 0.5) for f, s in zip(first[k:].tolist(), size[k:].tolist())]
    bits = max(1, math.ceil(math.log2(len(first))))
    probabilities = np.zeros(1 << bits)
    probabilities[: len(first)] = masses / masses.sum()
    threshold, alias = _vose(probabilities)
    threshold = np.rint(threshold * _THRESHOLD_ONE).astype(np.uint64)
    full = threshold >= _THRESHOLD_ONE  # always the cell's own block: say so through its alias
    alias[full] = np.flatnonzero(full).astype(np.uint64)
    threshold[full] = 0
    b = 1.0 - alpha
    log_form = abs(b) < LOG_FORM_EPS
    singles = SINGLE_RANKS if n_ranks > MAX_BLOCKS else n_ranks
    wide = np.zeros((len(first) - singles, 4), dtype=np.uint64)
    wide[:, 0], wide[:, 1] = first[singles:], size[singles:]
    for row, (f, s) in enumerate(zip(first[singles:].tolist(), size[singles:].tolist())):
        wide[row, 2] = math.floor(tail_mass_ratio(float(f + s - 1), float(f), b, log_form) * _THRESHOLD_ONE)
    ranks = np.arange(1, singles + 1, dtype=np.int64)
    arrays = (threshold << _S32) | alias, zipf_rank_to_id(ranks, n_ranks), ranks, wide
    for array in arrays:
        array.setflags(write=False)
    return ZipfAlias(n_ranks=int(n_ranks), cell_shift=np.uint64(64 - bits), cells=arrays[0], singles=singles,
                     single_ids=arrays[1], single_ranks=ranks, wide=wide, b=b, log_form=log_form,
                     multiplier=zipf_multiplier(int(n_ranks)))


def draw_alias(tab: ZipfAlias, keys: Sequence[int], starts: Sequence[int], counts: Sequence[int], out: np.ndarray,
               as_ids: bool) -> None:
    """Table ``i`` (keyed by ``keys[i]``) draws ``out[starts[i] : starts[i] + counts[i]]`` (int64), all tables in
    one set of numpy passes."""
    counts = np.asarray(counts, dtype=np.int64)
    table = np.repeat(np.arange(len(counts)), counts)
    draw = np.arange(len(table), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)  # d, per table
    key = np.asarray(keys, dtype=np.uint64)[table]
    words = splitmix_word(key, draw.astype(np.uint64))
    cell = words >> tab.cell_shift
    entry = tab.cells[cell]
    block = np.where((words & _LOW32) < (entry >> _S32), cell, entry & _LOW32).astype(np.int64)
    wide = np.flatnonzero(block >= tab.singles)
    rows = block[wide] - tab.singles
    np.minimum(block, tab.singles - 1, out=block)
    values = (tab.single_ids if as_ids else tab.single_ranks).take(block)
    if wide.size:
        ranks = _wide_block_ranks(tab, key[wide], counts[table[wide]], draw[wide], rows)
        values[wide] = zipf_rank_to_id(ranks, tab.n_ranks) if as_ids else ranks
    out[np.asarray(starts, dtype=np.int64)[table] + draw] = values


def _wide_block_ranks(tab: ZipfAlias, keys: np.ndarray, n: np.ndarray, draws: np.ndarray, rows: np.ndarray
                      ) -> np.ndarray:
    """Ranks for the ``draws`` (each ``d``, of a table of ``n`` draws keyed by ``keys``) that landed in wide blocks
    (their ``rows`` of ``tab.wide``): rejection, attempt by attempt (see the module docstring)."""
    ranks = np.empty(len(draws), dtype=np.int64)
    pending = np.arange(len(draws))
    n64, attempt = n.astype(np.uint64), 0
    while pending.size:
        row = tab.wide[rows[pending]]
        first = row[:, 0].astype(np.int64)
        j = n64[pending] + np.uint64(2) * (np.uint64(attempt) * n64[pending] + draws[pending].astype(np.uint64))
        rank = first + mulhi64(splitmix_word(keys[pending], j), row[:, 1]).astype(np.int64)
        accept = splitmix_word(keys[pending], j + np.uint64(1)) >> _S32
        kept = accept < row[:, 2]
        for i in np.flatnonzero(~kept).tolist():  # past the bound (rare): the exact ratio
            ratio = tail_mass_ratio(float(rank[i]), float(first[i]), tab.b, tab.log_form)
            kept[i] = float(accept[i]) < ratio * _THRESHOLD_ONE
        ranks[pending[kept]] = rank[kept]
        pending = pending[~kept]
        attempt += 1
    return ranks
