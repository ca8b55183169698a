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
    """One row per table: sharding type, compute kernel and the ranks holding its shards."""
    rows = []
    for module_path, module_plan in plan.plan.items():
        for table_name, param_sharding in module_plan.items():
            rows.append({
                "module": module_path,
                "table": table_name,
                "sharding_type": param_sharding.sharding_type,
                "compute_kernel": param_sharding.compute_kernel,
                "ranks": list(param_sharding.ranks or []),
            })
    return sorted(rows, key=lambda row: row["table"])
