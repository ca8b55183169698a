"""Unit tests of the ids of a synthetic batch (workloads/ids.py, workloads/zipf_law.py, workloads/zipf_alias.py): the
Zipf and uniform laws, the rank -> id scatter, and the Zipf sampler (numpy passes and the compiled loop)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from workloads.config import IdsConfig
from workloads.ids import draw_virtual_ids, draw_zipf_ranks
from workloads.zipf_law import ZIPF_EXACT_HEAD, mulmod, zipf_multiplier, zipf_rank_to_id


def fit_zipf_alpha(ids: np.ndarray, n: int, top: int) -> float:
    """Slope of log(frequency) vs log(rank) over the `top` most frequent ids (negated)."""
    counts = np.sort(np.bincount(ids, minlength=n))[::-1][:top].astype(np.float64)
    assert counts[-1] > 0
    ranks = np.arange(1, top + 1, dtype=np.float64)
    slope, _ = np.polyfit(np.log(ranks), np.log(counts), 1)
    return -float(slope)


# ----------------------------------------------------------------------------------------------
# Id distributions
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.8, 1.0, 1.05, 1.5])
def test_zipf_measured_alpha(alpha):
    n = 10**6
    rng = np.random.default_rng(123)
    ids = draw_virtual_ids(rng, IdsConfig(distribution="zipf", zipf_alpha=alpha), n, 2_000_000)
    assert ids.min() >= 0 and ids.max() < n
    measured = fit_zipf_alpha(ids, n, top=200 if alpha > 1.2 else 1000)
    assert abs(measured - alpha) < 0.1, measured


def test_zipf_rank_probabilities_exact_for_top_ranks():
    # P(1) / P(2) = 2^alpha for a Zipf law: the top ranks get their exact discrete mass
    rng = np.random.default_rng(5)
    for alpha in (0.5, 1.0, 2.0, 3.0):
        r = draw_zipf_ranks(rng, alpha, 10**4, 1_000_000)
        c = np.bincount(r[r <= 2])
        tol = 4 * math.sqrt(1 / c[1] + 1 / c[2]) + 0.005  # 4 sigma of the count ratio
        assert abs(c[1] / c[2] / 2**alpha - 1) < tol, (alpha, c)


@pytest.mark.parametrize("alpha", [0.7, 1.0, 2.0])
def test_zipf_pmf_matches_exactly_computed_law(alpha):
    # small space: compare empirical frequencies with the exact normalized k^-alpha for every rank,
    # across the exact head (ranks <= ZIPF_EXACT_HEAD) and the continuous tail
    n = 200
    w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
    p = w / w.sum()
    samples = 2_000_000
    r = draw_zipf_ranks(np.random.default_rng(11), alpha, n, samples)
    assert r.min() >= 1 and r.max() <= n
    freq = np.bincount(r, minlength=n + 1)[1:] / samples
    sigma = np.sqrt(p * (1 - p) / samples)
    assert np.all(np.abs(freq - p) < 5 * sigma + 2e-3 * p)
    assert abs(freq[ZIPF_EXACT_HEAD:].sum() - p[ZIPF_EXACT_HEAD:].sum()) < 0.003


def test_zipf_ranks_cover_the_range_and_handle_huge_spaces():
    rng = np.random.default_rng(0)
    r = draw_zipf_ranks(rng, 0.3, 10, 100_000)
    assert set(np.unique(r).tolist()) == set(range(1, 11))
    r = draw_zipf_ranks(rng, 1.0 + 1e-12, 10**12, 100_000)  # alpha ~ 1 takes the log form
    assert r.min() >= 1 and r.max() <= 10**12
    r = draw_zipf_ranks(rng, 0.05, 2**62, 100_000)
    assert r.min() >= 1 and r.max() <= 2**62
    assert np.all(draw_zipf_ranks(rng, 1.2, 1, 1000) == 1)
    # steep laws: many head boundaries share a guide bucket, or the tail has no float64 mass at all
    for alpha in (8.0, 60.0):
        r = draw_zipf_ranks(rng, alpha, 10**9, 200_000)
        assert r.min() == 1 and r.max() <= 10**9
        assert abs((r == 1).mean() - 1 / (1 + 2**-alpha + 3**-alpha)) < 0.01


@pytest.mark.parametrize("n", [1, 2, 3, 1000, 1024, 999_983, 10**6, 10**10, 2**40])
def test_zipf_rank_to_id_is_a_bijection_in_range(n):
    m = zipf_multiplier(n)
    assert math.gcd(m, n) == 1 and 1 <= m < max(n, 2)
    if n <= 10**6:
        ids = zipf_rank_to_id(np.arange(1, n + 1, dtype=np.int64), n)
        assert np.array_equal(np.sort(ids), np.arange(n))
    else:
        ranks = np.concatenate([np.arange(1, 1000), np.array([n - 1, n])]).astype(np.int64)
        ids = zipf_rank_to_id(ranks, n)
        assert ids.min() >= 0 and ids.max() < n and len(np.unique(ids)) == len(ranks)
    if n >= 1000:
        # hot ranks are spread over the space rather than packed at its start
        hot = zipf_rank_to_id(np.arange(1, 11, dtype=np.int64), n)
        assert hot.max() > n // 2


@pytest.mark.parametrize("n", [7, 10**6, 3 * 10**9 + 1, 10**10, 2**40 - 3, 2**50, 2**62 + 5])
def test_mulmod_is_exact(n):
    rng = np.random.default_rng(n % 1000)
    a = np.concatenate([rng.integers(0, n, 10_000), np.array([0, 1, n - 1])]).astype(np.int64)
    for m in {1, max(1, n // 3), zipf_multiplier(n), n - 1}:
        if m * n > 2**63 - 1 and n > 2**50:
            continue  # outside mulmod's domain; zipf_multiplier never asks for it
        got = mulmod(a, m, n)
        want = np.array([(int(x) * m) % n for x in a.tolist()], dtype=np.int64)
        assert np.array_equal(got, want), (n, m)


def test_uniform_ids_have_no_skew():
    n = 1000
    rng = np.random.default_rng(7)
    ids = draw_virtual_ids(rng, IdsConfig(distribution="uniform"), n, 1_000_000)
    assert ids.min() >= 0 and ids.max() < n
    assert abs(fit_zipf_alpha(ids, n, top=n)) < 0.1
    # and a Zipf draw over the same space is clearly skewed
    zipf = draw_virtual_ids(rng, IdsConfig(distribution="zipf", zipf_alpha=1.05), n, 1_000_000)
    assert fit_zipf_alpha(zipf, n, top=n) > 0.8


# ----------------------------------------------------------------------------------------------
# The Zipf sampler (alias table over blocks of ranks, rejection inside the wide ones)
# ----------------------------------------------------------------------------------------------


def zipf_law_pmf(alpha: float, n: int) -> np.ndarray:
    """P(rank k), k = 1..n, of the law draw_zipf_ranks draws: exact k^-alpha over the head, the continuous
    power law on [k - 0.5, k + 0.5] over the tail, normalized together (index 0 is rank 1)."""
    k_head = min(n, ZIPF_EXACT_HEAD)
    w = np.arange(1, k_head + 1, dtype=np.float64) ** -alpha
    if n > k_head:
        edges = np.arange(k_head + 0.5, n + 1.0, 1.0)
        if abs(alpha - 1) < 1e-12:
            mass = np.diff(np.log(edges))
        else:
            mass = np.diff(edges ** (1 - alpha)) / (1 - alpha)
        w = np.concatenate([w, mass])
    return w / w.sum()


@pytest.mark.parametrize("alpha,n", [(1.05, 10_000), (0.8, 3_000), (1.0, 50_000), (2.0, 5_000), (1.2, 300_000),
                                     (1.05, 10**7)])
def test_fast_zipf_matches_the_law_chi_square(alpha, n):
    samples = 3_000_000
    r = draw_zipf_ranks(np.random.default_rng(17), alpha, n, samples)
    assert r.min() >= 1 and r.max() <= n
    p = zipf_law_pmf(alpha, n)
    counts = np.bincount(r, minlength=n + 1)[1:]
    # pool consecutive ranks into bins of >= 50 expected draws (the far tail), then Pearson's chi-square
    expected = p * samples
    edges = [0]
    acc = 0.0
    for i, e in enumerate(expected):
        acc += e
        if acc >= 50:
            edges.append(i + 1)
            acc = 0.0
    edges[-1] = n
    obs = np.add.reduceat(counts, edges[:-1])
    exp = np.add.reduceat(expected, edges[:-1])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    dof = len(obs) - 1
    # Wilson-Hilferty: (chi2 / dof)^(1/3) is close to normal; z < 4 is a p-value above ~3e-5
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    assert z < 4, (chi2, dof, z)


def alias_blocks(tab):
    """Every block's first rank, size and acceptance bound (int64; one-rank blocks: bound 2^32)."""
    first = np.concatenate([tab.single_ranks, tab.wide[:, 0].astype(np.int64)])
    size = np.concatenate([np.ones(tab.singles, dtype=np.int64), tab.wide[:, 1].astype(np.int64)])
    bound = np.concatenate([np.full(tab.singles, 2**32, dtype=np.int64), tab.wide[:, 2].astype(np.int64)])
    return first, size, bound


def replay_alias_draws(alpha: float, n: int, key: int, m: int) -> np.ndarray:
    """The documented draws of workloads.zipf_alias, written out in Python integers from its tables."""
    from workloads.zipf_alias import zipf_alias
    from workloads.zipf_law import tail_mass_ratio

    tab = zipf_alias(float(alpha), n)
    gamma, mask = 0x9E3779B97F4A7C15, (1 << 64) - 1

    def word(j: int) -> int:  # SplitMix64
        z = (key + (j + 1) * gamma) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        return z ^ (z >> 31)

    bits = 64 - int(tab.cell_shift)
    blocks_first, blocks_size, blocks_bound = (a.tolist() for a in alias_blocks(tab))
    ranks = []
    for d in range(m):
        w = word(d)
        entry = int(tab.cells[w >> (64 - bits)])
        block = w >> (64 - bits) if (w & 0xFFFFFFFF) < entry >> 32 else entry & 0xFFFFFFFF
        first, size = blocks_first[block], blocks_size[block]
        attempt = 0
        while True:
            j = m + 2 * (attempt * m + d)
            rank = first + (word(j) * size >> 64)
            accept = word(j + 1) >> 32
            if block < tab.singles or accept < blocks_bound[block] or \
                    accept < tail_mass_ratio(float(rank), float(first), 1.0 - alpha, abs(1.0 - alpha) < 1e-9) * 2**32:
                break
            attempt += 1
        ranks.append(rank)
    return np.array(ranks, dtype=np.int64)


@pytest.mark.parametrize("alpha,n", [(1.05, 10_000), (1.05, 10**7), (0.5, 10**10), (3.0, 1000), (1.0, 17), (2.0, 1)])
def test_zipf_draws_are_the_documented_alias_draws(alpha, n):
    # the key is one word of the generator; draw d's words are W(d), then W(m + 2 (a m + d)) and the next for
    # attempt a in a block of several ranks
    m = 5_001
    got = draw_zipf_ranks(np.random.default_rng(3), alpha, n, m)
    key = int(np.random.default_rng(3).bit_generator.random_raw())
    assert np.array_equal(got, replay_alias_draws(alpha, n, key, m))


@pytest.mark.parametrize("alpha,n", [(1.05, 10_000), (1.05, 40_000_000), (0.5, 2**62), (8.0, 10**9), (1.0, 17)])
def test_alias_table_gives_each_block_its_mass(alpha, n):
    """Summed over the cells, P(block) is the law's mass of its ranks to within the 2^-32 steps of the
    thresholds; blocks tile 1..n, one rank each up to SINGLE_RANKS, and a wide block's bound is a lower bound
    of the acceptance ratio over it."""
    from workloads.zipf_alias import MAX_BLOCKS, SINGLE_RANKS, zipf_alias
    from workloads.zipf_law import tail_mass, tail_mass_ratio

    tab = zipf_alias(float(alpha), n)
    first, size, bound = alias_blocks(tab)
    assert first[0] == 1 and first[-1] + size[-1] == n + 1 and np.all(first[1:] == first[:-1] + size[:-1])
    assert len(first) <= MAX_BLOCKS and np.all(size[: min(n, SINGLE_RANKS)] == 1)
    cells = len(tab.cells)
    threshold = (tab.cells >> np.uint64(32)).astype(np.float64) / 2**32
    alias = (tab.cells & np.uint64(0xFFFFFFFF)).astype(np.int64)
    got = np.zeros(cells)
    np.add.at(got, np.arange(cells), threshold / cells)
    np.add.at(got, alias, (1 - threshold) / cells)
    k = min(n, ZIPF_EXACT_HEAD)
    mass = [float(r) ** -alpha for r in range(1, k + 1)]
    mass += [tail_mass(alpha, f - 0.5, f + s - 0.5) for f, s in zip(first[k:].tolist(), size[k:].tolist())]
    want = np.array(mass) / sum(mass)
    assert np.all(np.abs(got[: len(first)] - want) <= 2**-32)
    assert np.all(got[len(first):] == 0)
    # the documented bound on a wide block's density ratio (edges rounded to ranks: within 0.1 %)
    worst = (n / SINGLE_RANKS) ** (-alpha / (MAX_BLOCKS - SINGLE_RANKS))
    for i in np.flatnonzero(size > 1)[:: max(1, int((size > 1).sum()) // 50)].tolist():
        f, s = int(first[i]), int(size[i])
        ratios = [tail_mass_ratio(float(x), float(f), 1.0 - alpha, abs(1.0 - alpha) < 1e-9)
                  for x in (f + s // 3, f + s // 2, f + s - 1)]
        assert int(bound[i]) <= min(ratios) * 2**32 and min(ratios) > 0.999 * worst


def attempts_past_the_bound(alpha: float, n: int, key: int, m: int) -> int:
    """How many of a table's m draws land in a wide block with attempt 0's acceptance word at or past the block's
    bound (those take the exact ratio, and some a second attempt)."""
    from workloads.hashing import splitmix_word
    from workloads.zipf_alias import zipf_alias

    tab = zipf_alias(float(alpha), n)
    words = splitmix_word(np.uint64(key), np.arange(m, dtype=np.uint64))
    cell = words >> tab.cell_shift
    entry = tab.cells[cell]
    block = np.where((words & np.uint64(0xFFFFFFFF)) < (entry >> np.uint64(32)), cell, entry & np.uint64(0xFFFFFFFF))
    wide = np.flatnonzero(block >= tab.singles)
    accept = splitmix_word(np.uint64(key), np.uint64(m) + np.uint64(2) * wide.astype(np.uint64) + np.uint64(1))
    bound = tab.wide[block[wide].astype(np.int64) - tab.singles, 2]
    return int(((accept >> np.uint64(32)) >= bound).sum())


@pytest.mark.parametrize("alpha, n", [(1.05, 10_000), (1.2, 40_000_000), (0.9, 3_000), (0.5, 2**62)])
def test_compiled_sampler_gives_numpys_ids_bit_for_bit(alpha, n):
    """workloads.alias_kernel's compiled loop (used for large batches) and the numpy passes agree exactly, on one
    table and on a group of three (chunk edges included), for ids and ranks; with 2^62 ranks, draws past a wide
    block's bound (the exact ratio, more attempts) are among them."""
    from workloads.ids import compiled_alias_draw, draw_zipf_grouped

    assert compiled_alias_draw() is not None  # numba is a dependency: the fast path is the one measured
    for sizes in ([150_003], [2_048, 1, 40_001]):
        keys = [int(k) for k in np.random.default_rng(7).integers(0, 2**63, len(sizes))]
        for as_ids in (True, False):
            results = []
            for compiled in (True, False):
                out = np.empty(sum(sizes), dtype=np.int64)
                draw_zipf_grouped(alpha, n, keys, sizes, out, as_ids=as_ids, compiled=compiled)
                results.append(out)
            assert np.array_equal(results[0], results[1])
            assert results[0].min() >= (0 if as_ids else 1) and results[0].max() < n + (0 if as_ids else 1)
            # at explicit offsets (here in reverse order, as a batch's same-law tables may lie): the same values
            starts = np.cumsum([0, *sizes[::-1]])[:-1][::-1].tolist()
            for compiled in (True, False):
                reverse = np.empty(sum(sizes), dtype=np.int64)
                draw_zipf_grouped(alpha, n, keys, sizes, reverse, as_ids=as_ids, starts=starts, compiled=compiled)
                for i, (start, size) in enumerate(zip(starts, sizes)):
                    first = sum(sizes[:i])
                    assert np.array_equal(reverse[start : start + size], results[0][first : first + size])
    if n == 2**62:
        assert attempts_past_the_bound(alpha, n, keys[2], sizes[2]) > 3


def test_draw_virtual_ids_into_out_and_empty():
    rng = np.random.default_rng(0)
    out = np.full(1000, -7, dtype=np.int64)
    got = draw_virtual_ids(rng, IdsConfig(), 10_000, 1000, out=out)
    assert got is out and out.min() >= 0 and out.max() < 10_000
    assert draw_virtual_ids(rng, IdsConfig(), 10_000, 0).shape == (0,)
    with pytest.raises(ValueError, match="int64"):
        draw_virtual_ids(rng, IdsConfig(), 100, 10, out=np.zeros(10, dtype=np.int32))
