"""Unit tests of the seeded synthetic input stream (workloads/data.py, workloads/ids.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.data import Batch, SyntheticBatches, batch_rng, draw_pooling
from workloads.hashing import splitmix64
from workloads.ids import draw_virtual_ids, draw_zipf_ranks, to_physical
from workloads.zipf_law import ZIPF_EXACT_HEAD, mulmod, zipf_multiplier, zipf_rank_to_id
from workloads.spec import build_spec

FIELDS = ("dense_features", "lengths", "values", "labels")


def make(rank: int = 0, world_size: int = 2, **kw) -> SyntheticBatches:
    kw.setdefault("batch_size", 64)
    return SyntheticBatches(build_spec(WorkloadConfig(**kw)), rank=rank, world_size=world_size)


def fit_zipf_alpha(ids: np.ndarray, n: int, top: int) -> float:
    """Slope of log(frequency) vs log(rank) over the `top` most frequent ids (negated)."""
    counts = np.sort(np.bincount(ids, minlength=n))[::-1][:top].astype(np.float64)
    assert counts[-1] > 0
    ranks = np.arange(1, top + 1, dtype=np.float64)
    slope, _ = np.polyfit(np.log(ranks), np.log(counts), 1)
    return -float(slope)


# ----------------------------------------------------------------------------------------------
# Determinism
# ----------------------------------------------------------------------------------------------


def assert_batches_equal(a: Batch, b: Batch) -> None:
    assert a.keys == b.keys
    for f in FIELDS:
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_same_seed_rank_step_is_identical():
    a = make(rank=1, seed=7).batch(3)
    # a fresh generator, other steps drawn first, another world_size: still the same batch
    other = make(rank=1, world_size=4, seed=7)
    other.batch(0)
    other.batch(5)
    assert_batches_equal(a, other.batch(3))
    assert_batches_equal(a, make(rank=1, seed=7).batch(3))


@pytest.mark.parametrize(
    "kw",
    [
        dict(seed=0),  # zipf ids
        dict(seed=0, ids=IdsConfig(distribution="uniform")),
        dict(seed=0, pooling=PoolingConfig(distribution="poisson")),
    ],
)
def test_rank_step_and_seed_change_the_batch(kw):
    base = make(rank=0, **kw).batch(0)
    for other in (make(rank=1, **kw).batch(0), make(rank=0, **kw).batch(1)):
        assert not torch.equal(base.dense_features, other.dense_features)
        assert not torch.equal(base.values[:100], other.values[:100])
    kw2 = dict(kw, seed=1)
    assert not torch.equal(base.values[:100], make(rank=0, **kw2).batch(0).values[:100])


def test_batch_streams_match_batch_rng():
    sb = make(rank=1, seed=5, num_tables=3, num_dense_features=4, pooling=PoolingConfig(distribution="poisson"))
    b = sb.batch(7)
    rng = batch_rng(5, 1, 7, 0)
    assert np.array_equal(b.dense_features.numpy(), rng.standard_normal((64, 4), dtype=np.float32))
    for i, t in enumerate(sb.spec.tables):
        lens = draw_pooling(batch_rng(5, 1, 7, 1 + i), sb.spec.config.pooling, t.pooling_mean, 64)
        assert np.array_equal(b.lengths.numpy()[i * 64 : (i + 1) * 64], lens)


def test_changing_one_table_keeps_other_tables_streams():
    a = make(rows_list=[1000, 2000, 3000], num_tables=3, materialize="full").batch(2)
    b = make(rows_list=[1000, 5000, 3000], num_tables=3, materialize="full").batch(2)
    n = 64 * 4  # fixed pooling 4, batch 64
    assert torch.equal(a.values[:n], b.values[:n])
    assert torch.equal(a.values[2 * n :], b.values[2 * n :])
    assert not torch.equal(a.values[n : 2 * n], b.values[n : 2 * n])


# ----------------------------------------------------------------------------------------------
# Layout and ranges
# ----------------------------------------------------------------------------------------------


def test_batch_layout_and_dtypes():
    sb = make(num_tables=5, batch_size=32, num_dense_features=13, pooling=PoolingConfig(distribution="uniform", min=0, max=9))
    b = sb.batch(0)
    assert b.keys == [f"f{i}" for i in range(5)]
    assert b.dense_features.dtype == torch.float32 and b.dense_features.shape == (32, 13)
    assert b.labels.dtype == torch.float32 and b.labels.shape == (32,)
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0}
    assert b.lengths.dtype == torch.int32 and b.lengths.shape == (5 * 32,)
    assert b.values.dtype == torch.int64
    assert int(b.lengths.sum()) == b.values.numel()
    assert b.batch_size == 32


def test_dense_and_labels_statistics():
    b = make(batch_size=20_000, num_dense_features=4, num_tables=1).batch(0)
    assert abs(float(b.dense_features.mean())) < 0.03
    assert abs(float(b.dense_features.std()) - 1.0) < 0.03
    assert abs(float(b.labels.mean()) - 0.5) < 0.02


@pytest.mark.parametrize("ids", ["zipf", "uniform"])
def test_ids_within_physical_rows_for_every_table(ids):
    cfg = WorkloadConfig(
        num_tables=4,
        rows_list=[10**10, 10**7, 5_000, 123],
        materialize="scaled",
        scaled_max_gib=0.001,
        embedding_dim=16,
        batch_size=2048,
        ids=IdsConfig(distribution=ids),
        pooling=PoolingConfig(distribution="poisson", mean=6, max=40),
    )
    spec = build_spec(cfg)
    assert all(0 < t.physical_rows < t.virtual_rows for t in spec.tables)
    b = SyntheticBatches(spec, rank=0, world_size=1).batch(0)
    lengths = b.lengths.view(len(spec.tables), -1).sum(dim=1).tolist()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    for i, t in enumerate(spec.tables):
        v = b.values[offsets[i] : offsets[i + 1]]
        assert v.numel() > 0
        assert int(v.min()) >= 0 and int(v.max()) < t.physical_rows, t


def test_huge_virtual_space_hashed_into_1000_rows():
    rng = np.random.default_rng(0)
    for dist in ("zipf", "uniform"):
        v = draw_virtual_ids(rng, IdsConfig(distribution=dist), 10**10, 200_000)
        assert v.dtype == np.int64 and v.min() >= 0 and v.max() < 10**10
        p = to_physical(v, 10**10, 1000)
        assert p.dtype == np.int64 and p.min() >= 0 and p.max() < 1000
    # uniform virtual ids hash to (roughly) uniform physical rows: every row is hit
    counts = np.bincount(p, minlength=1000)
    assert counts.min() > 100 and counts.max() < 320


def test_full_materialization_is_identity():
    rng = np.random.default_rng(0)
    v = draw_virtual_ids(rng, IdsConfig(), 10_000, 1000)
    assert np.array_equal(to_physical(v, 10_000, 10_000), v)
    b = make(rows=500, materialize="full", num_tables=2).batch(0)
    assert int(b.values.max()) < 500


def test_to_physical_rejects_unmaterialized_tables():
    with pytest.raises(ValueError, match="physical_rows=0"):
        to_physical(np.arange(10), 100, 0)
    with pytest.raises(ValueError, match="plan_only"):
        make(materialize="plan_only")


def test_splitmix64_known_values():
    # reference outputs of splitmix64 for state = 0 (successive calls add the gamma each time)
    out = splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64))
    assert out.tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_bad_configs_raise():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError):
        draw_pooling(rng, PoolingConfig(distribution="zipf"), 4.0, 10)
    with pytest.raises(ValueError):
        draw_pooling(rng, PoolingConfig(distribution="pareto", pareto_alpha=1.0), 4.0, 10)
    with pytest.raises(ValueError):
        draw_virtual_ids(rng, IdsConfig(distribution="normal"), 100, 10)
    with pytest.raises(ValueError):
        draw_zipf_ranks(rng, 0.0, 100, 10)
    with pytest.raises(ValueError):
        SyntheticBatches(build_spec(WorkloadConfig()), rank=2, world_size=2)


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
# Pooling factors
# ----------------------------------------------------------------------------------------------

N_POOL = 400_000


@pytest.mark.parametrize("mean,expected", [(4.0, 4), (2.5, 3), (3.49, 3), (0.0, 0), (100.0, 100)])
def test_fixed_pooling_is_exact(mean, expected):
    p = draw_pooling(np.random.default_rng(0), PoolingConfig(distribution="fixed"), mean, 1000)
    assert p.dtype == np.int64 and np.all(p == expected)


def test_uniform_pooling():
    cfg = PoolingConfig(distribution="uniform", min=2, max=10)
    p = draw_pooling(np.random.default_rng(0), cfg, 123.0, N_POOL)  # mean unused for uniform
    assert p.min() == 2 and p.max() == 10
    assert abs(p.mean() - 6.0) / 6.0 < 0.05


@pytest.mark.parametrize("mean", [4.0, 20.0])
def test_poisson_pooling(mean):
    cfg = PoolingConfig(distribution="poisson", min=1, max=64)
    p = draw_pooling(np.random.default_rng(1), cfg, mean, N_POOL)
    assert p.min() >= 1 and p.max() <= 64
    assert abs(p.mean() - mean) / mean < 0.05
    assert abs(p.var() - mean) / mean < 0.1


@pytest.mark.parametrize("alpha", [2.5, 4.0])
def test_pareto_pooling(alpha):
    cfg = PoolingConfig(distribution="pareto", pareto_alpha=alpha, min=1, max=10_000)
    p = draw_pooling(np.random.default_rng(2), cfg, 8.0, N_POOL)
    assert p.min() >= 1 and p.max() <= 10_000
    assert abs(p.mean() - 8.0) / 8.0 < 0.05
    assert p.max() > 3 * 8  # a heavy tail is there


def test_pareto_pooling_respects_tight_bounds():
    cfg = PoolingConfig(distribution="pareto", pareto_alpha=1.5, min=3, max=12)
    p = draw_pooling(np.random.default_rng(3), cfg, 6.0, N_POOL)
    assert p.min() == 3 and p.max() == 12


def test_per_table_means_reach_the_batch():
    means = [1.0, 5.0, 20.0]
    sb = make(
        num_tables=3,
        batch_size=20_000,
        pooling=PoolingConfig(distribution="poisson", per_table_mean=means, min=0, max=200),
    )
    b = sb.batch(0)
    per_table = b.lengths.view(3, -1).double().mean(dim=1).tolist()
    for got, want in zip(per_table, means):
        assert abs(got - want) / want < 0.05


def test_batch_rate_json_rows_have_the_documented_keys():
    from bench.perf.batch_rate import Row, json_rows

    row, = json_rows([Row("mlperf", 26, 4096, 214, 224_000.0, 992_000.0, 826_000.0, 2904.0)])
    assert {"shape", "ours_zipf_per_s", "ours_uniform_per_s", "randomrec_per_s", "step_per_s"} <= set(row)
    assert row["step_per_s"] == round(4096 / 2.904, 1)


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


def test_batch_ids_equal_draw_virtual_ids_on_each_tables_stream():
    # the batch draws runs of same-space Zipf tables in one pass: the values are still each table's own
    for ids in (IdsConfig(), IdsConfig(distribution="uniform")):
        sb = make(rank=1, seed=9, num_tables=4, rows_list=[5000, 5000, 300, 5000], batch_size=512, ids=ids,
                  pooling=PoolingConfig(distribution="poisson", mean=5, max=30))
        b = sb.batch(4)
        offsets = np.concatenate([[0], np.cumsum(b.lengths.view(4, -1).sum(dim=1).numpy())])
        for i, t in enumerate(sb.spec.tables):
            rng = batch_rng(9, 1, 4, 1 + i)
            lens = draw_pooling(rng, sb.spec.config.pooling, t.pooling_mean, 512)
            want = to_physical(draw_virtual_ids(rng, ids, t.virtual_rows, int(lens.sum())), t.virtual_rows,
                               t.physical_rows)
            assert np.array_equal(b.values.numpy()[offsets[i] : offsets[i + 1]], want), (ids, i)


def test_draw_virtual_ids_into_out_and_empty():
    rng = np.random.default_rng(0)
    out = np.full(1000, -7, dtype=np.int64)
    got = draw_virtual_ids(rng, IdsConfig(), 10_000, 1000, out=out)
    assert got is out and out.min() >= 0 and out.max() < 10_000
    assert draw_virtual_ids(rng, IdsConfig(), 10_000, 0).shape == (0,)
    with pytest.raises(ValueError, match="int64"):
        draw_virtual_ids(rng, IdsConfig(), 100, 10, out=np.zeros(10, dtype=np.int32))
