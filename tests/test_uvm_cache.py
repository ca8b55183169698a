"""Where a shard's bytes live under each compute kernel (workloads/uvm_cache.py): the host part against
torchrec's own shard estimator, the cache's bookkeeping against FBGEMM's formula (#3114), and the difference
from torchrec's HBM figure named."""
from __future__ import annotations

import pytest
import torch

from workloads.storage import optimizer_state_bytes, weight_bytes
from workloads.uvm_cache import (CACHE_ASSOCIATIVITY, FUSED, FUSED_UVM, FUSED_UVM_CACHING, cache_slots,
                                 cache_state_bytes, shard_tiers, torchrec_cache_bytes)


def torchrec_storage(kernel: str, rows: int, dim: int, ratio: float, optimizer=torch.optim.Adam):
    """torchrec 1.8's `calculate_shard_storages` for one table-wise shard on a GPU, without pipeline I/O (no
    batch): its HBM and DDR bytes."""
    from torchrec.distributed.planner.shard_estimators import calculate_shard_storages
    from torchrec.distributed.planner.types import SharderData
    from torchrec.distributed.types import StorageUsageType

    tensor = torch.empty(rows, dim, dtype=torch.float32, device="meta")
    tensor._optimizer_classes = [optimizer]
    (storage,) = calculate_shard_storages(
        SharderData(fused_params={}, qcomm_dtype_sizes={}, storage_usage_type=StorageUsageType.BASE), "table_wise",
        tensor, "cuda", kernel, [[rows, dim]], batch_sizes=[0], world_size=2, local_world_size=2,
        input_lengths=[0.0], num_poolings=[1.0], caching_ratio=ratio, is_pooled=True, input_data_type_size=8,
        output_data_type_size=4)
    return storage.hbm, storage.ddr


@pytest.mark.parametrize("rows, dim, ratio", [(100_000, 64, 0.2), (12_345, 128, 0.05), (1_000, 16, 1.0)])
def test_a_uvm_shard_s_host_part_is_torchrec_s_and_its_cache_follows_fbgemm(rows, dim, ratio):
    weights, state = weight_bytes(rows, dim, 4), optimizer_state_bytes("adam", rows, dim)
    for kernel in (FUSED_UVM, FUSED_UVM_CACHING):
        tiers = shard_tiers(kernel, rows, dim, 4, weights, state, ratio)
        hbm, ddr = torchrec_storage(kernel, rows, dim, ratio)
        assert tiers.host_bytes == ddr == weights + state  # in managed memory: weights and optimizer state
    cached = shard_tiers(FUSED_UVM_CACHING, rows, dim, 4, weights, state, ratio)
    slots = cache_slots(rows, ratio)
    assert slots % CACHE_ASSOCIATIVITY == 0 and rows * ratio <= slots < rows * ratio + CACHE_ASSOCIATIVITY
    assert cached.cache_bytes == slots * dim * 4
    assert cached.cache_state_bytes == 4 * rows + 8 * slots + 8 * slots  # FBGEMM #3114
    # torchrec prices the cache with the optimizer state of its share (fbgemm keeps the state in managed
    # memory) and without fbgemm's set rounding: its figure is ours plus those terms
    hbm, _ = torchrec_storage(FUSED_UVM_CACHING, rows, dim, ratio)
    assert hbm == torchrec_cache_bytes(rows, weights, 2.0, ratio)
    optimizer_share = 2 * round(weights * ratio)  # adam: two states per cached weight
    rounding = CACHE_ASSOCIATIVITY * (dim * 4 + 16) + 1  # at most one set more in fbgemm's cache
    assert abs(hbm - cached.hbm_bytes - optimizer_share) <= rounding


def test_a_fused_shard_is_all_in_hbm_and_a_uvm_shard_holds_none_there():
    fused = shard_tiers(FUSED, 1000, 16, 4, 64_000, 128_000)
    assert (fused.hbm_bytes, fused.host_bytes) == (192_000, 0)
    uvm = shard_tiers(FUSED_UVM, 1000, 16, 4, 64_000, 128_000)
    assert (uvm.hbm_bytes, uvm.host_bytes) == (0, 192_000)
    assert cache_slots(1000, 0.0) == 0 and cache_state_bytes(1000, 0) == 4000


def plan_uvm(*overrides: str, planner: str = "torchrec"):
    """`planner`'s plan of tiny on 2 H100 ranks (plan mode) with `overrides`: (spec, placement, predictions, the
    judged outcome)."""
    from bench.planning.dry_run import dry_run_for
    from bench.planning.provision import judge_plan, place, predict_ranks
    from bench.run.config import with_changes
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import resolve_target
    from workloads.spec import build_spec

    cfg = compose_run_config(["workload=tiny", "hardware=h100_80g", f"plan.planner={planner}", "world_size=2",
                              *overrides])
    spec = build_spec(cfg.workload)
    target = resolve_target(with_changes(cfg, mode="plan"), visible_cuda=None)
    placement = place(cfg, spec, target, target.world_size)
    predictions, calibration = predict_ranks(cfg, spec, target, placement, dry_run_for(cfg, spec))
    return spec, placement, predictions, judge_plan(cfg, target, predictions, placement, calibration)


@pytest.mark.parametrize("planner, ratio", [("torchrec", None), ("torchrec", 0.05), ("membench", 0.05)])
def test_plan_mode_puts_a_cached_table_s_cache_in_hbm_and_the_table_in_host_memory(planner, ratio):
    """`membench plan` with fused_uvm_caching: each rank's HBM holds the caches of its shards and their
    bookkeeping (fbgemm's sizes), no table weights; the node's host memory holds the tables and their optimizer
    state, which (torchrec's planner) is torchrec's own DDR estimate for the same plan, to the byte, and
    (membench's placement, which once put these tables in HBM) the tables' whole storage."""
    extra = [] if ratio is None else [f"sharding.caching_ratio={ratio}"]
    spec, placement, predictions, outcome = plan_uvm("sharding.compute_kernel=fused_uvm_caching", *extra,
                                                     planner=planner)
    assert outcome.status == "ok", outcome.error
    assert {s.compute_kernel for s in placement.shards} == {FUSED_UVM_CACHING}
    for prediction in predictions:
        mine = [s for s in placement.shards if s.rank == prediction.rank]
        slots = [cache_slots(s.rows, ratio or 0.2) for s in mine]
        b = prediction.breakdown
        assert b["embedding_weights"] == b["embedding_optimizer"] == 0
        assert b["embedding_cache"] == sum(n * s.dim * 4 for n, s in zip(slots, mine))
        assert b["embedding_cache_state"] == sum(cache_state_bytes(s.rows, n) for n, s in zip(slots, mine))
        assert prediction.host_bytes == placement.per_rank_ddr_bytes[prediction.rank] > 0  # torchrec's figure
    assert outcome.estimate["per_node_host_bytes"] == [sum(placement.per_rank_ddr_bytes)]
    assert {t.bytes_per_element for t in spec.tables} == {4}
    assert sum(placement.per_rank_ddr_bytes) == sum(s.weight_bytes + s.optimizer_bytes for s in placement.shards)


def test_a_plan_whose_uvm_tables_exceed_host_memory_does_not_fit_and_says_so():
    """torchrec's planner refuses a UVM plan beyond the node's host memory per rank (its DDR): the verdict says
    host memory binds, and how to fix it; membench's own check of each node holds the same line."""
    from bench.planning.provision import host_memory, host_memory_error, plan
    from bench.planning.types import PlanTarget, RankPrediction
    from bench.run.config import with_changes
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import resolve_target
    from workloads.spec import build_spec

    for planner in ("torchrec", "membench"):
        cfg = compose_run_config(["workload=tiny", "hardware=h100_80g", f"plan.planner={planner}", "world_size=2",
                                  "sharding.compute_kernel=fused_uvm", "hardware.host_memory_gib=0.01"])
        outcome = plan(cfg, build_spec(cfg.workload), resolve_target(with_changes(cfg, mode="plan"), visible_cuda=None))
        assert outcome.status == "oom" and outcome.estimate["binding"] == "host", (planner, outcome.error)
        assert "host memory" in outcome.error and "hardware.host_memory_gib" in outcome.error
    *_, predictions, roomy = plan_uvm("sharding.compute_kernel=fused_uvm")
    assert roomy.status == "ok" and roomy.estimate["binding"] is None
    assert all(p.breakdown["embedding_weights"] == p.breakdown["embedding_cache"] == 0 for p in predictions)
    target = PlanTarget("cuda", ranks_per_node=2, world_size=4, capacity_bytes=1 << 30)
    ranks = [RankPrediction(rank, 0, {}, host_bytes=host) for rank, host in enumerate([3, 4, 5, 1])]
    host = host_memory(cfg, target, ranks)
    assert host["per_node_host_bytes"] == [7, 6]
    assert host_memory_error({**host, "host_capacity_bytes": 7}) is None
    assert "node 0 needs" in host_memory_error({**host, "host_capacity_bytes": 6})
