"""CPU backend: exact live-tensor bytes (LiveTensorTracker) with emulated capacity, plus process RSS."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

import psutil
import torch

from bench.accounting.live_tensors import LiveTensorTracker
from bench.results.schema import complete_breakdown
from bench.run.memory.recorder import MemoryRecorder, PhaseSample, TaggingMixin, TrackingMixin, fold_in_flight


class CpuExactRecorder(TaggingMixin, TrackingMixin, MemoryRecorder):
    name = "cpu_exact"
    attributes_allocations = True

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int):
        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps)
        self.tracker = LiveTensorTracker(device, capacity_bytes, rank, on_new_peak=self._on_new_peak)
        self._process = psutil.Process()
        self._segment_breakdown: Dict[str, Dict[str, int]] = {}

    def _on_new_peak(self) -> None:
        if self._new_segment_peak(self.tracker.live_bytes):
            self._segment_breakdown[self._segment] = fold_in_flight(self.tracker.by_category)

    def _reset_segment_peak(self) -> None:
        # A segment's peak is at least what is live when it starts (with the breakdown of then).
        self.tracker.reset_peak()
        self.segment_peak_at.pop(self._segment, None)
        self._on_new_peak()

    def _begin_phase(self, category: str) -> None:
        self.tracker.category = category
        self.tracker.reset_phase_peak()

    def _sample(self) -> PhaseSample:
        self.tracker.flush_deferred()
        return PhaseSample(
            in_use_bytes=self.tracker.live_bytes,
            phase_peak_bytes=self.tracker.phase_peak_bytes,
            reserved_bytes=None,
            device_used_bytes=self._process.memory_info().rss,
        )

    def attribute(self, ownership: Dict[str, List[torch.Tensor]]) -> None:
        for category, tensors in ownership.items():
            self.tracker.track_tensors(tensors, category)

    def failure_stats(self) -> Dict[str, int]:
        return {"live_bytes": self.tracker.live_bytes, "capacity_bytes": self.capacity_bytes,
                **{f"live.{k}": v for k, v in fold_in_flight(self.tracker.by_category).items()}}

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        return complete_breakdown(peak_bytes, self._segment_breakdown.get(segment, {}))
