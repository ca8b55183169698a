"""The Hydra app behind `membench run`: compose -> validate -> launch under torchrun -> summarize."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional, Tuple

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bench.config import RunConfig
from bench.exit_codes import STATUS_EXIT_CODE
from bench.results import RunSummary, atomic_write_json, read_json, write_summary
from bench.runspec import config_hash, resolve_launch, to_run_config, validate_run, visible_cuda_devices
from bench.summary_table import print_run_summary, print_sweep
from bench.versions import environment_versions
from workloads.validate import ConfigError

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
# (run_id, status, run_dir) of every job this process ran, in order
STATUSES: List[Tuple[str, str, Path]] = []


def invalid_summary(cfg: RunConfig, run_id: str, sweep_id: Optional[str], error: ConfigError) -> RunSummary:
    return RunSummary(
        run_id=run_id, status="invalid", mode=cfg.mode, workload=cfg.workload.name,
        hardware=cfg.hardware.name, world_size=0, device_type=cfg.hardware.device, device_name="",
        model_backend=cfg.model.backend, config_hash=config_hash(cfg), versions=environment_versions(),
        started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), wall_s=0.0,
        exit_code=STATUS_EXIT_CODE["invalid"], error=str(error), sweep_id=sweep_id,
    )


def execute_run(cfg: RunConfig, run_dir: Path, run_id: str, sweep_id: Optional[str],
                echo: bool = True) -> RunSummary:
    from bench.launch import launch_run

    cfg.run_id = run_id
    try:
        launch = resolve_launch(cfg, visible_cuda_devices(cfg))
        validate_run(cfg, launch)
    except ConfigError as err:
        print(f"membench: {err}", file=sys.stderr)
        summary = invalid_summary(cfg, run_id, sweep_id, err)
        write_summary(run_dir, summary)
        return summary
    print(f"[membench] run {run_id}: workload={cfg.workload.name} on {launch.world_size} "
          f"{launch.device_type} rank(s) ({launch.dist_backend}); results in {run_dir}", flush=True)
    return launch_run(cfg, launch, run_dir, run_id, sweep_id=sweep_id, echo=echo)


def record_in_sweep(sweep_dir: Path, summary: RunSummary, overrides: List[str]) -> None:
    """sweep.json lists every point so far; rewritten atomically after each point, under a lock because
    launchers like submitit finish points in parallel processes."""
    import fcntl

    index_path = sweep_dir / "sweep.json"
    with open(sweep_dir / ".sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = read_json(index_path) if index_path.exists() else {"sweep_id": sweep_dir.name, "runs": []}
        index["runs"].append({"run_id": summary.run_id, "status": summary.status, "overrides": overrides,
                              "dir": summary.run_id.split("/")[-1], "error": summary.error})
        index["runs"].sort(key=lambda run: int(run["dir"]) if run["dir"].isdigit() else run["dir"])
        atomic_write_json(index_path, index)


@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    cfg = to_run_config(dict_cfg)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        sweep_id, run_id = sweep_dir.name, f"{sweep_dir.name}/{run_dir.name}"
    else:
        sweep_dir, sweep_id, run_id = None, None, run_dir.name
    summary = execute_run(cfg, run_dir, run_id, sweep_id)
    STATUSES.append((run_id, summary.status, run_dir))
    if sweep_dir is not None:
        record_in_sweep(sweep_dir, summary, list(hydra_cfg.overrides.task))
    print_run_summary(summary, run_dir)


def print_sweep_table() -> None:
    print_sweep(STATUSES)
