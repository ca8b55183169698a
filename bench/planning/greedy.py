"""membench's own placement of a workload's tables (virtual rows) onto N ranks, without any GPU.

`place_greedy(spec, world_size, capacity_bytes)` counts weights + optimizer state (workloads.storage):

1. Capacity split: a table larger than ``max_shard_fraction * capacity_bytes`` (the shard budget) is
   split row-wise into k contiguous, equal-ish shards, k the smallest integer that makes each shard fit
   the budget -- only with ``allow_row_wise`` (CUDA). Without it (CPU) tables stay whole, and a table
   that does not fit one rank at all raises `PlacementError` naming it.
2. LPT greedy: shards sorted by bytes descending (ties: table order, then row offset), each onto the
   currently least-loaded rank (a heap): O(S log N).
3. Balance (only with ``allow_row_wise``): each rank is filled up to a target, ``min(capacity, (1 +
   balance_tolerance) * mean)`` (``capacity`` when ``balance_tolerance`` is None). A shard that would
   take the least-loaded rank past the target is split once more, row-wise: the rows that fit stay there
   and the rest goes on to the next least-loaded rank. A split fills its rank to the target, so there
   are at most about N such splits, and the fullest rank ends within the tolerance of the mean (up to
   one row) -- the wrap-around idea of McNaughton's rule for preemptive scheduling, applied inside LPT.
   Total O((S + N) log N). The default tolerance 0 fills every rank to the mean, which no placement can
   beat (max >= mean); a tolerance > 0 keeps more tables whole at the price of that much imbalance, and
   each such split leaves at least ``balance_tolerance * mean`` bytes on its rank (the least-loaded rank
   is at or below the mean); with 0 the last pieces of a rank can be a few rows.

Plain LPT (the first two steps only) leaves ranks up to one shard above the mean: with 1000 equal tables
on 1024 ranks the fullest rank holds a whole table while the mean is 0.977 of one (2.4% imbalance), and
100 tables on 64 ranks give 28% (two tables vs 1.56). A 10 TB / 1000-table workload on 1024 ranks
places in milliseconds.

Every table is placed under one fbgemm compute kernel (workloads/uvm_cache.py): ``fused`` balances weights +
optimizer state in HBM; ``fused_uvm_caching`` balances the HBM caches and their bookkeeping (the tables
themselves go to host memory, which plan mode checks per node); ``fused_uvm`` keeps nothing in HBM and is
placed against the host memory per rank that the caller passes as ``capacity_bytes``.

Raises `PlacementError` with ``shortfall_bytes`` when the total exceeds ``world_size * capacity_bytes``
(shortfall = total - world_size * capacity) or when, after placement, a rank exceeds its capacity (only
possible without row-wise; shortfall = the sum of the overflows).
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass
from typing import List, Optional, Tuple

from bench.planning.types import Placement, PlacementError, Shard, capacity_error
from workloads.spec import TableSpec, WorkloadSpec
from workloads.storage import table_storage
from workloads.units import GIB
from workloads.uvm_cache import (FUSED, FUSED_UVM, FUSED_UVM_CACHING, cached_row_hbm_bytes, effective_caching_ratio,
                                 shard_tiers)

# (bytes, table index, row offset, rows): one entry per shard to place
Item = Tuple[int, int, int, int]


def _split_rows(rows: int, k: int) -> List[Tuple[int, int]]:
    """k contiguous (offset, rows) blocks covering `rows`, sizes differing by at most one row."""
    base, extra = divmod(rows, k)
    blocks, offset = [], 0
    for i in range(k):
        n = base + (1 if i < extra else 0)
        blocks.append((offset, n))
        offset += n
    return blocks


def _bytes_per_row(table: TableSpec, embedding_optimizer: str, kernel: str, caching_ratio: float) -> int:
    """The bytes one row costs in the memory the placement fills (every storage formula is linear in rows):
    weights + optimizer state, in HBM or (`fused_uvm`) in host memory; a cached row's share of its HBM cache
    and bookkeeping, rounded up (fbgemm's whole cache sets are added per shard afterwards)."""
    if kernel == FUSED_UVM_CACHING:
        return math.ceil(cached_row_hbm_bytes(table.embedding_dim, table.bytes_per_element, caching_ratio))
    return sum(table_storage(table, embedding_optimizer, rows=1))


def _check_arguments(world_size: int, capacity_bytes: int, max_shard_fraction: float,
                     balance_tolerance: Optional[float]) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
    if not 0 < max_shard_fraction <= 1:
        raise ValueError(f"max_shard_fraction must be in (0, 1], got {max_shard_fraction}")
    if balance_tolerance is not None and balance_tolerance < 0:
        raise ValueError(f"balance_tolerance must be >= 0 or None, got {balance_tolerance}")


def _capacity_split(tables: List[TableSpec], per_row: List[int], budget: float, capacity_bytes: int,
                    allow_row_wise: bool) -> List[Item]:
    """Step 1: one item per shard, tables above the shard budget split row-wise (when allowed)."""
    items: List[Item] = []
    for i, table in enumerate(tables):
        size = table.virtual_rows * per_row[i]
        if size <= budget:
            items.append((size, i, 0, table.virtual_rows))
        elif not allow_row_wise:
            if size > capacity_bytes:
                raise PlacementError(
                    f"table {table.name} ({size / GIB:.2f} GiB with optimizer state) does not fit one rank of "
                    f"{capacity_bytes / GIB:.2f} GiB and row-wise sharding is not available on this "
                    "device; use a larger device, a smaller table or a CUDA device (row-wise)",
                    shortfall_bytes=size - capacity_bytes, table=table.name)
            items.append((size, i, 0, table.virtual_rows))
        else:
            k = min(table.virtual_rows, math.ceil(size / budget))
            items.extend((rows * per_row[i], i, offset, rows) for offset, rows in _split_rows(table.virtual_rows, k))
    items.sort(key=lambda it: (-it[0], it[1], it[2]))
    return items


def _fill_target(total: int, world_size: int, capacity_bytes: int, allow_row_wise: bool,
                 balance_tolerance: Optional[float]) -> Optional[int]:
    """Step 3's target load per rank (None: no balancing, shards stay whole)."""
    if not allow_row_wise:
        return None
    if balance_tolerance is None:
        return capacity_bytes
    mean = total / world_size
    return min(capacity_bytes, max(math.ceil((1 + balance_tolerance) * mean), 1))


def _assign(items: List[Item], per_row: List[int], world_size: int,
            target: Optional[int]) -> Tuple[List[Tuple[int, int, int, int]], int]:
    """Steps 2 and 3: (table index, row offset, rows, rank) per placed piece, and the balance splits."""
    heap = [(0, r) for r in range(world_size)]  # (load, rank): already a valid heap
    placed: List[Tuple[int, int, int, int]] = []
    balance_splits = 0
    for _, i, offset, rows in items:
        while True:
            load, rank = heap[0]
            room_rows = (target - load) // per_row[i] if target is not None else rows
            if room_rows < 1:
                # every rank is within a row of the target (rounding): one row over it, at most
                room_rows = 1
            if room_rows >= rows:
                heapq.heapreplace(heap, (load + rows * per_row[i], rank))
                placed.append((i, offset, rows, rank))
                break
            heapq.heapreplace(heap, (load + room_rows * per_row[i], rank))
            placed.append((i, offset, room_rows, rank))
            offset += room_rows
            rows -= room_rows
            balance_splits += 1
    return placed, balance_splits


@dataclass
class _RankTotals:
    weight: List[int]
    optimizer: List[int]
    hbm: List[int]
    host: List[int]


def _shards(tables: List[TableSpec], optimizer: str, placed, world_size: int, kernel: str,
            caching_ratio: float) -> Tuple[List[Shard], _RankTotals]:
    shards: List[Shard] = []
    totals = _RankTotals(*([0] * world_size for _ in range(4)))
    for i, offset, rows, rank in placed:
        table = tables[i]
        weight, state = table_storage(table, optimizer, rows)
        shards.append(Shard(table=table.name, sharding_type="table_wise" if rows == table.virtual_rows else "row_wise",
                            row_offset=offset, rows=rows, dim=table.embedding_dim, weight_bytes=weight,
                            optimizer_bytes=state, rank=rank, compute_kernel=kernel))
        tiers = shard_tiers(kernel, rows, table.embedding_dim, table.bytes_per_element, weight, state, caching_ratio)
        totals.weight[rank] += weight
        totals.optimizer[rank] += state
        totals.hbm[rank] += tiers.hbm_bytes
        totals.host[rank] += tiers.host_bytes
    return shards, totals


def _tier(kernel: str, caching_ratio: float) -> Tuple[Optional[str], str]:
    """(binding, what the bytes are) of the memory the placement fills, for its capacity check and errors: HBM,
    the HBM caches, or (`fused_uvm`, nothing in HBM) host memory."""
    if kernel == FUSED_UVM:
        return "host", " in host memory (fused_uvm)"
    if kernel == FUSED_UVM_CACHING:
        return "hbm", f" as HBM caches of {caching_ratio:g} x the rows (fused_uvm_caching)"
    return None, ""


def place_greedy(spec: WorkloadSpec, world_size: int, capacity_bytes: int, *, allow_row_wise: bool = True,
                 max_shard_fraction: float = 0.25, balance_tolerance: Optional[float] = 0.0,
                 compute_kernel: str = FUSED, caching_ratio: Optional[float] = None) -> Placement:
    """membench's placement of `spec`'s tables onto `world_size` ranks of `capacity_bytes` each (see the
    module's docstring for the three steps and the errors), every table under `compute_kernel`: `capacity_bytes`
    is HBM, or under `fused_uvm` the host memory per rank."""
    start = time.perf_counter()
    _check_arguments(world_size, capacity_bytes, max_shard_fraction, balance_tolerance)
    optimizer = spec.config.embedding_optimizer
    tables = spec.tables
    ratio = effective_caching_ratio(caching_ratio)
    per_row = [_bytes_per_row(t, optimizer, compute_kernel, ratio) for t in tables]
    total = sum(t.virtual_rows * b for t, b in zip(tables, per_row))
    binding, tier = _tier(compute_kernel, ratio)
    if total > world_size * capacity_bytes:
        raise capacity_error(total, world_size, capacity_bytes, total - world_size * capacity_bytes, detail=tier,
                             binding=binding)
    budget = max_shard_fraction * capacity_bytes
    items = _capacity_split(tables, per_row, budget, capacity_bytes, allow_row_wise)
    target = _fill_target(total, world_size, capacity_bytes, allow_row_wise, balance_tolerance)
    placed, balance_splits = _assign(items, per_row, world_size, target)
    shards, totals = _shards(tables, optimizer, placed, world_size, compute_kernel, ratio)
    per_rank = totals.host if binding == "host" else totals.hbm
    overflow = sum(max(0, b - capacity_bytes) for b in per_rank)
    if overflow:
        worst = max(range(world_size), key=per_rank.__getitem__)
        raise capacity_error(total, world_size, capacity_bytes, overflow, binding=binding,
                             detail=f"{tier}; after placement rank {worst} would hold {per_rank[worst] / GIB:.1f} GiB")
    return Placement(
        planner="membench", world_size=world_size, shards=shards, per_rank_weight_bytes=totals.weight,
        per_rank_optimizer_bytes=totals.optimizer, plan_time_s=time.perf_counter() - start,
        per_rank_hbm_bytes=totals.hbm, per_rank_ddr_bytes=totals.host,
        info={"capacity_split_shards": len(items), "balance_splits": balance_splits,
              "fill_target_bytes": target, "shard_budget_bytes": int(budget),
              "capacity_bytes": int(capacity_bytes), "allow_row_wise": allow_row_wise,
              "max_shard_fraction": max_shard_fraction, "balance_tolerance": balance_tolerance,
              "compute_kernel": compute_kernel,
              "caching_ratio": ratio if compute_kernel == FUSED_UVM_CACHING else None})
