"""`membench run`: the task of one Hydra job (a run, or one point of a sweep): execute, index, print."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from bench.apps.console import print_run_summary
from bench.results.store import record_in_sweep
from bench.run.config import to_run_config
from bench.run.execute import execute_run


@dataclass(frozen=True)
class JobOutcome:
    """How one Hydra job ended, returned to the CLI (which turns the worst status into its exit code and
    shows sweep progress with the peak and overrides)."""
    run_id: str
    status: str
    run_dir: Path
    peak_bytes: Optional[int] = None  # the largest rank peak (measured, or estimated in plan mode)
    overrides: Tuple[str, ...] = ()  # the job's Hydra overrides (the CLI fills them in)


def max_peak(summary) -> Optional[int]:
    return max((rank.peak_bytes for rank in summary.per_rank), default=None)


def run_job(dict_cfg: DictConfig) -> JobOutcome:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    cfg = to_run_config(dict_cfg)
    if hydra_cfg.mode == RunMode.MULTIRUN:
        sweep_dir = Path(hydra_cfg.sweep.dir)
        sweep_id, run_id = sweep_dir.name, f"{sweep_dir.name}/{run_dir.name}"
    else:
        sweep_dir, sweep_id, run_id = None, None, run_dir.name
    summary = execute_run(cfg, run_dir, run_id, sweep_id)
    if sweep_dir is not None:
        record_in_sweep(sweep_dir, summary, list(hydra_cfg.overrides.task))
    print_run_summary(summary, run_dir)
    return JobOutcome(run_id, summary.status, run_dir, max_peak(summary))
