"""Per-rank peak memory prediction, before launch, for any sharding plan and world size.

    predicted peak = embedding storage from the plan (weights, optimizer state, and gradients of
                     data-parallel tables)
                   + a dry run of the dense part (dense/interaction/over arch, loss, backward, dense
                     optimizer) on the meta device, counted by the same live-tensor tracker as real runs
                   + persistent dense gradient buckets (DDP)
                   + sum_i c_i * feature_i   (a calibrated correction)

The dry run (bench/planning/dry_run.py) simulates the rank's sparse side too (input and received ids,
pooled lookups, the all-to-all buffers of forward and backward, with torchrec's lifetimes), so peaks that
do not coincide are not simply added. The correction's features are sizes the model implies (pooled
embeddings received and sent, ids, replicated tables); its coefficients are calibrated per hardware
from measured runs (bench/planning/calibration.py), zero without one.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from bench.accounting.caching_allocator.replay import AllocationStream, replay
from bench.planning.dry_run import DenseDryRun, DryRunModel
from bench.planning.types import DATA_PARALLEL, PooledGroup, RankPrediction, RankShare
from bench.results.schema import IN_FLIGHT, has_cuda_allocator
from workloads.spec import WorkloadSpec
from workloads.storage import optimizer_state_bytes
from workloads.uvm_cache import FUSED, effective_caching_ratio, shard_tiers

# the calibrated correction's features: features_for_rank's keys, each a calibration's coefficient
FEATURES = ("const", "pooled_received", "pooled_sent", "ids_input", "ids_received", "data_parallel_tables")


def shares_from_plan(plan_rows: List[dict], spec: WorkloadSpec, world_size: int,
                     caching_ratio: Optional[float] = None) -> List[RankShare]:
    """Per-rank embedding storage from `torchrec_adapter.describe_plan` rows (torchrec's ShardingPlan): each
    shard where its compute kernel keeps it (UVM-cached shards with a cache of `caching_ratio`)."""
    tables = {t.name: t for t in spec.tables}
    shares = [RankShare() for _ in range(world_size)]
    for row in plan_rows:
        table = tables[row["table"]]
        if row["sharding_type"] == DATA_PARALLEL:
            for share in shares:
                add_replicated_table(share, table, spec.config.dense_optimizer)
            continue
        for shard in row["shards"]:
            rows, cols = shard["sizes"]
            add_sharded_table(shares[shard["rank"]], table, rows, cols, spec.config.embedding_optimizer,
                              row.get("compute_kernel", FUSED), caching_ratio)
    permuted = input_features_permuted(plan_rows, spec, world_size)
    for share, groups in zip(shares, pooled_groups(plan_rows, spec, world_size)):
        share.pooled_groups, share.input_permuted = groups, permuted
    return shares


# the sharding types whose input dist sends each table's features to the ranks of its shards, rank by rank
PER_RANK_FEATURES = ("table_wise", "column_wise", "table_column_wise")


def input_features_permuted(plan_rows: List[dict], spec: WorkloadSpec, world_size: int) -> bool:
    """Whether torchrec's sharded EmbeddingBagCollection permutes the batch's features before its input dist:
    unless its shardings' feature names (per sharding type, where its first table is; table- and column-wise
    ones rank by rank, a feature once per shard) are the batch's own order (torchrec 1.8 `_create_input_dist`)."""
    sharding_of = {row["table"]: row for row in plan_rows}
    kinds = list(dict.fromkeys(sharding_of[t.name]["sharding_type"] for t in spec.tables))
    names: List[str] = []
    for kind in kinds:
        tables = [t for t in spec.tables if sharding_of[t.name]["sharding_type"] == kind]
        if kind == DATA_PARALLEL:
            names += [t.feature_name for t in tables]
        elif kind in PER_RANK_FEATURES:  # rank by rank, each rank's shards in table order (a stable sort)
            shards = [(shard["rank"], t.feature_name) for t in tables for shard in sharding_of[t.name]["shards"]]
            names += [name for _, name in sorted(shards, key=lambda shard: shard[0])]
        else:
            return True  # row-wise and the hierarchical types: not modelled, torchrec's general case assumed
    return names != [t.feature_name for t in spec.tables]


def plan_rows_from_placement(placement) -> List[dict]:
    """A torchrec placement as `describe_plan` rows (table, sharding_type, shards with rank and [rows, cols];
    none for a data-parallel table, which every rank holds whole), for `shares_from_plan`."""
    rows: Dict[str, dict] = {}
    for shard in placement.shards:
        row = rows.setdefault(shard.table, {"table": shard.table, "sharding_type": shard.sharding_type,
                                            "compute_kernel": shard.compute_kernel, "shards": []})
        if shard.sharding_type != DATA_PARALLEL:
            row["shards"].append({"rank": shard.rank, "sizes": [shard.rows, shard.dim]})
    return list(rows.values())


def add_replicated_table(share: RankShare, table, dense_optimizer: str) -> None:
    """A data-parallel table on the rank: replicated everywhere, its gradients materialize and the dense
    optimizer keeps their state; looked up locally for the local batch (nothing crosses an all-to-all)."""
    share.weight_bytes += table.physical_bytes
    share.grad_bytes += table.physical_bytes
    share.replicated_dims += table.embedding_dim
    share.replicated_pooling += table.expected_pooling
    share.replicated_features += 1
    share.replicated_tables.append((table.physical_rows, table.embedding_dim))
    share.optimizer_bytes += optimizer_state_bytes(dense_optimizer, table.physical_rows, table.embedding_dim)


def add_sharded_table(share: RankShare, table, rows: int, cols: int, embedding_optimizer: str,
                      compute_kernel: str = FUSED, caching_ratio: Optional[float] = None) -> None:
    """A `rows` x `cols` shard of `table` on the rank (fused optimizer), where `compute_kernel` keeps it
    (workloads/uvm_cache.py): it serves every rank's batch."""
    tiers = shard_tiers(compute_kernel, rows, cols, table.bytes_per_element,
                        rows * cols * table.bytes_per_element, optimizer_state_bytes(embedding_optimizer, rows, cols),
                        effective_caching_ratio(caching_ratio))
    add_tiers(share, tiers)
    share.sent_dims += cols
    share.sent_pooling += table.expected_pooling
    share.sent_features += 1


def add_tiers(share: RankShare, tiers) -> None:
    """A shard's bytes onto the rank, in HBM and in host memory as its kernel keeps them (`ShardTiers`)."""
    share.weight_bytes += tiers.hbm_weight_bytes
    share.optimizer_bytes += tiers.hbm_optimizer_bytes
    share.cache_bytes += tiers.cache_bytes
    share.cache_state_bytes += tiers.cache_state_bytes
    share.host_bytes += tiers.host_bytes


def pooled_groups(plan_rows: List[dict], spec: WorkloadSpec, world_size: int) -> List[List[PooledGroup]]:
    """Each rank's pooled embeddings per sharding type, in the order torchrec's sharded
    EmbeddingBagCollection builds its groups (each type where its first table is); one pass over the plan."""
    sharding_of = {row["table"]: row for row in plan_rows}
    dims: Dict[str, int] = {}
    for table in spec.tables:
        kind = sharding_of[table.name]["sharding_type"]
        dims[kind] = dims.get(kind, 0) + table.embedding_dim
    sent = [dict.fromkeys(dims, 0) for _ in range(world_size)]
    for row in plan_rows:
        if row["sharding_type"] == DATA_PARALLEL:
            continue  # looked up locally: a replicated table's pooled output crosses no all-to-all
        for shard in row["shards"]:
            sent[shard["rank"]][row["sharding_type"]] += shard["sizes"][1]
    return [[PooledGroup(dims[kind], sent_by_kind[kind], kind != DATA_PARALLEL) for kind in dims]
            for sent_by_kind in sent]


def table_totals(spec: WorkloadSpec) -> Tuple[int, float]:
    """(embedding dims, mean pooling) summed over the tables: what every rank receives and reads as input."""
    return sum(t.embedding_dim for t in spec.tables), sum(t.expected_pooling for t in spec.tables)


def features_for_rank(spec: WorkloadSpec, share: RankShare, world_size: int,
                      totals: Tuple[int, float]) -> Dict[str, float]:
    """The calibration's features of one rank; `totals` is table_totals(spec), the same for every rank."""
    batch = spec.config.batch_size
    total_dims, total_pooling = totals
    return {
        "const": 1.0,
        "pooled_received": batch * total_dims * 4.0,
        "pooled_sent": batch * world_size * share.sent_dims * 4.0,
        "ids_input": batch * total_pooling * 8.0,
        "ids_received": batch * world_size * share.sent_pooling * 8.0,
        # replicated tables: their dense gradients and lookups are not simulated in the dry run
        "data_parallel_tables": float(share.grad_bytes),
    }


def predict(spec: WorkloadSpec, shares: Sequence[RankShare], coefficients: Dict[str, float],
            model: Optional[DryRunModel] = None, allocator_settings=None,
            world_size: Optional[int] = None) -> List[RankPrediction]:
    """Per-rank peak: one dry run (with the rank's sparse side simulated) per distinct rank share, plus
    the calibrated correction. Pass `model` to reuse a built dry-run model across calls; with
    `allocator_settings` (a GPU) the rank's tables and its dry run's allocations are replayed through a model
    of the CUDA caching allocator, whose reserved-minus-allocated at their peaks is the prediction's
    allocator_overhead. `world_size` (default: one share per rank) predicts some ranks of a larger job."""
    world_size = world_size or len(shares)
    model = model or DryRunModel(spec)
    runs: Dict[tuple, DenseDryRun] = {}
    overheads: Dict[tuple, int] = {}
    predictions = []
    totals = table_totals(spec)  # the same for every rank: 4,096 ranks of 1,000 tables summed it in 0.6 s
    for rank, share in enumerate(shares):
        features = features_for_rank(spec, share, world_size, totals)
        key = (share.sent_dims, round(share.sent_pooling, 3), share.sent_features, round(share.replicated_pooling, 3),
               share.replicated_features, tuple(share.pooled_groups), share.input_permuted)
        if key not in runs:
            runs[key] = model.run(share, world_size, record_allocations=allocator_settings is not None)
        run = runs[key]
        activations = (run.peak_bytes - run.params_bytes - run.grads_bytes - run.optimizer_bytes
                       - run.in_flight_bytes)
        residual = sum(coefficients.get(name, 0.0) * value for name, value in features.items())
        breakdown = {
            "embedding_weights": share.weight_bytes,
            "embedding_optimizer": share.optimizer_bytes,
            "embedding_cache": share.cache_bytes,
            "embedding_cache_state": share.cache_state_bytes,
            "embedding_grads": share.grad_bytes,
            "dense_params": run.params_bytes,
            "dense_grads": run.grads_bytes,  # DDP keeps persistent fp32 gradient buckets
            "dense_optimizer": run.optimizer_bytes,
            "activations": int(round(activations + residual)),
            IN_FLIGHT: run.in_flight_bytes,
        }
        if run.allocations is not None:
            tables = (share.weight_bytes, share.optimizer_bytes, share.grad_bytes,
                      *(b for b in (share.cache_bytes, share.cache_state_bytes) if b))  # the cache: allocator-held
            if (key, tables) not in overheads:  # ranks alike replay once: a plan may have thousands
                overheads[key, tables] = allocator_overhead(run.allocations, tables, allocator_settings,
                                                            run.params_events)
            breakdown["allocator_overhead"] = overheads[key, tables]
        predictions.append(RankPrediction(rank, sum(breakdown.values()), breakdown, features, share.host_bytes))
    return predictions


# -- plan mode: shares from membench's own placement, and device overheads -----------------------
# Without an allocator model (a prediction made without one): the caching allocator keeps about this share
# above what tensors use
GPU_ALLOCATOR_OVERHEAD_FRACTION = 0.05


def allocator_overhead(allocations: AllocationStream, tables: Sequence[int], settings, params_events: int = 0) -> int:
    """What the caching allocator reserves beyond the tensors on a rank: the dry run's stream replayed through
    the model, with the rank's tables (weights, optimizer state, replicated gradients: one tensor each, as
    fbgemm keeps a group of tables in one, allocated at build) placed after its first `params_events` (the
    dense parameters, built first); one dry run serves every rank with the same sparse shape, whatever its
    tables weigh."""
    return replay(allocations.events, settings, before=tables, before_at=params_events).overhead_bytes


def shares_from_placement(placement, spec: WorkloadSpec, caching_ratio: Optional[float] = None) -> List[RankShare]:
    """Per-rank embedding storage from a `Placement` (virtual-row shards), each where its kernel keeps it."""
    tables = {t.name: t for t in spec.tables}
    shares = [RankShare() for _ in range(placement.world_size)]
    for shard in placement.shards:
        table = tables[shard.table]
        share = shares[shard.rank]
        add_tiers(share, shard_tiers(shard.compute_kernel, shard.rows, shard.dim, table.bytes_per_element,
                                     shard.weight_bytes, shard.optimizer_bytes, effective_caching_ratio(caching_ratio)))
        share.sent_dims += shard.dim
        # a row-wise shard sees the ids that hash into its rows
        share.sent_pooling += table.expected_pooling * shard.rows / max(1, table.virtual_rows)
        share.sent_features += 1
    return shares


def add_device_overheads(prediction: RankPrediction, device_type: str, non_torch_bytes: int) -> RankPrediction:
    """On a GPU (real or simulated): the caching allocator's overhead (modelled by `predict`, else a share of
    the tensors) and the memory outside it (CUDA context, NCCL: hardware.non_torch_reserve_mib)."""
    if not has_cuda_allocator(device_type):
        return prediction
    if "allocator_overhead" not in prediction.breakdown:
        prediction.breakdown["allocator_overhead"] = int(prediction.total_bytes * GPU_ALLOCATOR_OVERHEAD_FRACTION)
    prediction.breakdown["non_torch"] = non_torch_bytes
    prediction.total_bytes = sum(prediction.breakdown.values())
    return prediction
