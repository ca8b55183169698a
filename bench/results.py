"""Results schema (summary.json, per-rank files), atomic writes, and loading with clear errors."""
from __future__ import annotations

import json
import os
import statistics
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1
RUN_STATUSES = ("ok", "oom", "failed", "timeout", "invalid")
# Breakdown categories (DESIGN.md); they must add up to `peak_bytes`.
CATEGORIES = (
    "embedding_weights",
    "embedding_optimizer",
    # gradients of tables that are not fused into the optimizer (data-parallel tables, native backend)
    "embedding_grads",
    "dense_params",
    "dense_grads",
    "dense_optimizer",
    "activations",
    "comm_buffers",
    "allocator_overhead",
    "non_torch",
    "other",
)


class ResultsError(ValueError):
    """A results file that cannot be used: one line naming the file and what to do."""


@dataclass
class RankResult:
    rank: int
    status: str  # ok | oom | failed
    device: str
    capacity_bytes: int
    # The measure the breakdown adds up to: live tensor bytes on CPU, NVML device used on GPU
    peak_bytes: int = 0
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: Optional[int] = None
    peak_device_used_bytes: Optional[int] = None
    utilization: float = 0.0
    headroom_bytes: int = 0
    peak_step: int = -1
    peak_phase: str = ""
    breakdown: Dict[str, int] = field(default_factory=dict)
    # Peaks outside the measured steps (model build, warm-up), kept apart so baselines see steady state
    build_peak_bytes: int = 0
    warmup_peak_bytes: int = 0
    step_times_s: List[float] = field(default_factory=list)
    recorder: str = ""
    oom: Optional[Dict[str, Any]] = None
    error: Optional[str] = None


@dataclass
class JobStats:
    utilization_min: float = 0.0
    utilization_mean: float = 0.0
    utilization_max: float = 0.0
    imbalance: float = 0.0
    steps: int = 0
    step_time_ms_p50: Optional[float] = None
    samples_per_s: Optional[float] = None


@dataclass
class RunSummary:
    run_id: str
    status: str
    mode: str
    workload: str
    hardware: str
    world_size: int
    device_type: str
    device_name: str
    model_backend: str
    config_hash: str
    versions: Dict[str, str]
    started_at: str
    wall_s: float
    exit_code: int
    error: Optional[str] = None
    oom_ranks: List[int] = field(default_factory=list)
    per_rank: List[RankResult] = field(default_factory=list)
    job: JobStats = field(default_factory=JobStats)
    sharding_plan: List[Dict[str, Any]] = field(default_factory=list)
    estimate: Optional[Dict[str, Any]] = None
    sweep_id: Optional[str] = None
    schema_version: int = SCHEMA_VERSION


def job_stats(ranks: List[RankResult], batch_size: int, warmup_steps: int) -> JobStats:
    measured = [r for r in ranks if r.status == "ok"]
    if not measured:
        return JobStats()
    utils = [r.utilization for r in measured]
    peaks = [r.peak_bytes for r in measured]
    mean_peak = statistics.fmean(peaks)
    # a step is as slow as its slowest rank
    per_step = [max(times) for times in zip(*(r.step_times_s[warmup_steps:] for r in measured))]
    p50 = statistics.median(per_step) if per_step else None
    return JobStats(
        utilization_min=min(utils),
        utilization_mean=statistics.fmean(utils),
        utilization_max=max(utils),
        imbalance=max(peaks) / mean_peak if mean_peak else 0.0,
        steps=len(per_step),
        step_time_ms_p50=p50 * 1e3 if p50 else None,
        samples_per_s=batch_size * len(measured) / p50 if p50 else None,
    )


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory + rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.json"


def timeline_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"timeline_rank{rank}.csv"


def progress_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f".progress_rank{rank}"


def heartbeat(run_dir: Path, rank: int) -> None:
    """Mark progress for the launcher's watchdog (the file's mtime is what counts)."""
    progress_file(run_dir, rank).touch()


def write_rank_result(run_dir: Path, result: RankResult) -> None:
    atomic_write_json(rank_file(run_dir, result.rank), asdict(result))


def read_json(path: Path) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ResultsError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: not valid JSON ({err}); delete it or re-run the workload") from None


def read_json_object(path: Path) -> Dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, found {type(data).__name__}; re-run the workload")
    return data


def load_rank_result(path: Path) -> RankResult:
    data = read_json_object(path)
    try:
        return RankResult(**data)
    except TypeError as err:
        raise ResultsError(f"{path}: unexpected fields ({err}); re-run the workload") from None


def write_summary(run_dir: Path, summary: RunSummary) -> None:
    atomic_write_json(Path(run_dir) / "summary.json", asdict(summary))


def load_summary(path: Path) -> RunSummary:
    """Load a summary.json (or a run directory); unknown schema versions fail with one line."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    data = read_json_object(path)
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema_version {version!r} is not supported (this membench reads "
                           f"{SCHEMA_VERSION}); re-run the workload with this version")
    try:
        ranks = [RankResult(**rank) for rank in data.pop("per_rank", [])]
        job = JobStats(**data.pop("job", {}))
        return RunSummary(per_rank=ranks, job=job, **data)
    except TypeError as err:
        raise ResultsError(f"{path}: unexpected fields ({err}); re-run the workload") from None


SWEEP_INDEX = "sweep.json"


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_INDEX).is_file()


def read_sweep_index(sweep_dir: Path) -> Dict[str, Any]:
    """A sweep's sweep.json: {"sweep_id", "runs": [{run_id, status, overrides, dir, error}]}, checked."""
    path = Path(sweep_dir) / SWEEP_INDEX
    data = read_json_object(path)
    runs = data.get("runs")
    if not isinstance(runs, list) or not all(isinstance(run, dict) and "dir" in run for run in runs):
        raise ResultsError(f"{path}: `runs` must be a list of points with a `dir`; re-run the sweep")
    return data
