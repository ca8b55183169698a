"""Unit tests of plan-mode placement (workloads/placement.py): storage formulas, membench's greedy
placement at terabyte scale, and the comparison with torchrec's default planner on a small case."""
from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import pytest

from workloads.config import WorkloadConfig
from workloads.units import GIB
from bench.planning.types import Placement, PlacementError, describe
from bench.planning.torchrec_adapter import _planner_error_storage, place_torchrec
from bench.planning.greedy import place_greedy
from workloads.storage import table_storage
from workloads.spec import TableSpec
from workloads.spec import build_spec

REPO_ROOT = Path(__file__).resolve().parent.parent


def load_workload(name: str):
    from omegaconf import OmegaConf

    path = REPO_ROOT / "conf" / "workload" / f"{name}.yaml"
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), OmegaConf.load(path)))
    return build_spec(cfg)


def table(rows: int = 1000, dim: int = 64, bpe: int = 4) -> TableSpec:
    return TableSpec(name="t", feature_name="f", virtual_rows=rows, physical_rows=0, embedding_dim=dim,
                     pooling_mean=1.0, bytes_per_element=bpe)


def assorted(num_tables: int = 40, optimizer: str = "rowwise_adagrad", **kw):
    """Plan-only tables of assorted sizes (log-uniform 1e5..2e7 rows x dim 64 fp32 = 24 MiB..4.8 GiB)."""
    cfg = WorkloadConfig(name="assorted", num_tables=num_tables, rows_distribution="log_uniform",
                         rows_min=100_000, rows_max=20_000_000, materialize="plan_only", embedding_dim=64,
                         embedding_optimizer=optimizer, batch_size=1024, **kw)
    return build_spec(cfg)


def spec_total(spec) -> int:
    return sum(sum(table_storage(t, spec.config.embedding_optimizer)) for t in spec.tables)


def check_coverage(spec, placement: Placement) -> None:
    """Every table's rows (and columns) are covered exactly once by its shards."""
    blocks = defaultdict(list)
    for s in placement.shards:
        assert 0 <= s.rank < placement.world_size
        assert s.rows > 0
        blocks[s.table].append((s.col_offset, s.row_offset, s.rows, s.dim))
    assert set(blocks) == {t.name for t in spec.tables}
    for t in spec.tables:
        cells = sum(rows * dim for _, _, rows, dim in blocks[t.name])
        assert cells == t.virtual_rows * t.embedding_dim, t.name
        if all(dim == t.embedding_dim for *_, dim in blocks[t.name]):  # row blocks: contiguous, no overlap
            offset = 0
            for _, row_offset, rows, _ in sorted(blocks[t.name]):
                assert row_offset == offset, t.name
                offset += rows
            assert offset == t.virtual_rows


# ---------------------------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("bpe", [4, 2])
def test_table_storage_formulas(bpe):
    t = table(rows=1000, dim=64, bpe=bpe)
    assert table_storage(t, "sgd") == (1000 * 64 * bpe, 0)
    assert table_storage(t, "rowwise_adagrad") == (1000 * 64 * bpe, 1000 * 4)  # fp32 state per row
    assert table_storage(t, "adam") == (1000 * 64 * bpe, 2 * 1000 * 64 * 4)  # fp32 m and v
    assert table_storage(t, "adam", rows=10) == (10 * 64 * bpe, 2 * 10 * 64 * 4)
    with pytest.raises(ValueError, match="unknown embedding optimizer"):
        table_storage(t, "lamb")


def test_table_storage_uses_virtual_rows():
    spec = build_spec(WorkloadConfig(num_tables=2, rows=10**9, materialize="plan_only", embedding_dim=128))
    assert table_storage(spec.tables[0], "sgd") == (10**9 * 128 * 4, 0)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam"])
@pytest.mark.parametrize("bpe", [4, 2])
def test_table_storage_vs_torchrec_estimator(optimizer, bpe):
    """torchrec's estimator (weights + optimizer of one table-wise shard) agrees for fp32; for fp16 it
    counts the state in fp16 (half of fbgemm's fp32 state) -- the documented difference."""
    import torch
    import torchrec.optim as trec_optim
    from torchrec.distributed.planner.shard_estimators import _calculate_storage_specific_sizes

    classes = {"sgd": torch.optim.SGD, "rowwise_adagrad": trec_optim.RowWiseAdagrad, "adam": torch.optim.Adam}
    rows, dim = 12_345, 96
    weight, state = table_storage(table(rows, dim, bpe), optimizer)
    (estimate,) = _calculate_storage_specific_sizes(
        storage=rows * dim * bpe, shape=torch.Size([rows, dim]), shard_sizes=[[rows, dim]],
        sharding_type="table_wise", optimizer_class=classes[optimizer])
    assert estimate == weight + state * bpe // 4


# ---------------------------------------------------------------------------------------------- greedy


def test_greedy_conserves_totals_and_respects_capacity():
    spec = assorted()
    capacity = 16 * GIB
    p = place_greedy(spec, 8, capacity)
    check_coverage(spec, p)
    assert p.planner == "membench" and p.world_size == 8
    assert sum(p.per_rank_bytes) == p.total_bytes == spec_total(spec)
    assert sum(p.per_rank_weight_bytes) == spec.virtual_bytes
    assert sum(s.bytes for s in p.shards) == p.total_bytes
    assert max(p.per_rank_bytes) <= capacity
    for rank, total in enumerate(p.per_rank_bytes):
        assert total == sum(s.bytes for s in p.shards if s.rank == rank)
    # tables above the shard budget (25% of 16 GiB) are split row-wise into shards within the budget
    big = {t.name for t in spec.tables if sum(table_storage(t, "rowwise_adagrad")) > 4 * GIB}
    assert big
    for name in big:
        shards = [s for s in p.shards if s.table == name]
        assert len(shards) >= 2 and all(s.sharding_type == "row_wise" for s in shards)
    assert all(s.bytes <= 4 * GIB for s in p.shards)
    rows = describe(p, capacity)
    assert len(rows) == 8 and abs(sum(r["total_gib"] for r in rows) - p.total_bytes / GIB) < 1e-6
    assert p.to_dict()["num_tables"] == 40


@pytest.mark.parametrize("tolerance", [0.0, 0.01, 0.05])
def test_greedy_balances_within_tolerance(tolerance):
    spec = load_workload("tb_1")  # 100 equal tables on 64 ranks: plain LPT is 28% off
    p = place_greedy(spec, 64, 80 * GIB, balance_tolerance=tolerance)
    check_coverage(spec, p)
    row_bytes = sum(table_storage(spec.tables[0], "rowwise_adagrad", rows=1))
    assert p.max_rank_bytes <= (1 + tolerance) * p.mean_rank_bytes + row_bytes
    plain = place_greedy(spec, 64, 80 * GIB, balance_tolerance=None)
    assert plain.imbalance == pytest.approx(2 / (100 / 64))  # two whole tables vs a mean of 1.5625
    assert all(s.sharding_type == "table_wise" for s in plain.shards)


def test_greedy_cpu_keeps_tables_whole_and_names_a_table_that_cannot_fit():
    spec = assorted()
    p = place_greedy(spec, 8, 16 * GIB, allow_row_wise=False)
    check_coverage(spec, p)
    assert len(p.shards) == 40 and all(s.sharding_type == "table_wise" for s in p.shards)
    largest = max(spec.tables, key=lambda t: t.virtual_rows)
    largest_bytes = sum(table_storage(largest, "rowwise_adagrad"))
    capacity = largest_bytes - 1000
    with pytest.raises(PlacementError, match=rf"table {largest.name} ") as info:
        place_greedy(spec, 64, capacity, allow_row_wise=False)
    assert info.value.table == largest.name and info.value.shortfall_bytes == 1000
    # with row-wise sharding the same case places fine
    place_greedy(spec, 64, capacity)


def test_greedy_cpu_overflow_after_placement():
    # three tables of 0.6 x capacity on two ranks: 1.8 <= 2 capacities, but one rank must take two
    t = table(rows=600_000, dim=100, bpe=4)  # 240 MB + 2.4 MB rowwise state
    spec = build_spec(WorkloadConfig(num_tables=3, rows=600_000, embedding_dim=100, materialize="plan_only"))
    each = sum(table_storage(t, "rowwise_adagrad"))
    capacity = int(each / 0.6)
    with pytest.raises(PlacementError, match="rank 0 would hold") as info:
        place_greedy(spec, 2, capacity, allow_row_wise=False)
    assert info.value.shortfall_bytes == 2 * each - capacity
    p = place_greedy(spec, 2, capacity)  # row-wise splits the third table
    assert p.max_rank_bytes <= capacity


def test_greedy_impossible_reports_shortfall():
    spec = load_workload("tb_10")  # 1000 x 20M x 128 fp32 + rowwise state: 9,613 GiB
    total = spec_total(spec)
    assert total == 1000 * (20_000_000 * 128 * 4 + 20_000_000 * 4)
    with pytest.raises(PlacementError) as info:
        place_greedy(spec, 64, 80 * GIB)
    shortfall = total - 64 * 80 * GIB
    assert info.value.shortfall_bytes == shortfall
    message = str(info.value)
    assert f"short by {shortfall / GIB:.1f} GiB" in message
    assert "10.32 TB" in message and "64 ranks x 80.00 GiB" in message and "\n" not in message


@pytest.mark.parametrize("name,world_size", [("tb_1", 64), ("tb_10", 512), ("tb_10", 1024)])
def test_greedy_terabyte_scale_is_fast(name, world_size):
    spec = load_workload(name)
    start = time.perf_counter()
    p = place_greedy(spec, world_size, 80 * GIB)
    elapsed = time.perf_counter() - start
    assert elapsed < 5, elapsed
    check_coverage(spec, p)
    assert p.total_bytes == spec_total(spec)
    assert p.max_rank_bytes <= 80 * GIB
    row_bytes = sum(table_storage(spec.tables[0], "rowwise_adagrad", rows=1))
    assert p.max_rank_bytes <= p.mean_rank_bytes + row_bytes  # filled to the mean


# ---------------------------------------------------------------------------------------------- torchrec


@pytest.fixture(scope="module")
def small_torchrec():
    """torchrec's default planner on 40 assorted tables (46 GiB with rowwise state), 8 ranks of 16 GiB."""
    spec = assorted()
    return spec, place_torchrec(spec, 8, 16 * GIB)


def test_torchrec_small_case_adds_up(small_torchrec):
    spec, p = small_torchrec
    assert p.planner == "torchrec" and p.world_size == 8 and p.plan_time_s > 0
    check_coverage(spec, p)
    assert sum(p.per_rank_weight_bytes) == spec.virtual_bytes
    # fp32 rowwise adagrad: torchrec's optimizer estimate equals ours (up to a byte of rounding per shard)
    assert abs(sum(p.per_rank_optimizer_bytes) - sum(t.virtual_rows * 4 for t in spec.tables)) <= len(p.shards)
    for rank in range(8):
        assert p.per_rank_bytes[rank] == sum(s.bytes for s in p.shards if s.rank == rank)
        # the estimator's storage = weights + optimizer + its other (I/O buffer) estimates
        assert (p.per_rank_weight_bytes[rank] + p.per_rank_optimizer_bytes[rank] + p.per_rank_other_bytes[rank]
                == p.per_rank_hbm_bytes[rank] + p.per_rank_ddr_bytes[rank])
        assert p.per_rank_other_bytes[rank] >= 0


def test_greedy_no_worse_than_torchrec(small_torchrec):
    """Like for like: both placements of the same tables, weights + optimizer state per rank, with the
    same storage formulas (fp32, where table_storage equals torchrec's estimator)."""
    spec, theirs = small_torchrec
    ours = place_greedy(spec, 8, 16 * GIB)
    assert abs(ours.total_bytes - theirs.total_bytes) <= len(theirs.shards)
    assert ours.max_rank_bytes <= theirs.max_rank_bytes
    assert ours.imbalance <= theirs.imbalance
    assert ours.plan_time_s < theirs.plan_time_s


def test_planner_error_shortfall_parsing():
    message = ("Unable to find a plan ...\n\t  Global storage available for model parallel: "
               "Storage(hbm = 100.5 GB, ddr = 10.0 GB), \n\t  Global storage requirement for model "
               "parallel: Storage(hbm = 160.5 GB, ddr = 4.0 GB))\n")
    assert _planner_error_storage(message) == (60 * GIB, int(160.5 * GIB), int(100.5 * GIB), "hbm")
    host_short = message.replace("ddr = 4.0", "ddr = 14.0").replace("hbm = 160.5", "hbm = 90.5")
    assert _planner_error_storage(host_short) == (4 * GIB, 14 * GIB, 10 * GIB, "host")
    assert _planner_error_storage("no storage here") is None


def test_torchrec_insufficient_storage_becomes_placement_error():
    spec = assorted(num_tables=4)
    with pytest.raises(PlacementError, match="short by .* GiB .*storage reservation") as info:
        place_torchrec(spec, 2, GIB // 4, ddr_cap_bytes=GIB // 4, local_world_size=2)
    assert info.value.shortfall_bytes > 0
    assert "\n" not in str(info.value)
