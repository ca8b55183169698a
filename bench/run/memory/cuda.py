"""CUDA backend: caching-allocator stats per phase, NVML device memory, optional allocator snapshots.

Every CUDA or NVML call goes through `cuda_stats`, `nvml` and `snapshot`, whose functions are passed
in, so the logic here is tested with fakes on CPU and validated for real by scripts/gpu_check.sh.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from bench.run.memory import snapshot as snapshot_api
from bench.run.memory.cuda_stats import CudaAllocatorStats, read_allocator_stats, reset_peak
from bench.run.memory.nvml import NvmlSampler
from bench.results.schema import complete_breakdown
from bench.run.memory.recorder import MemoryRecorder, PhaseSample, unique_storage_bytes


class CudaRecorder(MemoryRecorder):
    name = "cuda"

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int, *,
                 nvml_interval_s: float = 0.1, snapshot_dir: Optional[Path] = None,
                 snapshot_max_entries: int = 100_000,
                 read_stats: Callable[[torch.device], CudaAllocatorStats] = read_allocator_stats,
                 reset_peaks: Callable[[torch.device], None] = reset_peak,
                 sampler: Optional[NvmlSampler] = None, snapshots=snapshot_api):
        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps)
        self._read_stats, self._reset_peaks = read_stats, reset_peaks
        self._snapshots, self.snapshot_dir = snapshots, snapshot_dir
        self.snapshot_paths: List[str] = []
        self._static_bytes: Dict[str, int] = {}
        self._phase_stats = CudaAllocatorStats()
        # per segment: (peak allocated, peak reserved, device used) of the phase with the top peak
        self._segment_stats: Dict[str, tuple] = {}
        self.sampler = sampler
        if self.sampler is None:
            self.sampler = NvmlSampler(device.index or 0, interval_s=nvml_interval_s)
        try:
            self.sampler.start()
        except RuntimeError as err:  # no NVML (e.g. some containers): allocator stats still work
            print(f"[rank {rank}] {err}; device-used columns will be empty", file=sys.stderr)
            self.sampler = None
        if snapshot_dir is not None:
            self._snapshots.start_history(snapshot_max_entries)

    def _device_used(self) -> Optional[int]:
        return self.sampler.sample_now().device_used_bytes if self.sampler else None

    def _reset_segment_peak(self) -> None:
        self.segment_peaks[self._segment] = 0
        self.segment_peak_at.pop(self._segment, None)

    def _begin_phase(self, category: str) -> None:
        self._reset_peaks(self.device)

    def _sample(self) -> PhaseSample:
        stats = self._read_stats(self.device)
        self._phase_stats = stats
        device_used = self._device_used()
        # the breakdown adds up to NVML's device used when there is one, else to reserved
        peak_measure = device_used if device_used is not None else stats.peak_reserved_bytes
        if self._new_segment_peak(peak_measure):
            self._segment_stats[self._segment] = (stats.peak_allocated_bytes, stats.peak_reserved_bytes,
                                                  device_used)
        return PhaseSample(in_use_bytes=stats.allocated_bytes, phase_peak_bytes=stats.peak_allocated_bytes,
                           reserved_bytes=stats.reserved_bytes, device_used_bytes=device_used)

    def attribute(self, ownership: Dict[str, List[torch.Tensor]]) -> None:
        for category, tensors in ownership.items():
            self._static_bytes[category] = unique_storage_bytes(t for t in tensors if t.device == self.device)

    def failure_stats(self) -> Dict[str, int]:
        stats = self._read_stats(self.device).to_dict()
        if self.snapshot_dir is not None:
            path = self._snapshots.dump_snapshot(Path(self.snapshot_dir) / f"oom_rank{self.rank}.pickle")
            self.snapshot_paths.append(path)
        return stats

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        allocated, reserved, device_used = self._segment_stats.get(segment, (0, 0, None))
        static = sum(self._static_bytes.values())
        parts = dict(self._static_bytes)
        parts["activations"] = max(0, allocated - static)
        parts["allocator_overhead"] = reserved - allocated
        if device_used is not None:
            parts["non_torch"] = device_used - reserved
        return complete_breakdown(peak_bytes, parts)

    def _extra_peaks(self, segment: str) -> Dict[str, Optional[int]]:
        allocated, reserved, _ = self._segment_stats.get(segment, (0, 0, None))
        return {"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved}

    def close(self) -> None:
        if self.snapshot_dir is not None:
            self.snapshot_paths.append(
                self._snapshots.dump_snapshot(Path(self.snapshot_dir) / f"snapshot_rank{self.rank}.pickle"))
            self._snapshots.stop_history()
        if self.sampler is not None:
            self.sampler.stop()
        super().close()
