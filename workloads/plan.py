"""Sharding plans from torchrec's planner, for any topology (no GPU or process group needed to plan).

Only the pieces the runner needs live here for now: constraints from the sharding config, a quiet
planner for a topology, and a readable per-table summary of the chosen plan.
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Optional

from workloads.spec import WorkloadSpec

GIB = 1024**3


def parameter_constraints(spec: WorkloadSpec, sharding_type: str, per_table: Dict[str, str],
                          compute_kernel: str) -> Dict[str, "ParameterConstraints"]:
    from torchrec.distributed.planner.types import ParameterConstraints

    constraints = {}
    for table in spec.tables:
        chosen = per_table.get(table.name, sharding_type)
        kernels = None
        if compute_kernel != "auto":
            kernels = [compute_kernel]
        elif chosen == "data_parallel":
            kernels = ["dense"]  # fused kernels cannot be replicated
        constraints[table.name] = ParameterConstraints(
            sharding_types=None if chosen == "auto" else [chosen],
            compute_kernels=kernels,
            pooling_factors=[table.pooling_mean],
        )
    return constraints


def make_topology(world_size: int, compute_device: str, hbm_cap_bytes: Optional[int],
                  ddr_cap_bytes: int, local_world_size: int):
    from torchrec.distributed.planner.types import Topology

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Topology constructed directly" is expected here
        return Topology(world_size=world_size, compute_device=compute_device, hbm_cap=hbm_cap_bytes,
                        ddr_cap=ddr_cap_bytes, local_world_size=local_world_size)


def make_planner(spec: WorkloadSpec, topology, sharding_type: str, per_table: Dict[str, str],
                 compute_kernel: str):
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    return EmbeddingShardingPlanner(
        topology=topology,
        batch_size=spec.config.batch_size,
        constraints=parameter_constraints(spec, sharding_type, per_table, compute_kernel),
        stats=[],  # the planner's stats table is noise in per-rank logs
        debug=False,
    )


def describe_plan(plan) -> List[dict]:
    """One row per table: sharding type, compute kernel, the ranks holding it and each shard's
    [rows, cols] (none for data-parallel tables, which every rank holds whole)."""
    rows = []
    for module_path, module_plan in plan.plan.items():
        for table_name, param_sharding in module_plan.items():
            spec = param_sharding.sharding_spec
            shards = [{"rank": shard.placement.rank(), "offsets": list(shard.shard_offsets),
                       "sizes": list(shard.shard_sizes)} for shard in getattr(spec, "shards", None) or []]
            rows.append({
                "module": module_path,
                "table": table_name,
                "sharding_type": param_sharding.sharding_type,
                "compute_kernel": param_sharding.compute_kernel,
                "ranks": list(param_sharding.ranks or []),
                "shards": shards,
            })
    return sorted(rows, key=lambda row: row["table"])


def make_sharding_plan(cfg, spec: WorkloadSpec, world_size: int, ranks_per_node: int, device_type: str,
                       capacity_bytes: int, model, process_group=None):
    """torchrec's plan for `model` (tables on meta) on this topology: (ShardingPlan, planner).

    With a process group, rank 0 plans and broadcasts (what the workers do); without one the plan is
    computed locally, which is how the launcher predicts memory before starting any rank. The planner
    is deterministic, so both give the same plan.
    """
    from torchrec.distributed.sharding_plan import get_default_sharders

    topology = make_topology(
        world_size=world_size, compute_device=device_type,
        hbm_cap_bytes=capacity_bytes if device_type == "cuda" else None,
        ddr_cap_bytes=int(cfg.hardware.host_memory_gib * GIB), local_world_size=ranks_per_node)
    planner = make_planner(spec, topology, cfg.sharding.type, dict(cfg.sharding.per_table),
                           cfg.sharding.compute_kernel)
    sharders = get_default_sharders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if process_group is not None:
            plan = planner.collective_plan(model, sharders, process_group)
        else:
            plan = planner.plan(model, sharders)
    return plan, planner


def torchrec_rank_estimates(planner, world_size: int) -> List[int]:
    """torchrec's own per-rank memory estimate for its chosen plan: the storage of every shard it placed
    (weights, optimizer state and its input/output buffer estimates) plus what its storage reservation
    set aside for dense tensors and KJTs. The shards come from `placement._best_plan_shards`, the one
    reader of the planner's private `_best_plan`; the reservation is private state too."""
    from workloads.placement import _best_plan_shards

    per_rank = [0] * world_size
    for *_, rank, hbm_bytes, ddr_bytes in _best_plan_shards(planner):
        per_rank[rank] += hbm_bytes + ddr_bytes
    reservation = getattr(planner, "_storage_reservation", None)
    for name in ("_dense_storage", "_kjt_storage"):
        storage = getattr(reservation, name, None)
        if storage is not None:
            per_rank = [total + storage.hbm + storage.ddr for total in per_rank]
    return per_rank
