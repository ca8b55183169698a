"""One run from overrides or a composed config: compose -> resolve -> validate -> launch -> summary.

Used by `membench run` (one Hydra job per run or sweep point), the regression harness, calibration and
the benchmarks. An invalid config comes back as a summary with status `invalid` (written, never
launched), so a sweep point with a bad value never stops the sweep.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

from bench.results.schema import RunSummary, Status
from bench.results.store import write_summary
from bench.run.config import CONF_DIR, RunConfig, register_configs, register_resolvers, to_run_config, with_changes
from bench.run.emulation import BACKEND_NAME as EMULATED_BACKEND
from bench.run.launch_types import LaunchSpec
from bench.run.launchspec import checked_run, visible_cuda_devices
from bench.run.summary import summary_for
from workloads.validate import ConfigError


def compose_run_config(overrides: List[str]) -> RunConfig:
    """The RunConfig that `membench run OVERRIDES` would use (Hydra compose API, same conf/)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_run_config(compose("config", overrides=list(overrides)))


def invalid_run(cfg: RunConfig, run_dir: Path, run_id: str, sweep_id: Optional[str], err: ConfigError) -> RunSummary:
    """A refused run: its one-line reason on stderr and in an `invalid` summary; nothing was launched."""
    print(f"membench: {err}", file=sys.stderr)
    summary = summary_for(cfg, run_id=run_id, status=Status.INVALID, world_size=0,
                          device_type=cfg.hardware.device, error=str(err), sweep_id=sweep_id)
    write_summary(run_dir, summary)
    return summary


def ranks_said(launch: LaunchSpec) -> str:
    """What the run launches, for its first line: N ranks, or the one rank of N played in one process."""
    if launch.dist_backend != EMULATED_BACKEND:
        return f"{launch.world_size} {launch.device_type} rank(s) ({launch.dist_backend})"
    rank = "auto" if launch.emulated_rank is None else launch.emulated_rank
    return f"rank {rank} of {launch.world_size} {launch.device_type} ranks, emulated in one process"


def execute_run(cfg: RunConfig, run_dir: Path, run_id: str, sweep_id: Optional[str],
                echo: bool = True) -> RunSummary:
    from bench.run.launch import launch_run

    cfg = with_changes(cfg, run_id=run_id)
    try:
        cfg, launch = checked_run(cfg, *visible_cuda_devices(cfg))
    except ConfigError as err:
        return invalid_run(cfg, run_dir, run_id, sweep_id, err)
    print(f"[membench] run {run_id}: workload={cfg.workload.name} on {ranks_said(launch)}; results in {run_dir}",
          flush=True)
    try:
        return launch_run(cfg, launch, run_dir, run_id, sweep_id=sweep_id, echo=echo)
    except ConfigError as err:  # what only the prediction can tell (emulate.*): refused before launch
        return invalid_run(cfg, run_dir, run_id, sweep_id, err)


def run_overrides(overrides: List[str], run_dir: Path, run_id: str, echo: bool = False) -> RunSummary:
    """Compose, validate and launch one run into `run_dir`; invalid configs come back as `invalid`."""
    cfg = compose_run_config(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    return execute_run(cfg, run_dir, run_id, sweep_id=None, echo=echo)
