"""Results schema: what a run records (`summary.json`, `rank<R>.json`), its statuses and their exit codes.

Every rank's breakdown has the categories below and adds up to its `peak_bytes` (`complete_breakdown`).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 2
# what load_summary still reads: 1 lacks the allocator, CUDA and rank-percentile fields (they read as None)
READABLE_SCHEMA_VERSIONS = (1, 2)


class Status(str, Enum):
    """How a run ended (a str, so JSON and comparisons with plain strings keep working)."""
    OK = "ok"
    OOM = "oom"
    FAILED = "failed"
    TIMEOUT = "timeout"
    INVALID = "invalid"


# Process exit codes: one table so the launcher, CLI and docs agree
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_OOM = 3
EXIT_TIMEOUT = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

STATUS_EXIT_CODE = {Status.OK: EXIT_OK, Status.FAILED: EXIT_FAILED, Status.INVALID: EXIT_INVALID,
                    Status.OOM: EXIT_OOM, Status.TIMEOUT: EXIT_TIMEOUT}
# When a sweep mixes outcomes, the process exits with the most severe one.
SEVERITY = (Status.OK, Status.OOM, Status.TIMEOUT, Status.FAILED, Status.INVALID)


def worst_status(statuses) -> str:
    statuses = [Status(s) for s in statuses]
    return max(statuses, key=SEVERITY.index).value if statuses else Status.OK.value


def exit_code(status: str) -> int:
    return STATUS_EXIT_CODE[Status(status)]


# Device types a run records: its ranks' device, or a GPU preset simulated on CPU (hardware.simulate)
DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_SIMULATED = "cpu", "cuda", "cuda_simulated"


def kernel_device(device_type: str) -> str:
    """Where the ranks' kernels run: a simulated GPU trains on the CPU."""
    return DEVICE_CUDA if device_type == DEVICE_CUDA else DEVICE_CPU


def has_cuda_allocator(device_type: str) -> bool:
    """Is memory counted as PyTorch's CUDA caching allocator holds it (real, or modelled)?"""
    return device_type in (DEVICE_CUDA, DEVICE_CUDA_SIMULATED)


# Breakdown categories; at a rank's peak they add up to its `peak_bytes`.
IN_FLIGHT = "inputs_in_flight"  # batches a train pipeline holds beyond the one being trained (pipeline=)
CATEGORIES = (
    "embedding_weights",
    "embedding_optimizer",
    # the HBM cache of UVM-caching tables (fused_uvm_caching: fbgemm's lxu_cache_weights) and the cache's
    # bookkeeping (its index map, slot states, LRU/LFU state, locking counters)
    "embedding_cache",
    "embedding_cache_state",
    # gradients of tables that are not fused into the optimizer (data-parallel tables, native backend)
    "embedding_grads",
    "dense_params",
    "dense_grads",
    "dense_optimizer",
    "activations",
    "comm_buffers",
    IN_FLIGHT,  # with their distributed KJTs
    "allocator_overhead",
    "non_torch",
    "other",
)



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
    # CUDA: the caching allocator's counters (num_alloc_retries, num_ooms: over the run;
    # inactive_split_bytes and peak_inactive_split_bytes: in the peak phase, i.e. fragmentation) and the
    # bytes of tables in managed (UVM) memory, which the allocator does not hold
    allocator: Optional[Dict[str, int]] = None
    # CUDA: what NVML saw of the whole device (v2 `used`, the driver's own reservation), beside the
    # reading of this process that `peak_device_used_bytes` holds; whether the driver reported the process
    nvml: Optional[Dict[str, Any]] = None


@dataclass
class JobStats:
    utilization_min: float = 0.0
    utilization_mean: float = 0.0
    utilization_max: float = 0.0
    imbalance: float = 0.0
    steps: int = 0
    step_time_ms_p50: Optional[float] = None
    samples_per_s: Optional[float] = None
    # rank peaks across the ranks that finished (linear interpolation, as numpy.percentile)
    peak_bytes_p10: Optional[float] = None
    peak_bytes_p50: Optional[float] = None
    peak_bytes_p90: Optional[float] = None


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
    # CUDA runs: the allocator configuration the ranks ran with (PYTORCH_CUDA_ALLOC_CONF, parsed)
    allocator: Optional[Dict[str, Any]] = None
    # emulate.*: the one rank measured of a world_size-rank job, and how its peers were answered
    emulated: Optional[Dict[str, Any]] = None
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
        peak_bytes_p10=percentile(peaks, 10), peak_bytes_p50=percentile(peaks, 50),
        peak_bytes_p90=percentile(peaks, 90),
    )


def percentile(values: List[float], q: float) -> Optional[float]:
    """The q-th percentile with linear interpolation between closest ranks (numpy.percentile's default)."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def complete_breakdown(peak_bytes: int, parts: Dict[str, int]) -> Dict[str, int]:
    """Every category present; what the parts do not explain goes to `other`, so the sum is the peak."""
    breakdown = {category: int(parts.get(category, 0)) for category in CATEGORIES if category != "other"}
    breakdown["other"] = peak_bytes - sum(breakdown.values())
    return breakdown
