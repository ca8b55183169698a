"""Records every planning stage shares, and one Protocol per stage (as torchrec's planner/types.py does).

Stages: a `Placer` puts a workload's tables on N ranks (membench's greedy placement, or torchrec's planner
through the adapter) and returns a `Placement`; the estimator turns each rank's `RankShare` of the tables
into a `RankPrediction` of its peak. Sizes are in bytes; plan mode sizes every table by its VIRTUAL rows
(plan_only workloads materialize nothing).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol

from workloads.spec import WorkloadSpec
from workloads.units import GIB, TB
from workloads.validate import ConfigError

# torchrec's name for a replicated table: looked up locally, its pooled output crosses no all-to-all
DATA_PARALLEL = "data_parallel"
# torchrec's planner's memory model (plan.memory_model): its own, or membench's (torchrec_memory_model)
MEMORY_MODELS = ("torchrec", "membench")


def validate_memory_model(value: str) -> None:
    if value not in MEMORY_MODELS:
        raise ConfigError("plan.memory_model", value, f"use {' or '.join(MEMORY_MODELS)}")


@dataclass(frozen=True)
class PlanTarget:
    """What a plan is made for: the device type, ranks per node, world size and memory per rank."""
    device_type: str  # cpu | cuda
    ranks_per_node: int
    world_size: int
    capacity_bytes: int


@dataclass(frozen=True)
class Shard:
    """A contiguous block of one table on one rank: rows [row_offset, row_offset + rows), columns
    [col_offset, col_offset + dim)."""

    table: str
    # membench: "table_wise" | "row_wise"; torchrec shards keep torchrec's name (e.g. "column_wise",
    # "table_row_wise", "data_parallel")
    sharding_type: str
    row_offset: int
    rows: int
    dim: int
    weight_bytes: int
    optimizer_bytes: int
    rank: int
    col_offset: int = 0
    # torchrec's compute kernel ("fused" = weights and state in HBM, "fused_uvm_caching" = host memory
    # with an HBM cache, ...); membench places everything in device memory ("fused")
    compute_kernel: str = "fused"

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.optimizer_bytes


@dataclass
class Placement:
    planner: str  # "membench" | "torchrec"
    world_size: int
    shards: List[Shard]
    per_rank_weight_bytes: List[int]  # embedding weights per rank
    per_rank_optimizer_bytes: List[int]  # embedding optimizer state per rank
    plan_time_s: float
    # torchrec only: what its estimator charges a rank beyond weights + optimizer state (input/output
    # buffers of the lookups, the HBM cache and cache state of UVM-cached tables). Not part of
    # `per_rank_bytes`, which stays comparable between planners. Empty for membench.
    per_rank_other_bytes: List[int] = field(default_factory=list)
    # Where the storage lives according to the planner: device memory (HBM) vs host memory (DDR, UVM).
    # membench: everything in HBM. torchrec: its estimator's shard.storage.hbm / .ddr (includes the
    # "other" bytes above).
    per_rank_hbm_bytes: List[int] = field(default_factory=list)
    per_rank_ddr_bytes: List[int] = field(default_factory=list)
    # free-form facts about the run (passes, shard budget, model build time, ...)
    info: Dict[str, object] = field(default_factory=dict)

    @property
    def per_rank_bytes(self) -> List[int]:
        """Embedding weights + optimizer state per rank."""
        return [w + o for w, o in zip(self.per_rank_weight_bytes, self.per_rank_optimizer_bytes)]

    @property
    def total_bytes(self) -> int:
        return sum(self.per_rank_weight_bytes) + sum(self.per_rank_optimizer_bytes)

    @property
    def max_rank_bytes(self) -> int:
        return max(self.per_rank_bytes, default=0)

    @property
    def mean_rank_bytes(self) -> float:
        return self.total_bytes / self.world_size if self.world_size else 0.0

    @property
    def imbalance(self) -> float:
        """max / mean of per-rank bytes (1.0 = perfectly balanced)."""
        mean = self.mean_rank_bytes
        return self.max_rank_bytes / mean if mean else 1.0

    def to_dict(self, include_shards: bool = False) -> dict:
        out = {
            "planner": self.planner,
            "world_size": self.world_size,
            "num_tables": len({s.table for s in self.shards}),
            "num_shards": len(self.shards),
            "sharding_types": dict(Counter(s.sharding_type for s in self.shards)),
            "compute_kernels": dict(Counter(s.compute_kernel for s in self.shards)),
            "plan_time_s": self.plan_time_s,
            "total_bytes": self.total_bytes,
            "total_weight_bytes": sum(self.per_rank_weight_bytes),
            "total_optimizer_bytes": sum(self.per_rank_optimizer_bytes),
            "max_rank_bytes": self.max_rank_bytes,
            "max_rank_gib": self.max_rank_bytes / GIB,
            "mean_rank_gib": self.mean_rank_bytes / GIB,
            "imbalance": self.imbalance,
            "per_rank_weight_bytes": list(self.per_rank_weight_bytes),
            "per_rank_optimizer_bytes": list(self.per_rank_optimizer_bytes),
            "per_rank_other_bytes": list(self.per_rank_other_bytes),
            "per_rank_hbm_bytes": list(self.per_rank_hbm_bytes),
            "per_rank_ddr_bytes": list(self.per_rank_ddr_bytes),
            "info": dict(self.info),
        }
        if include_shards:
            out["shards"] = [vars(s).copy() for s in self.shards]
        return out


class PlacementError(ValueError):
    """The tables cannot be placed; `shortfall_bytes` is how much memory is missing (0 when the
    failure is not about the total, e.g. a table that cannot be split)."""

    def __init__(self, message: str, shortfall_bytes: int = 0, table: Optional[str] = None,
                 binding: Optional[str] = None):
        super().__init__(message)
        self.shortfall_bytes = int(shortfall_bytes)
        self.table = table
        self.binding = binding  # the memory that ran out: "hbm" (device) or "host" (UVM tables), if known


def human_size(num_bytes: int) -> str:
    return f"{num_bytes / TB:.2f} TB" if num_bytes >= TB // 100 else f"{num_bytes / GIB:.2f} GiB"


def capacity_error(total_bytes: int, world_size: int, capacity_bytes: int, shortfall_bytes: int,
                   detail: str = "", need_bytes: Optional[int] = None,
                   have_bytes: Optional[int] = None, binding: Optional[str] = None) -> PlacementError:
    """The one-line "cannot place ... short by ..." error every placer raises when memory runs out."""
    need = total_bytes if need_bytes is None else need_bytes
    have = world_size * capacity_bytes if have_bytes is None else have_bytes
    return PlacementError(
        f"cannot place {human_size(total_bytes)} of tables on {world_size} ranks x "
        f"{capacity_bytes / GIB:.2f} GiB: short by {shortfall_bytes / GIB:.1f} GiB "
        f"(need {need / GIB:.1f} GiB, have {have / GIB:.1f} GiB{detail}); "
        + ("use more ranks or more host memory per node (hardware.host_memory_gib)" if binding == "host"
           else "use more ranks or a larger device"),
        shortfall_bytes=shortfall_bytes, binding=binding)


class Placer(Protocol):
    """A placement stage: the tables of `spec` (virtual rows) on `world_size` ranks of `capacity_bytes`."""

    def __call__(self, spec: WorkloadSpec, world_size: int, capacity_bytes: int) -> Placement:
        ...


@dataclass(frozen=True)
class PooledGroup:
    """One sharding type's pooled embeddings: torchrec looks each group up and sends it on its own (in the
    order of the group's first table), then concatenates what the groups return."""
    dims: int  # embedding dims of the group's tables: what every rank gets back per sample
    sent_dims: int = 0  # of those, the dims this rank looks up for every rank's batch
    all_to_all: bool = True  # False: data-parallel, looked up locally for the local batch, nothing sent


@dataclass
class RankShare:
    """What one rank holds of the embedding tables, and the sizes that drive its sparse activations."""
    weight_bytes: int = 0  # in device memory (HBM on a GPU): fused shards and data-parallel tables
    optimizer_bytes: int = 0
    grad_bytes: int = 0  # data-parallel tables: dense gradients of full tables
    # UVM shards (workloads/uvm_cache.py): the HBM cache of fused_uvm_caching shards and its bookkeeping, and
    # the weights and optimizer state they keep in managed host memory (not in device memory)
    cache_bytes: int = 0
    cache_state_bytes: int = 0
    host_bytes: int = 0
    sent_dims: int = 0  # sum of embedding dims of the (column) shards this rank looks up
    sent_pooling: float = 0.0  # sum of mean pooling factors of the tables it looks up
    sent_features: int = 0  # (column) shards it looks up: one lengths entry per sample each in its received KJT
    replicated_dims: int = 0  # sum of embedding dims of the data-parallel tables (looked up for the local batch)
    # their mean pooling factors and count: their ids stay on the rank (no input all-to-all)
    replicated_pooling: float = 0.0
    replicated_features: int = 0
    # (rows, dim) of each data-parallel table: the dense optimizer steps them, with a full-table temporary
    replicated_tables: List[tuple] = field(default_factory=list)
    # per sharding type, in torchrec's order; empty: one all-to-all of the sharded tables, then the
    # data-parallel ones (a share not read from a torchrec plan)
    pooled_groups: List[PooledGroup] = field(default_factory=list)
    # the job's (every rank's alike): whether torchrec reorders the input features by destination before the
    # input all-to-all, into a copy of the batch's ids and lengths (False: it sends the batch's own tensors)
    input_permuted: bool = True


@dataclass
class RankPrediction:
    rank: int
    total_bytes: int
    breakdown: Dict[str, int]
    features: Dict[str, float] = field(default_factory=dict)
    host_bytes: int = 0  # UVM tables' weights and optimizer state in host memory (outside `total_bytes`)


def describe(placement: Placement, capacity_bytes: Optional[int] = None) -> List[dict]:
    """One row per rank: shards, tables, weight / optimizer / total GiB, and (with `capacity_bytes`)
    the fraction of the device it fills."""
    shards_per_rank = Counter(s.rank for s in placement.shards)
    tables_per_rank: Dict[int, set] = {}
    for s in placement.shards:
        tables_per_rank.setdefault(s.rank, set()).add(s.table)
    rows = []
    for rank, (w, o) in enumerate(zip(placement.per_rank_weight_bytes, placement.per_rank_optimizer_bytes)):
        row = {
            "rank": rank,
            "shards": shards_per_rank.get(rank, 0),
            "tables": len(tables_per_rank.get(rank, ())),
            "weight_gib": w / GIB,
            "optimizer_gib": o / GIB,
            "total_gib": (w + o) / GIB,
        }
        if placement.per_rank_other_bytes:
            row["other_gib"] = placement.per_rank_other_bytes[rank] / GIB
        if capacity_bytes:
            row["utilization"] = (w + o) / capacity_bytes
        rows.append(row)
    return rows
