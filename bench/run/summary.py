"""The one builder of a run's summary header (who, what, where, how it ended), for every kind of run."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Dict, Optional

from bench.results.environment import environment_versions
from bench.results.schema import RunSummary, Status, exit_code
from bench.run.config import RunConfig, config_hash


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def summary_for(cfg: RunConfig, *, run_id: str, status: str, world_size: int, device_type: str,
                device_name: str = "", started_at: Optional[str] = None, wall_s: float = 0.0,
                error: Optional[str] = None, sweep_id: Optional[str] = None,
                extra_versions: Optional[Dict[str, str]] = None, **fields) -> RunSummary:
    """A RunSummary of `cfg`'s run: mode, workload, hardware, backend, config hash and library versions
    from the config and this environment, the exit code from the status; `fields` fill in the rest
    (per_rank, job, estimate, ...)."""
    return RunSummary(
        run_id=run_id, status=Status(status).value, mode=cfg.mode, workload=cfg.workload.name,
        hardware=cfg.hardware.name, world_size=world_size, device_type=device_type, device_name=device_name,
        model_backend=cfg.model.backend, config_hash=config_hash(cfg),
        versions={**environment_versions(), **(extra_versions or {})},
        started_at=started_at or now_iso(), wall_s=wall_s, exit_code=exit_code(status), error=error,
        sweep_id=sweep_id, **fields)
