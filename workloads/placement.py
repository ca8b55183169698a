"""Placement of a workload's embedding tables onto N ranks, without any GPU or process group.

Two planners produce the same `Placement` record, so they can be compared like for like:

* `place_greedy` -- membench's own placement: capacity-driven row-wise splitting, then
  longest-processing-time (LPT) greedy onto the least-loaded rank, splitting a shard once more where
  it would take a rank past a balance target. O((S + N) log N); a 10 TB / 1000-table workload on
  1024 ranks takes milliseconds.
* `place_torchrec` -- torchrec's default `EmbeddingShardingPlanner` on the meta-device model. It
  optimizes its perf model, not memory, and takes minutes at terabyte scale (see
  /work/shared/NOTES.md, "torchrec planner at terabyte scale").

Sizes are in bytes; plan mode sizes every table by its VIRTUAL rows (plan_only workloads materialize
nothing). "GiB" is 1024**3 bytes, "TB" 10**12 bytes.
"""
from __future__ import annotations

import contextlib
import heapq
import logging
import math
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from workloads.spec import TableSpec, WorkloadSpec

GIB = 1024**3
TB = 10**12
# fbgemm keeps optimizer state in fp32 whatever the weights' dtype (optimizer_state_dtypes is unset)
OPTIMIZER_STATE_BYTES = 4
OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")


# --------------------------------------------------------------------------------------------------
# Records


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

    def __init__(self, message: str, shortfall_bytes: int = 0, table: Optional[str] = None):
        super().__init__(message)
        self.shortfall_bytes = int(shortfall_bytes)
        self.table = table


def _size(num_bytes: int) -> str:
    return f"{num_bytes / TB:.2f} TB" if num_bytes >= TB // 100 else f"{num_bytes / GIB:.2f} GiB"


def _capacity_error(total_bytes: int, world_size: int, capacity_bytes: int, shortfall_bytes: int,
                    detail: str = "", need_bytes: Optional[int] = None,
                    have_bytes: Optional[int] = None) -> PlacementError:
    need = total_bytes if need_bytes is None else need_bytes
    have = world_size * capacity_bytes if have_bytes is None else have_bytes
    return PlacementError(
        f"cannot place {_size(total_bytes)} of tables on {world_size} ranks x "
        f"{capacity_bytes / GIB:.2f} GiB: short by {shortfall_bytes / GIB:.1f} GiB "
        f"(need {need / GIB:.1f} GiB, have {have / GIB:.1f} GiB{detail}); "
        "use more ranks or a larger device",
        shortfall_bytes=shortfall_bytes)


# --------------------------------------------------------------------------------------------------
# Storage formulas


def table_storage(table: TableSpec, embedding_optimizer: str, rows: Optional[int] = None) -> Tuple[int, int]:
    """(weight_bytes, optimizer_bytes) of `rows` rows of `table` (default: all its VIRTUAL rows, what
    plan mode places), as fbgemm's fused (TBE) kernels allocate them:

    * weights:          rows * dim * bytes_per_element (4 fp32, 2 fp16)
    * sgd:              0                      (EXACT_SGD keeps no state)
    * rowwise_adagrad:  rows * 4               (EXACT_ROWWISE_ADAGRAD: one fp32 `momentum1` per row)
    * adam:             2 * rows * dim * 4     (ADAM: fp32 `momentum1` and `momentum2` per element)

    Comparison with torchrec's planner estimate (``shard_estimators.calculate_shard_storages``):
    torchrec charges ``ceil(weight_bytes * multiplier)`` for the optimizer, with multiplier 0 for SGD,
    2 for Adam and 1/dim for RowWiseAdagrad (``_get_optimizer_multipler``) -- i.e. optimizer state in
    the WEIGHTS' dtype. For fp32 weights this is identical to the formulas above. For fp16 weights
    torchrec counts half of what fbgemm allocates (fbgemm keeps momentum in fp32 unless
    ``optimizer_state_dtypes`` says otherwise, which torchrec does not set): rowwise_adagrad rows*2 vs
    rows*4, adam 2*rows*dim*2 vs 2*rows*dim*4. For a column-wise shard torchrec spreads the row-wise
    state over the columns (rows*4*cols/dim); fbgemm allocates rows*4 per shard. torchrec also counts
    the state only when the optimizer is attached with ``apply_optimizer_in_backward`` (as
    ``workloads.model.build_model`` does), and adds per-shard input/output buffer estimates on top
    (not embedding storage; see `Placement.per_rank_other_bytes`).
    """
    if embedding_optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {embedding_optimizer!r}; expected one of {OPTIMIZERS}")
    rows = table.virtual_rows if rows is None else int(rows)
    dim = table.embedding_dim
    weight = rows * dim * table.bytes_per_element
    if embedding_optimizer == "sgd":
        optimizer = 0
    elif embedding_optimizer == "rowwise_adagrad":
        optimizer = rows * OPTIMIZER_STATE_BYTES
    else:  # adam
        optimizer = 2 * rows * dim * OPTIMIZER_STATE_BYTES
    return weight, optimizer


def _torchrec_optimizer_multiplier(embedding_optimizer: str, dim: int) -> float:
    """torchrec's ``_get_optimizer_multipler`` for our optimizer names (state relative to weight bytes)."""
    return {"sgd": 0.0, "adam": 2.0, "rowwise_adagrad": 1.0 / dim}.get(embedding_optimizer, 1.0)


# --------------------------------------------------------------------------------------------------
# membench's greedy placement


def _split_rows(rows: int, k: int) -> List[Tuple[int, int]]:
    """k contiguous (offset, rows) blocks covering `rows`, sizes differing by at most one row."""
    base, extra = divmod(rows, k)
    blocks, offset = [], 0
    for i in range(k):
        n = base + (1 if i < extra else 0)
        blocks.append((offset, n))
        offset += n
    return blocks


def _bytes_per_row(table: TableSpec, embedding_optimizer: str) -> int:
    """Weights + optimizer bytes of one row: every `table_storage` formula is linear in rows."""
    return sum(table_storage(table, embedding_optimizer, rows=1))


def place_greedy(spec: WorkloadSpec, world_size: int, capacity_bytes: int, *, allow_row_wise: bool = True,
                 max_shard_fraction: float = 0.25, balance_tolerance: Optional[float] = 0.0) -> Placement:
    """membench's placement of `spec`'s tables (virtual rows) onto `world_size` ranks of
    `capacity_bytes` each, counting weights + optimizer state (`table_storage`).

    1. Capacity split: a table larger than ``max_shard_fraction * capacity_bytes`` (the shard budget)
       is split row-wise into k contiguous, equal-ish shards, k the smallest integer that makes each
       shard fit the budget -- only with ``allow_row_wise`` (CUDA). Without it (CPU) tables stay
       whole, and a table that does not fit one rank at all raises `PlacementError` naming it.
    2. LPT greedy: shards sorted by bytes descending (ties: table order, then row offset), each onto
       the currently least-loaded rank (a heap): O(S log N).
    3. Balance (only with ``allow_row_wise``): each rank is filled up to a target, ``min(capacity,
       (1 + balance_tolerance) * mean)`` (``capacity`` when ``balance_tolerance`` is None). A shard
       that would take the least-loaded rank past the target is split once more, row-wise: the rows
       that fit stay there and the rest goes on to the next least-loaded rank. A split fills its rank
       to the target, so there are at most about N such splits, and the fullest rank ends within the
       tolerance of the mean (up to one row) -- the wrap-around idea of McNaughton's rule for
       preemptive scheduling, applied inside LPT. Total O((S + N) log N). The default tolerance 0
       fills every rank to the mean, which no placement can beat (max >= mean); a tolerance > 0 keeps
       more tables whole at the price of that much imbalance, and each such split leaves at least
       ``balance_tolerance * mean`` bytes on its rank (the least-loaded rank is at or below the mean);
       with 0 the last pieces of a rank can be a few rows.

    Plain LPT (the first two steps only) leaves ranks up to one shard above the mean: with 1000 equal
    tables on 1024 ranks the fullest rank holds a whole table while the mean is 0.977 of one (2.4%
    imbalance), and 100 tables on 64 ranks give 28% (two tables vs 1.56).

    Raises `PlacementError` with ``shortfall_bytes`` when the total exceeds ``world_size *
    capacity_bytes`` (shortfall = total - world_size * capacity) or when, after placement, a rank
    exceeds its capacity (only possible without row-wise; shortfall = the sum of the overflows).
    """
    start = time.perf_counter()
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if capacity_bytes <= 0:
        raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
    if not 0 < max_shard_fraction <= 1:
        raise ValueError(f"max_shard_fraction must be in (0, 1], got {max_shard_fraction}")
    if balance_tolerance is not None and balance_tolerance < 0:
        raise ValueError(f"balance_tolerance must be >= 0 or None, got {balance_tolerance}")
    optimizer = spec.config.embedding_optimizer
    tables = spec.tables
    per_row = [_bytes_per_row(t, optimizer) for t in tables]
    table_bytes = [t.virtual_rows * b for t, b in zip(tables, per_row)]
    total = sum(table_bytes)
    have = world_size * capacity_bytes
    if total > have:
        raise _capacity_error(total, world_size, capacity_bytes, total - have)

    budget = max_shard_fraction * capacity_bytes
    # step 1: (bytes, table index, row offset, rows), one entry per shard
    items: List[Tuple[int, int, int, int]] = []
    for i, (t, b) in enumerate(zip(tables, table_bytes)):
        if b <= budget:
            items.append((b, i, 0, t.virtual_rows))
        elif not allow_row_wise:
            if b > capacity_bytes:
                raise PlacementError(
                    f"table {t.name} ({b / GIB:.2f} GiB with optimizer state) does not fit one rank of "
                    f"{capacity_bytes / GIB:.2f} GiB and row-wise sharding is not available on this "
                    "device; use a larger device, a smaller table or a CUDA device (row-wise)",
                    shortfall_bytes=b - capacity_bytes, table=t.name)
            items.append((b, i, 0, t.virtual_rows))
        else:
            k = min(t.virtual_rows, math.ceil(b / budget))
            items.extend((rows * per_row[i], i, offset, rows) for offset, rows in _split_rows(t.virtual_rows, k))
    items.sort(key=lambda it: (-it[0], it[1], it[2]))

    # steps 2 and 3
    mean = total / world_size
    if not allow_row_wise:
        target = None
    elif balance_tolerance is None:
        target = capacity_bytes
    else:
        target = min(capacity_bytes, max(math.ceil((1 + balance_tolerance) * mean), 1))
    heap = [(0, r) for r in range(world_size)]  # (load, rank): already a valid heap
    placed: List[Tuple[int, int, int, int]] = []  # (table index, row offset, rows, rank)
    balance_splits = 0
    for size, i, offset, rows in items:
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

    shards: List[Shard] = []
    per_rank_w = [0] * world_size
    per_rank_o = [0] * world_size
    for i, offset, rows, rank in placed:
        t = tables[i]
        w, o = table_storage(t, optimizer, rows)
        shards.append(Shard(table=t.name, sharding_type="table_wise" if rows == t.virtual_rows else "row_wise",
                            row_offset=offset, rows=rows, dim=t.embedding_dim, weight_bytes=w,
                            optimizer_bytes=o, rank=rank))
        per_rank_w[rank] += w
        per_rank_o[rank] += o
    per_rank = [w + o for w, o in zip(per_rank_w, per_rank_o)]
    overflow = sum(max(0, b - capacity_bytes) for b in per_rank)
    if overflow:
        worst = max(range(world_size), key=per_rank.__getitem__)
        raise _capacity_error(
            total, world_size, capacity_bytes, overflow,
            detail=f"; after placement rank {worst} would hold {per_rank[worst] / GIB:.1f} GiB")
    return Placement(
        planner="membench", world_size=world_size, shards=shards, per_rank_weight_bytes=per_rank_w,
        per_rank_optimizer_bytes=per_rank_o, plan_time_s=time.perf_counter() - start,
        per_rank_hbm_bytes=per_rank, per_rank_ddr_bytes=[0] * world_size,
        info={"capacity_split_shards": len(items), "balance_splits": balance_splits,
              "fill_target_bytes": target, "shard_budget_bytes": int(budget),
              "capacity_bytes": int(capacity_bytes), "allow_row_wise": allow_row_wise,
              "max_shard_fraction": max_shard_fraction, "balance_tolerance": balance_tolerance})

# --------------------------------------------------------------------------------------------------
# torchrec's default planner


def _best_plan_shards(planner) -> List[Tuple[str, str, str, int, List[int], List[int], int, int, int]]:
    """The shards of the plan torchrec's planner chose, as (table, sharding_type, compute_kernel,
    element_size, size [rows, cols], offset [row, col], rank, hbm_bytes, ddr_bytes).

    PRIVATE torchrec API: reads ``EmbeddingShardingPlanner._best_plan`` (the chosen
    ``ShardingOption`` list with each shard's estimated ``Storage``), which the public
    ``ShardingPlan`` does not expose. This is the only function that touches it.
    """
    best_plan = getattr(planner, "_best_plan", None)
    if best_plan is None:
        raise RuntimeError("torchrec planner has no _best_plan (private API changed, or plan() not run)")
    out = []
    for option in best_plan:
        element_size = option.tensor.element_size()
        for shard in option.shards:
            storage = shard.storage
            out.append((option.name, option.sharding_type, option.compute_kernel, element_size,
                        list(shard.size), list(shard.offset), int(shard.rank),
                        int(storage.hbm) if storage else 0, int(storage.ddr) if storage else 0))
    return out


# torchrec loggers whose warnings are expected when planning without hardware: "Topology constructed
# directly" and HeuristicalStorageReservation's dry-run dense-size caveat
_NOISY_TORCHREC_LOGGERS = ("torchrec.distributed.planner.types", "torchrec.distributed.planner.storage_reservations")


@contextlib.contextmanager
def _quiet_torchrec():
    loggers = [logging.getLogger(name) for name in _NOISY_TORCHREC_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the same two as warnings.warn (FutureWarning, UserWarning)
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


_STORAGE_RE = re.compile(r"Storage\(hbm = ([\d.]+) GB, ddr = ([\d.]+) GB\)")


def _planner_error_storage(message: str) -> Optional[Tuple[int, int, int]]:
    """(shortfall, required, available) bytes from torchrec's INSUFFICIENT_STORAGE message: its "Global
    storage requirement for model parallel" vs "Global storage available for model parallel" (after
    its storage reservation), each ``Storage(hbm = X GB, ddr = Y GB)`` with GB meaning GiB, summed
    over the tiers that are short. None when the message does not have them."""
    available = re.search(r"available for model parallel: " + _STORAGE_RE.pattern, message)
    required = re.search(r"requirement for model parallel: " + _STORAGE_RE.pattern, message)
    if not (available and required):
        return None
    short = [i for i in (1, 2) if float(required.group(i)) > float(available.group(i))]
    need = sum(float(required.group(i)) for i in short)
    have = sum(float(available.group(i)) for i in short)
    return int(round((need - have) * GIB)), int(round(need * GIB)), int(round(have * GIB))


def place_torchrec(spec: WorkloadSpec, world_size: int, capacity_bytes: int, *, local_world_size: int = 8,
                   ddr_cap_bytes: int = 2 * 1024**4, compute_device: str = "cuda",
                   timeout_seconds: Optional[int] = None) -> Placement:
    """torchrec's default ``EmbeddingShardingPlanner`` for `spec` on `world_size` ranks.

    The model is ``workloads.model.build_model(spec, meta)`` (embedding optimizer attached in backward,
    so the estimator counts its state), the topology ``workloads.plan.make_topology`` (HBM
    `capacity_bytes` and DDR `ddr_cap_bytes` per rank, `local_world_size` ranks per node), the
    sharders ``get_default_sharders()``, and the constraints ``workloads.plan.parameter_constraints``
    with everything on auto (i.e. torchrec's defaults, but with the workload's pooling factors).
    torchrec keeps its default storage reservation (15% of HBM plus dense/KJT estimates), so it plans
    against less than `capacity_bytes` per rank. No GPU or process group is needed, even for
    ``compute_device="cuda"``. ``timeout_seconds`` bounds torchrec's proposal loop only and makes the
    plan depend on wall-clock time.

    Per-shard bytes, from the chosen sharding options (`_best_plan_shards`, private API):
    weight_bytes = shard rows * cols * element size; optimizer_bytes = ceil(weight_bytes *
    torchrec's optimizer multiplier) (what its estimator charges for the state; see `table_storage`);
    the rest of the estimator's ``storage.hbm + storage.ddr`` (lookup input/output buffers, the HBM
    cache of UVM-cached tables) goes to ``per_rank_other_bytes``. ``plan_time_s`` is planner
    construction + ``plan()``; building the meta model is ``info["model_build_s"]``.

    torchrec's ``PlannerError`` is re-raised as `PlacementError`: for INSUFFICIENT_STORAGE with the
    shortfall parsed from its message (its estimated requirement - what is available after its
    reservation, in the tiers that are short). Without a timeout such a case can search for a long time
    before it fails.
    """
    import torch
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.types import PlannerError, PlannerErrorType
    from torchrec.distributed.sharding_plan import get_default_sharders

    from workloads.model import build_model
    from workloads.plan import make_topology, parameter_constraints

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(spec, torch.device("meta"))
    model_build_s = time.perf_counter() - t0

    start = time.perf_counter()
    with _quiet_torchrec():
        topology = make_topology(world_size, compute_device, hbm_cap_bytes=capacity_bytes,
                                 ddr_cap_bytes=ddr_cap_bytes, local_world_size=local_world_size)
        planner = EmbeddingShardingPlanner(
            topology=topology, batch_size=spec.config.batch_size,
            constraints=parameter_constraints(spec, "auto", {}, "auto"),
            stats=[], debug=False, timeout_seconds=timeout_seconds)
        try:
            planner.plan(model, get_default_sharders())
        except PlannerError as error:
            message = str(error)
            total = sum(sum(table_storage(t, spec.config.embedding_optimizer)) for t in spec.tables)
            if getattr(error, "error_type", None) == PlannerErrorType.INSUFFICIENT_STORAGE:
                parsed = _planner_error_storage(message)
                if parsed is None:
                    raise _capacity_error(total, world_size, capacity_bytes,
                                          max(0, total - world_size * capacity_bytes),
                                          detail="; torchrec's planner: insufficient storage") from error
                shortfall, need, have = parsed
                raise _capacity_error(total, world_size, capacity_bytes, shortfall, need_bytes=need,
                                      have_bytes=have,
                                      detail=" after torchrec's storage reservation, by its estimate") from error
            first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
            raise PlacementError(f"torchrec's planner found no plan for {world_size} ranks: {first}") from error
    plan_time_s = time.perf_counter() - start

    optimizer = spec.config.embedding_optimizer
    dims = {t.name: t.embedding_dim for t in spec.tables}
    shards: List[Shard] = []
    per_rank_w = [0] * world_size
    per_rank_o = [0] * world_size
    per_rank_hbm = [0] * world_size
    per_rank_ddr = [0] * world_size
    for table, sharding_type, kernel, element_size, size, offset, rank, hbm, ddr in _best_plan_shards(planner):
        rows, cols = size
        weight = rows * cols * element_size
        opt = math.ceil(weight * _torchrec_optimizer_multiplier(optimizer, dims.get(table, cols)))
        shards.append(Shard(table=table, sharding_type=sharding_type, row_offset=offset[0], rows=rows,
                            dim=cols, weight_bytes=weight, optimizer_bytes=opt, rank=rank,
                            col_offset=offset[1], compute_kernel=kernel))
        per_rank_w[rank] += weight
        per_rank_o[rank] += opt
        per_rank_hbm[rank] += hbm
        per_rank_ddr[rank] += ddr
    per_rank_other = [h + d - w - o for h, d, w, o in zip(per_rank_hbm, per_rank_ddr, per_rank_w, per_rank_o)]
    return Placement(
        planner="torchrec", world_size=world_size, shards=shards, per_rank_weight_bytes=per_rank_w,
        per_rank_optimizer_bytes=per_rank_o, plan_time_s=plan_time_s, per_rank_other_bytes=per_rank_other,
        per_rank_hbm_bytes=per_rank_hbm, per_rank_ddr_bytes=per_rank_ddr,
        info={"model_build_s": model_build_s, "timeout_seconds": timeout_seconds,
              "capacity_bytes": int(capacity_bytes), "local_world_size": local_world_size,
              "ddr_cap_bytes": int(ddr_cap_bytes), "compute_device": compute_device,
              "num_proposals": getattr(planner, "_num_proposals", None)})


# --------------------------------------------------------------------------------------------------
# Reporting


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
