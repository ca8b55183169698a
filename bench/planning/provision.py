"""Plan mode and provisioning: place the tables for a target, predict every rank's peak, judge the fit,
and search the smallest world size that fits with headroom.

The stages are wired here: a placer (membench's greedy placement, or torchrec's planner through the
adapter, `plan.planner`), then the estimator with the hardware's calibration. Nothing here changes the
config it is given.
"""
from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass, field
from typing import List, Optional

from bench.accounting.allocator_config import allocator_settings_for
from bench.planning.calibration import CALIBRATION_DIR, Calibration, calibration_key, load_calibration
from bench.planning.dry_run import DryRunModel, dry_run_for
from bench.planning.estimate import (add_device_overheads, plan_rows_from_placement, predict, shares_from_placement,
                                     shares_from_plan)
from bench.planning.greedy import place_greedy
from bench.planning.planner_memory import host_memory_per_node, host_memory_per_rank, memory_model_for, planner_memory
from bench.planning.torchrec_adapter import place_torchrec
from bench.planning.measured_terms import check_reservation_file
from bench.planning.types import Placement, PlacementError, PlanTarget, RankPrediction, validate_memory_model
from bench.results.schema import JobStats, RankResult, Status, complete_breakdown
from workloads.spec import WorkloadSpec, build_spec
from workloads.units import GIB, MIB
from workloads.storage import table_storage
from workloads.uvm_cache import (FUSED, FUSED_UVM, FUSED_UVM_CACHING, UVM_KERNELS, effective_caching_ratio,
                                 is_caching_ratio, shard_tiers)
from workloads.validate import ConfigError

PLANNERS = ("membench", "torchrec")


def validate_plan_config(plan, device_type: str) -> None:
    """The `plan.*` settings (planner, memory model, measured reservation, shard fraction, headroom) for ranks
    of `device_type`: ConfigError for the first bad one."""
    if plan.planner not in PLANNERS:
        raise ConfigError("plan.planner", plan.planner, "use membench or torchrec")
    validate_memory_model(plan.memory_model)
    if plan.memory_model == "membench" and plan.planner != "torchrec":
        raise ConfigError("plan.memory_model", plan.memory_model,
                          "membench's memory model is for torchrec's planner: add plan.planner=torchrec")
    if plan.reservation_file is not None and plan.planner != "torchrec":
        raise ConfigError("plan.reservation_file", plan.reservation_file,
                          "a measured reservation is for torchrec's planner: add plan.planner=torchrec")
    check_reservation_file(plan, device_type)
    if not 0 < plan.max_shard_fraction <= 1:
        raise ConfigError("plan.max_shard_fraction", plan.max_shard_fraction, "use a fraction in (0, 1]")
    if not 0 <= plan.headroom < 1:
        raise ConfigError("plan.headroom", plan.headroom, "use a fraction in [0, 1), e.g. 0.1 for 10%")


def validate_caching_ratios(cfg) -> None:
    """plan.caching_ratios: shares of the rows in (0, 1), for UVM-cached tables only."""
    ratios = list(cfg.plan.caching_ratios)
    if not ratios:
        return
    if not all(is_caching_ratio(r) for r in ratios):
        raise ConfigError("plan.caching_ratios", ratios, "use shares of the rows in (0, 1), e.g. [0.05,0.1,0.2]")
    if cfg.sharding.compute_kernel != FUSED_UVM_CACHING:
        raise ConfigError("plan.caching_ratios", ratios, "cache ratios are for UVM-cached tables: add "
                          "sharding.compute_kernel=fused_uvm_caching")


def place(cfg, spec: WorkloadSpec, target: PlanTarget, world_size: int, memory=None) -> Placement:
    """The placement of plan.planner; torchrec's planner with plan.memory_model's memory model (`memory`: a
    `MembenchMemoryModel` built already, reused across world sizes)."""
    if cfg.plan.planner == "torchrec":
        compute_device, hbm_cap, ddr_cap = planner_memory(cfg, target.device_type, target.capacity_bytes,
                                                          target.ranks_per_node)
        if memory is None:
            memory = memory_model_for(cfg, spec, target.device_type)
        return place_torchrec(spec, world_size, hbm_cap or target.capacity_bytes,
                              local_world_size=target.ranks_per_node, ddr_cap_bytes=ddr_cap,
                              compute_device=compute_device, memory=memory,
                              compute_kernel=cfg.sharding.compute_kernel, caching_ratio=cfg.sharding.caching_ratio)
    kernel = greedy_kernel(cfg.sharding.compute_kernel)
    capacity = (host_memory_per_rank(cfg, target.ranks_per_node) if kernel == FUSED_UVM else target.capacity_bytes)
    return place_greedy(spec, world_size, capacity, allow_row_wise=target.device_type == "cuda",
                        max_shard_fraction=cfg.plan.max_shard_fraction, compute_kernel=kernel,
                        caching_ratio=cfg.sharding.caching_ratio)


def greedy_kernel(compute_kernel: str) -> str:
    """The kernel membench's placement puts every table under: a UVM kernel as asked, else HBM (`auto` and
    `dense` hold the tables in HBM as `fused` does; membench does not choose kernels per table)."""
    return compute_kernel if compute_kernel in UVM_KERNELS else FUSED


def predict_ranks(cfg, spec: WorkloadSpec, target: PlanTarget, placement: Placement, dry_run: DryRunModel):
    """Every rank's prediction; a torchrec plan's shares as `membench run` predicts that plan before launch."""
    calibration = load_calibration(CALIBRATION_DIR, calibration_key(target.device_type, cfg.hardware.name))
    shares = (shares_from_plan(plan_rows_from_placement(placement), spec, placement.world_size,
                               cfg.sharding.caching_ratio)
              if placement.planner == "torchrec"
              else shares_from_placement(placement, spec, cfg.sharding.caching_ratio))
    predictions = predict(spec, shares, calibration.coefficients, dry_run,
                          allocator_settings=allocator_settings_for(cfg.allocator, target.device_type))
    return [add_device_overheads(p, target.device_type, cfg.hardware.non_torch_reserve_mib * MIB)
            for p in predictions], calibration


@dataclass
class PlanOutcome:
    """A plan judged against its target: what goes into the run's summary."""
    status: str
    error: Optional[str]
    per_rank: List[RankResult] = field(default_factory=list)
    job: JobStats = field(default_factory=JobStats)
    estimate: dict = field(default_factory=dict)

    @property
    def oom_ranks(self) -> List[int]:
        return [r.rank for r in self.per_rank if r.status == Status.OOM]


def _rank_results(predictions: List[RankPrediction], target: PlanTarget) -> List[RankResult]:
    capacity = target.capacity_bytes
    return [RankResult(rank=p.rank, status=Status.OK if p.total_bytes <= capacity else Status.OOM,
                       device=target.device_type, capacity_bytes=capacity, peak_bytes=p.total_bytes,
                       peak_allocated_bytes=p.total_bytes, utilization=p.total_bytes / capacity,
                       headroom_bytes=capacity - p.total_bytes, peak_phase="estimate",
                       breakdown=complete_breakdown(p.total_bytes, p.breakdown), recorder="estimate")
            for p in predictions]


def planner_memory_model(cfg, placement: Optional[Placement]) -> Optional[str]:
    """The memory model torchrec's planner planned with (its placement says; the config before it placed)."""
    if cfg.plan.planner != "torchrec":
        return None
    return (placement.info.get("memory_model") if placement else None) or cfg.plan.memory_model


def planner_per_rank_bytes(placement: Optional[Placement]) -> Optional[List[int]]:
    """torchrec's planner's own per-rank figure with an absolute reservation (membench's model, or a measured
    one: the reservation + the storage it estimated for the rank's shards), None for other placements."""
    reserved = placement.info.get("reserved_bytes") if placement else None
    if reserved is None:
        return None
    return [reserved + hbm + ddr for hbm, ddr in zip(placement.per_rank_hbm_bytes, placement.per_rank_ddr_bytes)]


def host_memory(cfg, target: PlanTarget, predictions: List[RankPrediction]) -> dict:
    """UVM tables in host memory: per node, the bytes its ranks keep there, against hardware.host_memory_gib."""
    per_node = [0] * max(1, math.ceil(len(predictions) / target.ranks_per_node))
    for p in predictions:
        per_node[p.rank // target.ranks_per_node] += p.host_bytes
    return {"per_node_host_bytes": per_node, "host_capacity_bytes": host_memory_per_node(cfg)}


def host_memory_error(host: dict) -> Optional[str]:
    worst = max(range(len(host["per_node_host_bytes"])), key=host["per_node_host_bytes"].__getitem__)
    need, have = host["per_node_host_bytes"][worst], host["host_capacity_bytes"]
    if need <= have:
        return None
    return (f"does not fit: node {worst} needs {need / GIB:.2f} GiB of host memory for its UVM tables, of "
            f"{have / GIB:.2f} GiB (hardware.host_memory_gib; short by {(need - have) / GIB:.2f} GiB)")


def judge_plan(cfg, target: PlanTarget, predictions: List[RankPrediction], placement: Optional[Placement],
               calibration: Optional[Calibration], error: Optional[str] = None,
               binding: Optional[str] = None) -> PlanOutcome:
    """The verdict on a plan: every rank's HBM and every node's host memory (UVM tables) against capacity;
    `error` (and `binding`, the memory that ran out) from a placement that failed."""
    ranks = _rank_results(predictions, target)
    host = host_memory(cfg, target, predictions)
    hbm_fits = all(r.status == Status.OK for r in ranks)
    host_error = host_memory_error(host) if predictions else None
    fits = error is None and hbm_fits and host_error is None
    worst = max(ranks, key=lambda r: r.peak_bytes, default=None)
    utils = [r.utilization for r in ranks]
    peaks = [r.peak_bytes for r in ranks]
    job = JobStats(utilization_min=min(utils, default=0.0), utilization_mean=statistics.fmean(utils) if utils else 0.0,
                   utilization_max=max(utils, default=0.0),
                   imbalance=max(peaks) / statistics.fmean(peaks) if peaks and statistics.fmean(peaks) else 0.0)
    if error is None and not hbm_fits:
        error = (f"does not fit: rank {worst.rank} needs {worst.peak_bytes / GIB:.2f} GiB of "
                 f"{target.capacity_bytes / GIB:.2f} GiB (short by {-worst.headroom_bytes / GIB:.2f} GiB)")
    error = error or host_error
    estimate = {"verdict": "fits" if fits else "oom", "worst_rank": worst.rank if worst else None,
                "planner": cfg.plan.planner,
                "memory_model": planner_memory_model(cfg, placement),
                "planner_per_rank_bytes": planner_per_rank_bytes(placement),
                "plan_time_s": round(placement.plan_time_s, 3) if placement else None,
                "calibration": calibration.source if calibration else None,
                "virtual_table_bytes": build_spec(cfg.workload).virtual_bytes,
                "placement": placement.to_dict() if placement else None,
                **host, "binding": None if fits else (binding or ("host" if hbm_fits and host_error else "hbm"))}
    return PlanOutcome(status=Status.OK if fits else Status.OOM, error=error, per_rank=ranks, job=job,
                       estimate=estimate)


def plan(cfg, spec: WorkloadSpec, target: PlanTarget) -> PlanOutcome:
    """Place and predict for `target.world_size` ranks; a placement that fails is an `oom` outcome."""
    try:
        placement = place(cfg, spec, target, target.world_size)
    except PlacementError as err:
        return judge_plan(cfg, target, [], None, None, error=str(err), binding=err.binding)
    predictions, calibration = predict_ranks(cfg, spec, target, placement, dry_run_for(cfg, spec))
    return judge_plan(cfg, target, predictions, placement, calibration)


def rank_budget(cfg, target: PlanTarget) -> int:
    """What provisioning lets a rank use: its capacity less plan.headroom."""
    return int(target.capacity_bytes * (1 - cfg.plan.headroom))


def evaluate(cfg, spec: WorkloadSpec, target: PlanTarget, world_size: int, dry_run: DryRunModel,
             memory=None) -> dict:
    budget = rank_budget(cfg, target)
    try:
        placement = place(cfg, spec, target, world_size, memory)
    except PlacementError as err:
        return {"world_size": world_size, "fits": False, "max_rank_bytes": None, "shortfall_bytes": err.shortfall_bytes,
                "reason": str(err), "binding": err.binding}
    predictions, _ = predict_ranks(cfg, spec, target, placement, dry_run)
    worst = max(p.total_bytes for p in predictions)
    mean = statistics.fmean(p.total_bytes for p in predictions)
    host = host_memory(cfg, target, predictions)
    host_error = host_memory_error(host)
    host_shortfall = max(host["per_node_host_bytes"]) - host["host_capacity_bytes"]
    return {"world_size": world_size, "fits": worst <= budget and host_error is None, "max_rank_bytes": worst,
            "utilization_max": worst / target.capacity_bytes, "utilization_mean": mean / target.capacity_bytes,
            "shortfall_bytes": worst - budget if worst > budget else max(0, host_shortfall),
            "reason": host_error,
            "max_node_host_bytes": max(host["per_node_host_bytes"]),
            "binding": None if worst <= budget and host_error is None else ("hbm" if worst > budget else "host")}


def _say(line: str) -> None:
    print(line, flush=True)


def caching_ratios(cfg) -> List[Optional[float]]:
    """The cache ratios provisioning tries: plan.caching_ratios, else sharding.caching_ratio alone."""
    return list(cfg.plan.caching_ratios) or [cfg.sharding.caching_ratio]


def smallest_world_size(cfg, spec: WorkloadSpec, target: PlanTarget) -> int:
    """A world size below which nothing can fit, in whole nodes: the tables' HBM part alone (whole shards,
    each with the fewest cache sets) over the ranks' budget, and their host part over the nodes' host memory.
    0 where the kernels are the planner's to choose (torchrec's `auto`: tables may go to either memory)."""
    kernel = cfg.sharding.compute_kernel
    if cfg.plan.planner == "torchrec" and kernel not in (FUSED, *UVM_KERNELS):
        return 0
    ratio = effective_caching_ratio(cfg.sharding.caching_ratio)
    hbm = host = 0
    for table in spec.tables:
        weight, state = table_storage(table, spec.config.embedding_optimizer)
        tiers = shard_tiers(greedy_kernel(kernel), table.virtual_rows, table.embedding_dim, table.bytes_per_element,
                            weight, state, ratio)
        hbm, host = hbm + tiers.hbm_bytes, host + tiers.host_bytes
    budget = max(1, rank_budget(cfg, target))
    host_per_node = max(1, host_memory_per_node(cfg))
    nodes = max(math.ceil(hbm / budget / target.ranks_per_node), math.ceil(host / host_per_node))
    return nodes * target.ranks_per_node


def provision_point(cfg, target: PlanTarget, on_world_size=None) -> dict:
    """The smallest world size, in multiples of the ranks per node, that fits `cfg` (one batch size and cache
    ratio) with plan.headroom free, and the next smaller one tried. The search starts one node below
    `smallest_world_size`, so that what the next smaller lacks is a measured point, not the bound."""
    spec = build_spec(cfg.workload)
    dry_run = dry_run_for(cfg, spec)  # built once, stepped per distinct rank share
    memory = memory_model_for(cfg, spec, target.device_type)  # likewise (None: torchrec's own model)
    step = target.ranks_per_node
    first = max(step, smallest_world_size(cfg, spec, target) - step)
    previous, chosen = None, None
    for world_size in range(first, cfg.plan.max_world_size + 1, step):
        point = evaluate(cfg, spec, target, world_size, dry_run, memory)
        if on_world_size is not None:
            on_world_size(cfg.workload.batch_size, point)
        if point["fits"]:
            chosen = point
            break
        previous = point
    return {"batch_size": cfg.workload.batch_size, "compute_kernel": cfg.sharding.compute_kernel,
            "caching_ratio": cfg.sharding.caching_ratio, "search_from": first, "recommended": chosen,
            "next_smaller": previous}


def provision(cfg, target: PlanTarget, progress=_say, on_world_size=None) -> dict:
    """For each per-rank batch size (plan.batch_sizes, else the workload's) and each cache ratio
    (plan.caching_ratios, with fused_uvm_caching): `provision_point`. `on_world_size(batch, point)`, when
    given, hears of every world size tried (progress at TB scale)."""
    results = []
    for batch in list(cfg.plan.batch_sizes) or [cfg.workload.batch_size]:
        for ratio in caching_ratios(cfg):
            point_cfg = copy.deepcopy(cfg)
            point_cfg.workload.batch_size, point_cfg.sharding.caching_ratio = batch, ratio
            row = provision_point(point_cfg, target, on_world_size)
            results.append(row)
            chosen = row["recommended"]
            progress(f"[membench] batch {batch}{'' if ratio is None else f', cache ratio {ratio:g}'}: "
                     + (f"{chosen['world_size']} ranks" if chosen else
                        f"nothing up to {cfg.plan.max_world_size} ranks fits"))
    return {"workload": cfg.workload.name, "hardware": cfg.hardware.name, "capacity_bytes": target.capacity_bytes,
            "headroom": cfg.plan.headroom, "ranks_per_node": target.ranks_per_node, "planner": cfg.plan.planner,
            "host_capacity_bytes": host_memory_per_node(cfg), "results": results}
