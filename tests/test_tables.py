"""Unit tests of table generation (workloads/spec.py)."""
from __future__ import annotations

import pytest

from workloads.config import PoolingConfig, WorkloadConfig
from workloads.spec import build_spec, embedding_dims, physical_rows, pooling_means, virtual_rows
from workloads.units import GIB


def test_default_spec():
    spec = build_spec(WorkloadConfig())
    assert len(spec.tables) == 8
    assert [t.name for t in spec.tables] == [f"t{i}" for i in range(8)]
    assert [t.feature_name for t in spec.tables] == [f"f{i}" for i in range(8)]
    t = spec.tables[0]
    assert (t.virtual_rows, t.physical_rows, t.embedding_dim, t.pooling_mean, t.bytes_per_element) == (
        10_000, 10_000, 64, 4.0, 4
    )
    assert spec.virtual_bytes == spec.physical_bytes == 8 * 10_000 * 64 * 4
    assert not spec.is_plan_only


def test_full_has_physical_equal_virtual():
    cfg = WorkloadConfig(num_tables=5, rows_distribution="log_uniform", rows_min=10, rows_max=10**10, materialize="full")
    spec = build_spec(cfg)
    assert all(t.physical_rows == t.virtual_rows for t in spec.tables)
    assert spec.physical_bytes == spec.virtual_bytes


def test_plan_only_has_no_physical_rows():
    spec = build_spec(WorkloadConfig(num_tables=3, rows=10**10, materialize="plan_only"))
    assert spec.is_plan_only
    assert all(t.physical_rows == 0 and t.virtual_rows == 10**10 for t in spec.tables)
    assert spec.physical_bytes == 0 and spec.virtual_bytes == 3 * 10**10 * 64 * 4


@pytest.mark.parametrize("data_type,bpe", [("fp32", 4), ("fp16", 2)])
@pytest.mark.parametrize("max_gib", [0.01, 0.5, 3.0])
def test_scaled_keeps_ratios_and_respects_budget(data_type, bpe, max_gib):
    rows = [10**10, 3 * 10**9, 10**8, 5 * 10**7, 10**6]
    dims = [128, 64, 64, 32, 16]
    cfg = WorkloadConfig(
        num_tables=5,
        rows_list=rows,
        embedding_dims=dims,
        data_type=data_type,
        materialize="scaled",
        scaled_max_gib=max_gib,
    )
    spec = build_spec(cfg)
    phys = [t.physical_rows for t in spec.tables]
    assert all(t.bytes_per_element == bpe for t in spec.tables)
    assert spec.physical_bytes <= max_gib * GIB
    # the budget is used (floors lose at most one row per table)
    assert spec.physical_bytes >= max_gib * GIB - sum(d * bpe for d in dims)
    factor = phys[0] / rows[0]
    for p, r in zip(phys, rows):
        assert p >= 1
        # one common factor: each table is floor(r * factor) up to that factor's own rounding
        assert abs(p - r * factor) <= 1 + r * factor * 1e-6 + r / rows[0]
    for i in range(len(rows)):
        for j in range(len(rows)):
            if phys[j] >= 1000:
                assert abs(phys[i] / phys[j] - rows[i] / rows[j]) <= rows[i] / rows[j] * 2e-3 + 1 / phys[j]


def test_scaled_leaves_small_workloads_alone():
    spec = build_spec(WorkloadConfig(materialize="scaled", scaled_max_gib=1.0))
    assert all(t.physical_rows == t.virtual_rows == 10_000 for t in spec.tables)


def test_scaled_keeps_at_least_one_row():
    cfg = WorkloadConfig(num_tables=2, rows_list=[10**12, 10], materialize="scaled", scaled_max_gib=0.001)
    spec = build_spec(cfg)
    assert spec.tables[1].physical_rows == 1
    assert spec.tables[0].physical_rows > 1


@pytest.mark.parametrize("dist", ["log_uniform", "log_normal"])
def test_drawn_rows_within_bounds_and_deterministic(dist):
    def rows(table_seed, seed=0):
        cfg = WorkloadConfig(
            num_tables=200, rows_distribution=dist, rows_min=1_000, rows_max=10**9, table_seed=table_seed, seed=seed
        )
        return virtual_rows(cfg)

    a = rows(3)
    assert len(a) == 200
    assert all(1_000 <= r <= 10**9 for r in a)
    assert len(set(a)) > 150  # actually drawn, not constant
    assert rows(3) == a
    assert rows(3, seed=99) == a  # the data seed does not move the tables
    assert rows(4) != a
    spec = build_spec(WorkloadConfig(num_tables=200, rows_distribution=dist, rows_min=1_000, rows_max=10**9, table_seed=3))
    assert [t.virtual_rows for t in spec.tables] == a


def test_log_normal_hits_the_bounds_when_clipped_and_log_uniform_spreads():
    # log_normal: +-2 sigma spans the range, so ~5% of 2000 draws clip onto the bounds
    ln = virtual_rows(WorkloadConfig(num_tables=2000, rows_distribution="log_normal", rows_min=100, rows_max=10**6))
    assert min(ln) == 100 and max(ln) == 10**6
    lu = virtual_rows(WorkloadConfig(num_tables=2000, rows_distribution="log_uniform", rows_min=100, rows_max=10**6))
    # log-uniform: about a quarter of the draws in each decade of the four
    in_first_decade = sum(1 for r in lu if r < 1000) / len(lu)
    assert 0.2 < in_first_decade < 0.3


def test_rows_list_honoured():
    cfg = WorkloadConfig(num_tables=3, rows_list=[5, 10**10, 777], rows_distribution="log_uniform", materialize="full")
    spec = build_spec(cfg)
    assert [t.virtual_rows for t in spec.tables] == [5, 10**10, 777]
    assert [t.physical_rows for t in spec.tables] == [5, 10**10, 777]


def test_per_table_dims_and_pooling_means():
    cfg = WorkloadConfig(
        num_tables=3,
        embedding_dims=[16, 32, 128],
        pooling=PoolingConfig(mean=2.0, per_table_mean=[1, 7.5, 100]),
    )
    assert embedding_dims(cfg) == [16, 32, 128]
    assert pooling_means(cfg) == [1.0, 7.5, 100.0]
    spec = build_spec(cfg)
    assert [t.embedding_dim for t in spec.tables] == [16, 32, 128]
    assert [t.pooling_mean for t in spec.tables] == [1.0, 7.5, 100.0]
    assert spec.virtual_bytes == 10_000 * (16 + 32 + 128) * 4
    assert pooling_means(WorkloadConfig(num_tables=2)) == [4.0, 4.0]


def test_physical_rows_direct():
    cfg = WorkloadConfig(materialize="scaled", scaled_max_gib=1.0)
    # 2 tables of 2^27 rows x 4 floats x 4 B = 2 GiB each -> factor 1/4
    assert physical_rows(cfg, [2**27, 2**27], [4, 4]) == [2**25, 2**25]
