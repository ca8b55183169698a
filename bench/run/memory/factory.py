"""Pick the recorder backend for a rank's device."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from bench.run.memory.cpu import CpuExactRecorder
from bench.run.memory.recorder import MemoryRecorder, StepTimeRecorder


def cuda_capacity_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).total_memory


def make_recorder(cfg, launch, rank: int, device: torch.device, timeline_path: Optional[Path],
                  run_dir: Path) -> MemoryRecorder:
    warmup = cfg.workload.warmup_steps
    if not cfg.record.enabled:
        return StepTimeRecorder(rank, device, launch.capacity_bytes, timeline_path, warmup)
    if device.type == "cuda":
        from bench.run.memory.cuda import CudaRecorder

        return CudaRecorder(rank, device, launch.capacity_bytes or cuda_capacity_bytes(device), timeline_path,
                            warmup, nvml_interval_s=cfg.record.nvml_interval_ms / 1000,
                            snapshot_dir=run_dir if cfg.record.snapshot else None,
                            snapshot_max_entries=cfg.record.snapshot_max_entries)
    return CpuExactRecorder(rank, device, launch.capacity_bytes, timeline_path, warmup)
