"""Pick the recorder backend for a rank's device."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from bench.results.schema import DEVICE_CUDA_SIMULATED
from workloads.units import GIB
from bench.run.launchspec import capacity_bytes
from bench.run.memory.cpu import CpuExactRecorder
from bench.run.memory.recorder import MemoryRecorder, StepTimeRecorder


def rank_capacity_bytes(cfg, launch, device: torch.device) -> int:
    """This rank's memory: on CUDA its own device's total (read here, where the context exists) under the
    allocator cap (hardware.memory_fraction); elsewhere what the launch resolved."""
    if device.type == "cuda":
        return capacity_bytes(cfg, "cuda", torch.cuda.get_device_properties(device).total_memory)
    return launch.capacity_bytes


def make_recorder(cfg, launch, rank: int, device: torch.device, timeline_path: Optional[Path],
                  run_dir: Path) -> MemoryRecorder:
    warmup = cfg.workload.warmup_steps
    capacity = rank_capacity_bytes(cfg, launch, device)
    if not cfg.record.enabled:
        return StepTimeRecorder(rank, device, capacity, timeline_path, warmup)
    if launch.device_type == DEVICE_CUDA_SIMULATED:
        from bench.accounting.allocator_config import allocator_settings_for
        from bench.run.launchspec import simulated_allocator_limits
        from bench.run.memory.simulated import SimulatedCudaRecorder

        device_free, allowed = simulated_allocator_limits(cfg)
        return SimulatedCudaRecorder(rank, capacity, int(cfg.hardware.capacity_gib * GIB), device_free, allowed,
                                     allocator_settings_for(cfg.allocator, DEVICE_CUDA_SIMULATED), timeline_path, warmup,
                                     snapshot_dir=run_dir if cfg.record.snapshot else None,
                                     snapshot_max_entries=cfg.record.snapshot_max_entries)
    if device.type == "cuda":
        from bench.run.memory.cuda import CudaRecorder

        fraction = cfg.hardware.memory_fraction
        return CudaRecorder(rank, device, capacity, timeline_path, warmup,
                            nvml_interval_s=cfg.record.nvml_interval_ms / 1000,
                            capped=fraction is not None and fraction < 1.0,
                            snapshot_dir=run_dir if cfg.record.snapshot else None,
                            snapshot_max_entries=cfg.record.snapshot_max_entries)
    if cfg.record.cpu_mode == "memtracker":
        from bench.run.memory.memtracker import MemTrackerRecorder

        return MemTrackerRecorder(rank, device, capacity, timeline_path, warmup)
    return CpuExactRecorder(rank, device, capacity, timeline_path, warmup)
