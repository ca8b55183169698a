"""`membench plan` and `membench provision`: memory estimates for any world size, no GPU needed.

    membench plan workload=tb_10 hardware=h100_80g world_size=512      (or nodes=64)
    membench provision workload=tb_10 hardware=h100_80g plan.headroom=0.1

Tables are placed by membench's greedy placement (or torchrec's planner with plan.planner=torchrec)
on their virtual rows; each rank's peak is predicted as in workloads/estimate.py.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from bench.config import RunConfig
from bench.exit_codes import STATUS_EXIT_CODE
from bench.predict import CALIBRATION_DIR, calibration_key
from bench.quiet import quiet_libraries
from bench.results import JobStats, RankResult, RunSummary, atomic_write_json, write_summary
from bench.run_app import CONF_DIR, STATUSES
from bench.runspec import config_hash, to_run_config
from bench.summary_table import make_console
from bench.versions import environment_versions
from workloads.tables import GIB, build_spec
from workloads.validate import ConfigError, validate_workload

DEFAULT_GPU_RANKS_PER_NODE = 8


@dataclass
class PlanTarget:
    device_type: str
    ranks_per_node: int
    world_size: int
    capacity_bytes: int


def resolve_target(cfg: RunConfig) -> PlanTarget:
    hw = cfg.hardware
    device_type = "cuda" if hw.device == "cuda" else "cpu"
    ranks_per_node = hw.ranks_per_node or (DEFAULT_GPU_RANKS_PER_NODE if device_type == "cuda" else 2)
    if ranks_per_node < 1:
        raise ConfigError("hardware.ranks_per_node", ranks_per_node, "must be >= 1")
    nodes = cfg.nodes if cfg.nodes is not None else hw.nodes
    if nodes < 1:
        raise ConfigError("nodes", nodes, "must be >= 1")
    world_size = cfg.world_size if cfg.world_size is not None else nodes * ranks_per_node
    if world_size < 1:
        raise ConfigError("world_size", world_size, "must be >= 1")
    if not hw.capacity_gib > 0:
        raise ConfigError("hardware.capacity_gib", hw.capacity_gib, "must be > 0 (GiB per rank)")
    if cfg.plan.planner not in ("membench", "torchrec"):
        raise ConfigError("plan.planner", cfg.plan.planner, "use membench or torchrec")
    if not 0 < cfg.plan.max_shard_fraction <= 1:
        raise ConfigError("plan.max_shard_fraction", cfg.plan.max_shard_fraction, "use a fraction in (0, 1]")
    if not 0 <= cfg.plan.headroom < 1:
        raise ConfigError("plan.headroom", cfg.plan.headroom, "use a fraction in [0, 1), e.g. 0.1 for 10%")
    return PlanTarget(device_type, ranks_per_node, world_size, int(hw.capacity_gib * GIB))


def place(cfg: RunConfig, spec, target: PlanTarget, world_size: int):
    from workloads.placement import place_greedy, place_torchrec

    if cfg.plan.planner == "torchrec":
        return place_torchrec(spec, world_size, target.capacity_bytes, local_world_size=target.ranks_per_node,
                              ddr_cap_bytes=int(cfg.hardware.host_memory_gib * GIB),
                              compute_device=target.device_type)
    return place_greedy(spec, world_size, target.capacity_bytes, allow_row_wise=target.device_type == "cuda",
                        max_shard_fraction=cfg.plan.max_shard_fraction)


def predict_ranks(cfg: RunConfig, spec, target: PlanTarget, placement, dry_run):
    from workloads.estimate import add_device_overheads, load_calibration, predict, shares_from_placement

    calibration = load_calibration(CALIBRATION_DIR, calibration_key(target.device_type, cfg.hardware.name))
    predictions = predict(spec, shares_from_placement(placement, spec), calibration.coefficients, dry_run)
    return [add_device_overheads(p, target.device_type) for p in predictions], calibration


def plan_summary(cfg: RunConfig, target: PlanTarget, run_id: str, predictions, placement, calibration,
                 elapsed_s: float, error: Optional[str] = None) -> RunSummary:
    ranks = [RankResult(rank=p.rank, status="ok" if p.total_bytes <= target.capacity_bytes else "oom",
                        device=target.device_type, capacity_bytes=target.capacity_bytes, peak_bytes=p.total_bytes,
                        peak_allocated_bytes=p.total_bytes, utilization=p.total_bytes / target.capacity_bytes,
                        headroom_bytes=target.capacity_bytes - p.total_bytes, peak_phase="estimate",
                        breakdown=complete(p), recorder="estimate") for p in predictions]
    fits = error is None and all(r.status == "ok" for r in ranks)
    worst = max(ranks, key=lambda r: r.peak_bytes, default=None)
    utils = [r.utilization for r in ranks]
    peaks = [r.peak_bytes for r in ranks]
    job = JobStats(utilization_min=min(utils, default=0.0), utilization_mean=statistics.fmean(utils) if utils else 0.0,
                   utilization_max=max(utils, default=0.0),
                   imbalance=max(peaks) / statistics.fmean(peaks) if peaks and statistics.fmean(peaks) else 0.0)
    status = "ok" if fits else "oom"
    if error is None and not fits:
        error = (f"does not fit: rank {worst.rank} needs {worst.peak_bytes / GIB:.2f} GiB of "
                 f"{target.capacity_bytes / GIB:.2f} GiB (short by {-worst.headroom_bytes / GIB:.2f} GiB)")
    return RunSummary(
        run_id=run_id, status=status, mode="plan", workload=cfg.workload.name, hardware=cfg.hardware.name,
        world_size=target.world_size, device_type=target.device_type, device_name=cfg.hardware.name,
        model_backend=cfg.model.backend, config_hash=config_hash(cfg), versions=environment_versions(),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=round(elapsed_s, 3),
        exit_code=STATUS_EXIT_CODE[status], error=error, per_rank=ranks, job=job,
        oom_ranks=[r.rank for r in ranks if r.status == "oom"],
        estimate={"verdict": "fits" if fits else "oom", "worst_rank": worst.rank if worst else None,
                  "planner": cfg.plan.planner, "plan_time_s": round(placement.plan_time_s, 3) if placement else None,
                  "calibration": calibration.source if calibration else None,
                  "virtual_table_bytes": build_spec(cfg.workload).virtual_bytes,
                  "placement": placement.to_dict() if placement else None},
    )


def complete(prediction) -> dict:
    from bench.memory.recorder import complete_breakdown

    return complete_breakdown(prediction.total_bytes, prediction.breakdown)


def print_plan(summary: RunSummary, run_dir: Path) -> None:
    console = make_console()
    ranks = summary.per_rank
    style = "green" if summary.status == "ok" else "red"
    console.print(f"[bold]{summary.run_id}[/bold]  plan  workload {summary.workload} on {summary.world_size} x "
                  f"{summary.hardware}  [{style}]{summary.estimate['verdict']}[/{style}]  "
                  f"(placement {summary.estimate['planner']} {summary.estimate['plan_time_s']} s, wall {summary.wall_s:.1f} s)")
    if ranks:
        from rich.table import Table

        shown = sorted(ranks, key=lambda r: r.peak_bytes, reverse=True)
        if len(shown) > 8:
            shown = shown[:5] + [min(ranks, key=lambda r: r.peak_bytes)]
        table = Table(title=f"per-rank estimate (GiB){' - top 5 and the smallest' if len(ranks) > 8 else ''}",
                      title_justify="left")
        for column in ("rank", "total", "capacity", "util %", "headroom", "emb weights", "emb optim", "dense+optim",
                       "activations", "overheads"):
            table.add_column(column, justify="right")
        for rank in shown:
            b = rank.breakdown
            dense = b["dense_params"] + b["dense_grads"] + b["dense_optimizer"]
            table.add_row(str(rank.rank), f"{rank.peak_bytes / GIB:.2f}", f"{rank.capacity_bytes / GIB:.2f}",
                          f"{100 * rank.utilization:.1f}", f"{rank.headroom_bytes / GIB:.2f}",
                          f"{b['embedding_weights'] / GIB:.2f}", f"{b['embedding_optimizer'] / GIB:.2f}",
                          f"{dense / GIB:.2f}", f"{b['activations'] / GIB:.2f}",
                          f"{(b['allocator_overhead'] + b['non_torch']) / GIB:.2f}")
        console.print(table)
        job = summary.job
        console.print(f"job: utilization min/mean/max {100 * job.utilization_min:.1f}/{100 * job.utilization_mean:.1f}/"
                      f"{100 * job.utilization_max:.1f} %, imbalance {job.imbalance:.3f}")
    if summary.error:
        console.print(f"[{style}]{summary.error}[/{style}]")
    console.print(f"results: {run_dir}")


def run_plan(cfg: RunConfig, run_dir: Path, run_id: str) -> RunSummary:
    from workloads.estimate import DryRunModel
    from workloads.placement import PlacementError

    started = time.perf_counter()
    cfg.mode = "plan"
    try:
        target = resolve_target(cfg)
        validate_workload(cfg.workload)
    except ConfigError as err:
        print(f"membench: {err}", file=sys.stderr)
        sys.exit(STATUS_EXIT_CODE["invalid"])
    quiet_libraries()
    spec = build_spec(cfg.workload)
    print(f"[membench] planning {cfg.workload.name} ({spec.virtual_bytes / 1e12:.2f} TB of tables, "
          f"{len(spec.tables)} tables) on {target.world_size} x {cfg.hardware.name}", flush=True)
    try:
        placement = place(cfg, spec, target, target.world_size)
    except PlacementError as err:
        summary = plan_summary(cfg, target, run_id, [], None, None, time.perf_counter() - started, error=str(err))
    else:
        predictions, calibration = predict_ranks(cfg, spec, target, placement, DryRunModel(spec))
        summary = plan_summary(cfg, target, run_id, predictions, placement, calibration,
                               time.perf_counter() - started)
    write_summary(run_dir, summary)
    return summary


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def plan_main(dict_cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    summary = run_plan(to_run_config(dict_cfg), run_dir, run_dir.name)
    STATUSES.append((summary.run_id, summary.status, run_dir))
    print_plan(summary, run_dir)


# -- provisioning ----------------------------------------------------------------------------------
def evaluate(cfg: RunConfig, spec, target: PlanTarget, world_size: int, dry_run) -> dict:
    from workloads.placement import PlacementError

    budget = int(target.capacity_bytes * (1 - cfg.plan.headroom))
    try:
        placement = place(cfg, spec, target, world_size)
    except PlacementError as err:
        return {"world_size": world_size, "fits": False, "max_rank_bytes": None, "shortfall_bytes": err.shortfall_bytes,
                "reason": str(err)}
    predictions, _ = predict_ranks(cfg, spec, target, placement, dry_run)
    worst = max(p.total_bytes for p in predictions)
    mean = statistics.fmean(p.total_bytes for p in predictions)
    return {"world_size": world_size, "fits": worst <= budget, "max_rank_bytes": worst,
            "utilization_max": worst / target.capacity_bytes, "utilization_mean": mean / target.capacity_bytes,
            "shortfall_bytes": max(0, worst - budget), "reason": None}


def provision(cfg: RunConfig) -> dict:
    from workloads.estimate import DryRunModel

    target = resolve_target(cfg)
    validate_workload(cfg.workload)
    quiet_libraries()
    batch_sizes = list(cfg.plan.batch_sizes) or [cfg.workload.batch_size]
    results = []
    for batch in batch_sizes:
        cfg.workload.batch_size = batch
        spec = build_spec(cfg.workload)
        dry_run = DryRunModel(spec)  # built once per batch size, stepped per distinct rank share
        previous, chosen = None, None
        for world_size in range(target.ranks_per_node, cfg.plan.max_world_size + 1, target.ranks_per_node):
            point = evaluate(cfg, spec, target, world_size, dry_run)
            if point["fits"]:
                chosen = point
                break
            previous = point
        results.append({"batch_size": batch, "recommended": chosen, "next_smaller": previous})
        print(f"[membench] batch {batch}: " + (f"{chosen['world_size']} ranks" if chosen else
                                               f"nothing up to {cfg.plan.max_world_size} ranks fits"), flush=True)
    return {"workload": cfg.workload.name, "hardware": cfg.hardware.name, "capacity_bytes": target.capacity_bytes,
            "headroom": cfg.plan.headroom, "ranks_per_node": target.ranks_per_node, "planner": cfg.plan.planner,
            "results": results}


def print_provision(report: dict, out_path: Path) -> None:
    from rich.table import Table

    console = make_console()
    table = Table(title=f"provisioning {report['workload']} on {report['hardware']} "
                        f"({report['capacity_bytes'] / GIB:.0f} GiB/rank, headroom {100 * report['headroom']:.0f}%)",
                  title_justify="left")
    for column in ("batch/rank", "recommended ranks", "nodes", "max rank GiB", "util max %", "util mean %",
                   "next smaller", "it lacks (GiB)"):
        table.add_column(column, justify="right")
    for row in report["results"]:
        chosen, smaller = row["recommended"], row["next_smaller"]
        if chosen is None:
            table.add_row(str(row["batch_size"]), "none fits", "-", "-", "-", "-", "-", "-")
            continue
        lacks = "-" if smaller is None else f"{smaller['shortfall_bytes'] / GIB:.2f}"
        table.add_row(str(row["batch_size"]), str(chosen["world_size"]),
                      str(chosen["world_size"] // report["ranks_per_node"]), f"{chosen['max_rank_bytes'] / GIB:.2f}",
                      f"{100 * chosen['utilization_max']:.1f}", f"{100 * chosen['utilization_mean']:.1f}",
                      "-" if smaller is None else str(smaller["world_size"]), lacks)
    console.print(table)
    console.print(f"results: {out_path}")


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def provision_main(dict_cfg: DictConfig) -> None:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    cfg = to_run_config(dict_cfg)
    cfg.mode = "provision"
    try:
        report = provision(cfg)
    except ConfigError as err:
        print(f"membench: {err}", file=sys.stderr)
        sys.exit(STATUS_EXIT_CODE["invalid"])
    path = run_dir / "provision.json"
    atomic_write_json(path, report)
    status = "ok" if all(r["recommended"] for r in report["results"]) else "oom"
    STATUSES.append((run_dir.name, status, run_dir))
    print_provision(report, path)
