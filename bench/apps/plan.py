"""`membench plan` and `membench provision`: memory estimates for any world size, no GPU needed.

    membench plan workload=tb_10 hardware=h100_80g world_size=512      (or nodes=64)
    membench provision workload=tb_10 hardware=h100_80g plan.headroom=0.1

Tables are placed by membench's greedy placement (or torchrec's planner with plan.planner=torchrec)
on their virtual rows; each rank's peak is predicted as in bench/planning/estimate.py.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from bench.apps.console import human_bytes, print_plan, print_provision
from bench.apps.progress import Throttled, Ticker
from bench.run.step_progress import clock
from bench.apps.run import JobOutcome, max_peak
from bench.planning.provision import plan, provision, validate_caching_ratios, validate_plan_config
from bench.planning.torchrec_adapter import quiet_libraries
from bench.results.schema import Status
from bench.results.store import atomic_write_json, write_summary
from bench.run.config import to_run_config, with_changes
from bench.run.launchspec import resolve_target
from bench.run.summary import summary_for
from workloads.spec import build_spec
from workloads.validate import ConfigError, validate_workload


def checked_job(dict_cfg: DictConfig, mode: str):
    """(run directory, config, target) of a plan or provision job, or the `invalid` outcome that ends it
    when its config is refused (one line on stderr)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    cfg = with_changes(to_run_config(dict_cfg), mode=mode)
    try:
        target = resolve_target(cfg, visible_cuda=None)
        validate_plan_config(cfg.plan, target.device_type)
        validate_caching_ratios(cfg)
        validate_workload(cfg.workload)
    except ConfigError as err:
        print(f"membench: {err}", file=sys.stderr)
        return JobOutcome(run_dir.name, Status.INVALID, run_dir)
    quiet_libraries()
    return run_dir, cfg, target


def plan_job(dict_cfg: DictConfig) -> JobOutcome:
    started = time.perf_counter()
    checked = checked_job(dict_cfg, "plan")
    if isinstance(checked, JobOutcome):
        return checked
    run_dir, cfg, target = checked
    spec = build_spec(cfg.workload)
    print(f"[membench] planning {cfg.workload.name} ({spec.virtual_bytes / 1e12:.2f} TB of tables, "
          f"{len(spec.tables)} tables) on {target.world_size} x {cfg.hardware.name}", flush=True)
    with Ticker(say, lambda elapsed: f"[membench] still planning {target.world_size} ranks, {clock(elapsed)} "
                                     f"elapsed"):
        outcome = plan(cfg, spec, target)
    summary = summary_for(cfg, run_id=run_dir.name, status=outcome.status, world_size=target.world_size,
                          device_type=target.device_type, device_name=cfg.hardware.name,
                          wall_s=round(time.perf_counter() - started, 3), error=outcome.error,
                          per_rank=outcome.per_rank, job=outcome.job, oom_ranks=outcome.oom_ranks,
                          estimate=outcome.estimate)
    write_summary(run_dir, summary)
    print_plan(summary, run_dir)
    return JobOutcome(summary.run_id, summary.status, run_dir, max_peak(summary))


def provision_job(dict_cfg: DictConfig) -> JobOutcome:
    checked = checked_job(dict_cfg, "provision")
    if isinstance(checked, JobOutcome):
        return checked
    run_dir, cfg, target = checked
    report = provision(cfg, target, on_world_size=world_size_progress(cfg.plan.max_world_size))
    path = run_dir / "provision.json"
    atomic_write_json(path, report)
    print_provision(report, path)
    status = Status.OK if all(r["recommended"] for r in report["results"]) else Status.OOM
    chosen_peaks = [r["recommended"]["max_rank_bytes"] for r in report["results"] if r["recommended"]]
    return JobOutcome(run_dir.name, status, run_dir, max(chosen_peaks, default=None))


def say(line: str) -> None:
    print(line, flush=True)


def world_size_progress(max_world_size: int, every_s: float = 5.0):
    """provision's on_world_size: a line at most every few seconds while it searches the world sizes (at
    terabyte scale each one is a placement and a prediction; a quick search says nothing)."""
    throttle = Throttled(say, every_s=every_s, after_s=every_s)

    def on_world_size(batch: int, point: dict) -> None:
        worst = point.get("max_rank_bytes")
        detail = (f"largest rank {human_bytes(worst)}" if worst is not None else "placement failed")
        if not point.get("fits") and point.get("shortfall_bytes"):
            detail += f", {human_bytes(point['shortfall_bytes'])} over budget"
        verdict = "fits" if point.get("fits") else "does not fit"
        throttle(lambda elapsed: f"[membench] batch {batch}: world size {point['world_size']} of up to "
                                 f"{max_world_size} {verdict} ({detail}); elapsed {clock(elapsed)}")
    return on_world_size
