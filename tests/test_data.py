"""Unit tests of the seeded synthetic input stream (workloads/data.py): determinism, layout and ranges, pooling
factors; the id laws and their samplers (workloads/ids.py) are in test_ids.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.data import Batch, SyntheticBatches, batch_rng, draw_pooling
from workloads.hashing import splitmix64
from workloads.ids import draw_virtual_ids, draw_zipf_ranks, to_physical
from workloads.spec import build_spec

FIELDS = ("dense_features", "lengths", "values", "labels")


def make(rank: int = 0, world_size: int = 2, **kw) -> SyntheticBatches:
    kw.setdefault("batch_size", 64)
    return SyntheticBatches(build_spec(WorkloadConfig(**kw)), rank=rank, world_size=world_size)


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


@pytest.mark.parametrize("ids", ["zipf", "uniform"])
def test_a_subset_of_tables_of_any_rank_draws_what_that_ranks_batch_holds(ids):
    """What an emulated rank's peers send it (bench.run.peer_batches): a few tables of another rank's batch,
    drawn alone, in any order, equal that batch's (Zipf tables of one law are drawn in one pass in a batch)."""
    sb = make(rank=0, world_size=4, seed=3, num_tables=5, rows_list=[10**9, 7_000, 10**9, 300, 10**9],
              materialize="scaled", scaled_max_gib=0.001, ids=IdsConfig(distribution=ids),
              pooling=PoolingConfig(distribution="pareto", mean=6, max=40))
    for rank in (0, 3):
        whole = SyntheticBatches(sb.spec, rank=rank, world_size=4).batch(5)
        counts = whole.lengths.view(5, 64).sum(dim=1).tolist()
        bounds = np.concatenate([[0], np.cumsum(counts)])
        tables = [4, 0, 3]
        lengths, values = sb.tables_of(rank, 5, tables)
        ends = np.cumsum([lens.sum() for lens in lengths])
        assert values.size == ends[-1]
        for table, lens, ids_drawn in zip(tables, lengths, np.split(values, ends[:-1])):
            assert np.array_equal(lens, whole.lengths.numpy()[table * 64:(table + 1) * 64])
            assert np.array_equal(ids_drawn, whole.values.numpy()[bounds[table]:bounds[table + 1]])
    with pytest.raises(ValueError, match="need 0 <= rank < world_size"):
        sb.tables_of(4, 0, [0])


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
# A batch's ids: each table's own stream
# ----------------------------------------------------------------------------------------------


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


@pytest.mark.parametrize("pooling", [
    PoolingConfig(distribution="fixed", mean=2.5),
    PoolingConfig(distribution="uniform", mean=4, min=1, max=64),  # the mean is (min + max) / 2, not 4
    PoolingConfig(distribution="poisson", mean=4, min=1, max=32),  # clipped at 1: draws more than 4
    PoolingConfig(distribution="poisson", mean=100, min=1, max=110),  # clipped at 110: draws less
    PoolingConfig(distribution="pareto", mean=8, min=1, max=128, pareto_alpha=2.0),  # the tail clipped: less
    PoolingConfig(distribution="pareto", mean=3, min=2, max=20, pareto_alpha=1.5),
])
def test_the_expected_pooling_is_what_the_law_draws_on_average(pooling):
    """What the estimators count a table's ids with (workloads.pooling_mean): the mean of 2,000,000 draws
    within 4 standard errors of it (the draws are seeded: the same numbers every run)."""
    from workloads.pooling_mean import expected_pooling

    drawn = draw_pooling(np.random.default_rng(7), pooling, pooling.mean, 2_000_000).astype(np.float64)
    expected = expected_pooling(pooling, pooling.mean)
    assert abs(drawn.mean() - expected) <= 4 * drawn.std() / np.sqrt(drawn.size) + 1e-12
    if pooling.distribution == "uniform":
        assert expected == 32.5
    assert build_spec(WorkloadConfig(num_tables=2, pooling=pooling)).tables[1].expected_pooling == expected
