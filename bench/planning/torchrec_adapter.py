"""The one place membench touches torchrec's planner and private state (and silences torchrec's noise).

What the planner chose is captured through its public `Stats.log(...)` hook (`PlanCapture`: the best
plan's sharding options with their estimated storage, the storage reservation, the number of
proposals), not read from private planner attributes. Two reads of private state remain, each behind
one function here: the storage reservation's dense / KJT estimates (`_reserved_dense_and_kjt`, torchrec's
own per-rank estimate needs them and exposes no public accessor) and the numbers inside an
INSUFFICIENT_STORAGE message (`_planner_error_storage`: torchrec's `PlannerError` carries its type but
not the bytes). Planner failures come back as a typed `PlacementError`. The sharded model at run time has
its own adapter (bench/run/torchrec_modules.py); membench's memory model as the planner's estimator and
storage reservation is bench/planning/torchrec_memory_model.py; what the planner plans a rank with (its
capacity per tier, its memory model) is bench/planning/planner_memory.py.

torchrec is imported inside the functions, so importing this module never loads torchrec (the native
backend must run without it). No GPU or process group is needed to plan, even for
``compute_device="cuda"``.
"""
from __future__ import annotations

import contextlib
import logging
import math
import re
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from bench.planning.planner_memory import memory_model_for, memory_model_name, planner_memory
from bench.planning.types import DATA_PARALLEL, Placement, PlacementError, Shard, capacity_error
from workloads.spec import WorkloadSpec
from workloads.storage import table_storage
from workloads.units import GIB

QUIET_LOGGERS = ("torchrec", "torch.fx._symbolic_trace")
# torchrec.distributed.logger makes loggers named "<destination>-<handler class>" outside the torchrec
# namespace; MethodLogger records every planner call (inputs and outputs) at INFO
TORCHREC_LOGGER_DESTINATIONS = ("MethodLogger", "UnfilteredLogger", "SingleRankStaticLogger",
                                "AllRankStaticLogger", "CappedLogger", "Cap1Logger", "Cap01Logger")
NOISE_PREFIXES = ("Sharding spec not found", "Successfully loaded")
# torchrec loggers whose warnings are expected when planning without hardware: "Topology constructed
# directly" and HeuristicalStorageReservation's dry-run dense-size caveat
PLANNER_LOGGERS = ("torchrec.distributed.planner.types", "torchrec.distributed.planner.storage_reservations")


# -- library noise ---------------------------------------------------------------------------------
def quiet_libraries() -> None:
    """Known, harmless library chatter that would otherwise repeat in every log (once per rank)."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torchrec")
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for name in list(logging.root.manager.loggerDict):  # those torchrec created already (at its import)
        if name.split("-")[0] in TORCHREC_LOGGER_DESTINATIONS:
            logging.getLogger(name).setLevel(logging.ERROR)
    # Messages logged through the root logger itself (torchrec: once per data-parallel table) or that
    # reach its handlers from module loggers (fbgemm: one line per library it loads at import).
    root = logging.getLogger()
    root.addFilter(_drop_noise)
    for handler in root.handlers:
        handler.addFilter(_drop_noise)


def _drop_noise(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(NOISE_PREFIXES)


@contextlib.contextmanager
def quiet_planner():
    loggers = [logging.getLogger(name) for name in PLANNER_LOGGERS]
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


# -- planner inputs ----------------------------------------------------------------------------------
def parameter_constraints(spec: WorkloadSpec, sharding_type: str, per_table: Dict[str, str], compute_kernel: str,
                          column_shard_dim: Optional[int] = None,
                          caching_ratio: Optional[float] = None) -> Dict[str, "ParameterConstraints"]:
    """Per table: the sharding types and kernels allowed, its pooling, and (sharding.caching_ratio) the cache
    load factor of a UVM-cached table (None: torchrec's default)."""
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    constraints = {}
    for table in spec.tables:
        chosen = per_table.get(table.name, sharding_type)
        kernels = None
        if compute_kernel != "auto":
            kernels = [compute_kernel]
        elif chosen == DATA_PARALLEL:
            kernels = ["dense"]  # fused kernels cannot be replicated
        constraints[table.name] = ParameterConstraints(
            sharding_types=None if chosen == "auto" else [chosen],
            compute_kernels=kernels,
            pooling_factors=[table.expected_pooling],
            min_partition=column_shard_dim,
            cache_params=None if caching_ratio is None else CacheParams(load_factor=float(caching_ratio)),
        )
    return constraints


def make_topology(world_size: int, compute_device: str, hbm_cap_bytes: Optional[int],
                  ddr_cap_bytes: int, local_world_size: int):
    from torchrec.distributed.planner.types import Topology

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Topology constructed directly" is expected here
        return Topology(world_size=world_size, compute_device=compute_device, hbm_cap=hbm_cap_bytes,
                        ddr_cap=ddr_cap_bytes, local_world_size=local_world_size)


@dataclass
class PlanCapture:
    """What torchrec's planner hands its `Stats` hooks once it has chosen a plan."""
    best_plan: list = field(default_factory=list)  # the chosen ShardingOptions, storage per shard
    storage_reservation: object = None
    num_proposals: Optional[int] = None

    def as_stats(self):
        """A torchrec `Stats` that records into this capture (instead of printing its table)."""
        from torchrec.distributed.planner.types import Stats

        capture = self

        class CaptureStats(Stats):
            def log(self, sharding_plan, topology, batch_size, storage_reservation, num_proposals, num_plans,
                    run_time, best_plan, *args, **kwargs) -> None:
                capture.best_plan = list(best_plan)
                capture.storage_reservation = storage_reservation
                capture.num_proposals = num_proposals

        return CaptureStats()

    def shards(self) -> List[Tuple[str, str, str, int, List[int], List[int], int, int, int]]:
        """The chosen plan's shards as (table, sharding_type, compute_kernel, element_size, size [rows,
        cols], offset [row, col], rank, hbm_bytes, ddr_bytes): more than the public `ShardingPlan` says
        (it has no storage estimates)."""
        out = []
        for option in self.best_plan:
            element_size = option.tensor.element_size()
            for shard in option.shards:
                storage = shard.storage
                out.append((option.name, option.sharding_type, option.compute_kernel, element_size,
                            list(shard.size), list(shard.offset), int(shard.rank),
                            int(storage.hbm) if storage else 0, int(storage.ddr) if storage else 0))
        return out


def make_planner(spec: WorkloadSpec, topology, sharding_type: str, per_table: Dict[str, str], compute_kernel: str,
                 timeout_seconds: Optional[int] = None, column_shard_dim: Optional[int] = None, memory=None,
                 caching_ratio: Optional[float] = None):
    """(planner, capture): torchrec's planner, its chosen plan recorded in `capture`; with its default memory
    model, or with `memory` (a `torchrec_memory_model.MembenchMemoryModel`) as its storage estimator and
    storage reservation."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    capture = PlanCapture()
    constraints = parameter_constraints(spec, sharding_type, per_table, compute_kernel, column_shard_dim, caching_ratio)
    memory_kwargs = {} if memory is None else memory.planner_kwargs(topology, spec.config.batch_size, constraints)
    planner = EmbeddingShardingPlanner(
        topology=topology,
        batch_size=spec.config.batch_size,
        constraints=constraints,
        stats=[capture.as_stats()],  # and not torchrec's own stats table: noise in per-rank logs
        debug=False,
        timeout_seconds=timeout_seconds,
        **memory_kwargs,
    )
    return planner, capture


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
    """torchrec's plan for `model` (tables on meta) on this topology: (ShardingPlan, PlanCapture).

    With a process group, rank 0 plans and broadcasts (what the workers do); without one the plan is
    computed locally, which is how the launcher predicts memory before starting any rank. The planner
    is deterministic, so both give the same plan. plan.memory_model picks its memory model.
    """
    from torchrec.distributed.sharding_plan import get_default_sharders

    compute_device, hbm_cap, ddr_cap = planner_memory(cfg, device_type, capacity_bytes, ranks_per_node)
    topology = make_topology(world_size=world_size, compute_device=compute_device, hbm_cap_bytes=hbm_cap,
                             ddr_cap_bytes=ddr_cap, local_world_size=ranks_per_node)
    planner, capture = make_planner(spec, topology, cfg.sharding.type, dict(cfg.sharding.per_table),
                                    cfg.sharding.compute_kernel, column_shard_dim=cfg.sharding.column_shard_dim,
                                    memory=memory_model_for(cfg, spec, device_type),
                                    caching_ratio=cfg.sharding.caching_ratio)
    sharders = get_default_sharders()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if process_group is not None:
            plan = planner.collective_plan(model, sharders, process_group)
        else:
            plan = planner.plan(model, sharders)
    return plan, capture


def _reserved_dense_and_kjt(reservation) -> Tuple[int, int]:
    """Bytes (hbm + ddr) that torchrec's heuristic storage reservation set aside per rank for dense tensors
    and for KJTs. PRIVATE torchrec state (`_dense_storage`, `_kjt_storage`): this is the only reader."""
    def total(name: str) -> int:
        storage = getattr(reservation, name, None)
        return 0 if storage is None else int(storage.hbm) + int(storage.ddr)

    return total("_dense_storage"), total("_kjt_storage")


def torchrec_estimate_parts(capture: PlanCapture, world_size: int) -> Dict[str, List[int]]:
    """torchrec's planner's own per-rank memory estimate for its chosen plan, in its parts: `shards` (the storage
    of every shard it placed: weights, optimizer state and its input/output buffer estimates) and what its
    storage reservation set aside on every rank: HeuristicalStorageReservation's `dense` tensors (about 6x the
    dense parameters) and `kjt` inputs (about 20x a batch's KJT), or membench's `reserved` (a rank without
    shards, plan.memory_model=membench)."""
    shards = [0] * world_size
    for *_, rank, hbm_bytes, ddr_bytes in capture.shards():
        shards[rank] += hbm_bytes + ddr_bytes
    reserved = getattr(capture.storage_reservation, "reserved_bytes", None)
    if reserved is not None:
        return {"shards": shards, "reserved": [int(reserved)] * world_size}
    dense, kjt = _reserved_dense_and_kjt(capture.storage_reservation)
    return {"shards": shards, "dense": [dense] * world_size, "kjt": [kjt] * world_size}


# -- torchrec's default planner as a membench placement ---------------------------------------------
def torchrec_optimizer_multiplier(embedding_optimizer: str, dim: int) -> float:
    """torchrec's ``_get_optimizer_multipler`` for our optimizer names (state relative to weight bytes):
    optimizer state in the WEIGHTS' dtype, and for a column-wise shard row-wise state spread over the
    columns; fbgemm allocates fp32 state per shard (workloads.storage). The two agree for fp32 weights."""
    return {"sgd": 0.0, "adam": 2.0, "rowwise_adagrad": 1.0 / dim}.get(embedding_optimizer, 1.0)


_STORAGE_RE = re.compile(r"Storage\(hbm = ([\d.]+) GB, ddr = ([\d.]+) GB\)")


def _planner_error_storage(message: str) -> Optional[Tuple[int, int, int, str]]:
    """(shortfall, required, available bytes, the tier short: "hbm" or "host" for DDR alone) from torchrec's
    INSUFFICIENT_STORAGE message: its "Global
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
    tier = "host" if short == [2] else "hbm"
    return int(round((need - have) * GIB)), int(round(need * GIB)), int(round(have * GIB)), tier


def _placement_error(error, spec: WorkloadSpec, world_size: int, capacity_bytes: int) -> PlacementError:
    """torchrec's PlannerError as membench's typed error, with the shortfall for INSUFFICIENT_STORAGE."""
    from torchrec.distributed.planner.types import PlannerErrorType

    message = str(error)
    if getattr(error, "error_type", None) == PlannerErrorType.INSUFFICIENT_STORAGE:
        total = sum(sum(table_storage(t, spec.config.embedding_optimizer)) for t in spec.tables)
        parsed = _planner_error_storage(message)
        if parsed is None:
            return capacity_error(total, world_size, capacity_bytes, max(0, total - world_size * capacity_bytes),
                                  detail="; torchrec's planner: insufficient storage")
        shortfall, need, have, tier = parsed
        where = " of host memory (torchrec's DDR: UVM tables)" if tier == "host" else ""
        return capacity_error(total, world_size, capacity_bytes, shortfall, need_bytes=need, have_bytes=have,
                              detail=f"{where} after torchrec's storage reservation, by its estimate", binding=tier)
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    return PlacementError(f"torchrec's planner found no plan for {world_size} ranks: {first}")


def _placement_from_capture(spec: WorkloadSpec, capture: PlanCapture, world_size: int, plan_time_s: float,
                            info: dict) -> Placement:
    optimizer = spec.config.embedding_optimizer
    dims = {t.name: t.embedding_dim for t in spec.tables}
    shards: List[Shard] = []
    weight, state, hbm, ddr = ([0] * world_size for _ in range(4))
    for table, sharding_type, kernel, element_size, size, offset, rank, hbm_bytes, ddr_bytes in capture.shards():
        rows, cols = size
        shard_weight = rows * cols * element_size
        shard_state = math.ceil(shard_weight * torchrec_optimizer_multiplier(optimizer, dims.get(table, cols)))
        shards.append(Shard(table=table, sharding_type=sharding_type, row_offset=offset[0], rows=rows,
                            dim=cols, weight_bytes=shard_weight, optimizer_bytes=shard_state, rank=rank,
                            col_offset=offset[1], compute_kernel=kernel))
        weight[rank] += shard_weight
        state[rank] += shard_state
        hbm[rank] += hbm_bytes
        ddr[rank] += ddr_bytes
    other = [h + d - w - o for h, d, w, o in zip(hbm, ddr, weight, state)]
    return Placement(planner="torchrec", world_size=world_size, shards=shards, per_rank_weight_bytes=weight,
                     per_rank_optimizer_bytes=state, plan_time_s=plan_time_s, per_rank_other_bytes=other,
                     per_rank_hbm_bytes=hbm, per_rank_ddr_bytes=ddr,
                     info={**info, "num_proposals": capture.num_proposals})


def place_torchrec(spec: WorkloadSpec, world_size: int, capacity_bytes: int, *, local_world_size: int = 8,
                   ddr_cap_bytes: int = 2 * 1024**4, compute_device: str = "cuda",
                   timeout_seconds: Optional[int] = None, memory=None, compute_kernel: str = "auto",
                   caching_ratio: Optional[float] = None) -> Placement:
    """torchrec's default ``EmbeddingShardingPlanner`` for `spec` on `world_size` ranks, as a `Placement`.

    The model is ``workloads.model.build_model(spec, meta)`` (embedding optimizer attached in backward, so
    the estimator counts its state), the topology `make_topology` (HBM `capacity_bytes` and DDR
    `ddr_cap_bytes` per rank, `local_world_size` ranks per node), the sharders ``get_default_sharders()``,
    and the constraints `parameter_constraints` with the sharding types on auto (torchrec's defaults, with the
    workload's pooling factors), the kernel `compute_kernel` and the cache load factor `caching_ratio`. Without
    `memory`, torchrec keeps its default storage reservation (15% of HBM plus dense/KJT estimates), so it plans
    against less than `capacity_bytes` per rank; with `memory` (a `torchrec_memory_model.MembenchMemoryModel`)
    it plans with membench's model instead. It optimizes its perf
    model, not memory, and takes minutes at terabyte scale. ``timeout_seconds`` bounds its proposal loop
    only and makes the plan depend on wall-clock time.

    Per shard: weight_bytes = rows * cols * element size; optimizer_bytes = ceil(weight_bytes * torchrec's
    optimizer multiplier); the rest of its estimator's ``storage.hbm + storage.ddr`` (lookup buffers, the
    HBM cache of UVM-cached tables) goes to ``per_rank_other_bytes``. ``plan_time_s`` is planner
    construction + ``plan()``; building the meta model is ``info["model_build_s"]``. Raises
    `PlacementError` when torchrec finds no plan.
    """
    import torch
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.distributed.sharding_plan import get_default_sharders

    from workloads.model import build_model

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(spec, torch.device("meta"))
    model_build_s = time.perf_counter() - t0
    start = time.perf_counter()
    with quiet_planner():
        topology = make_topology(world_size, compute_device, hbm_cap_bytes=capacity_bytes,
                                 ddr_cap_bytes=ddr_cap_bytes, local_world_size=local_world_size)
        planner, capture = make_planner(spec, topology, "auto", {}, compute_kernel, timeout_seconds=timeout_seconds,
                                        memory=memory, caching_ratio=caching_ratio)
        try:
            planner.plan(model, get_default_sharders())
        except PlannerError as error:
            raise _placement_error(error, spec, world_size, capacity_bytes) from error
    info = {"model_build_s": model_build_s, "timeout_seconds": timeout_seconds,
            "memory_model": memory_model_name(memory),
            # membench's model: the planner's reservation per rank (its figure: this + the rank's shards)
            "reserved_bytes": getattr(capture.storage_reservation, "reserved_bytes", None),
            "capacity_bytes": int(capacity_bytes), "local_world_size": local_world_size,
            "ddr_cap_bytes": int(ddr_cap_bytes), "compute_device": compute_device}
    return _placement_from_capture(spec, capture, world_size, time.perf_counter() - start, info)
