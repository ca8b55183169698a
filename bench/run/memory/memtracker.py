"""`record.cpu_mode=memtracker`: PyTorch's own `MemTracker` counts instead of membench's tracker.

A cross-check of the exact CPU accounting (tests/test_memory_regression.py): the same worker, model,
batches and step order, with `torch.distributed._tools.mem_tracker.MemTracker` counting live storages.
MemTracker applies every free when its weakref callback runs, on whatever thread drops the storage, so
a gloo thread that releases a collective's buffer late moves its numbers in some runs: it is a
reference, not baseline material. It has no categories of membench's: the breakdown is all `other`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import torch

from bench.results.schema import complete_breakdown
from bench.run.memory.recorder import MemoryRecorder, PhaseSample, TrackingMixin

TOTAL_KEY = "Total"  # MemTracker's per-device total in its snapshots


def restart_peak(tracker, device: torch.device, live_bytes: int) -> None:
    """Start MemTracker's running peak for `device` over from `live_bytes` (it has no public reset: the one
    place its private peak fields are touched)."""
    tracker._peak_mem[device] = live_bytes
    snapshot = tracker.get_tracker_snapshot("current").get(device, {TOTAL_KEY: 0})
    tracker._peak_mem_snap[device] = snapshot


class MemTrackerRecorder(TrackingMixin, MemoryRecorder):
    name = "memtracker"

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int):
        from torch.distributed._tools.mem_tracker import MemTracker

        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps)
        self.tracker = MemTracker()  # a dispatch mode too: TrackingMixin enters and leaves it
        self._stats_step = None

    def _freeze(self) -> None:
        pass  # MemTracker stops counting when its mode is left

    def _snapshot_bytes(self, which: str) -> int:
        return self.tracker.get_tracker_snapshot(which).get(self.device, {}).get(TOTAL_KEY, 0)

    def _live_bytes(self) -> int:
        return self._snapshot_bytes("current")

    def _begin_phase(self, category: str) -> None:
        if self.step != self._stats_step:
            # MemTracker's module statistics must be cleared once per iteration (else it raises in the next)
            self.tracker.reset_mod_stats()
            self._stats_step = self.step
        restart_peak(self.tracker, self.device, self._live_bytes())

    def _reset_segment_peak(self) -> None:
        self.segment_peak_at.pop(self._segment, None)
        self._new_segment_peak(self._live_bytes())

    def _sample(self) -> PhaseSample:
        live = self._live_bytes()
        phase_peak = max(self._snapshot_bytes("peak"), live)
        self._new_segment_peak(phase_peak)
        return PhaseSample(in_use_bytes=live, phase_peak_bytes=phase_peak, reserved_bytes=None,
                           device_used_bytes=None)

    def failure_stats(self) -> Dict[str, int]:
        return {"live_bytes": self._live_bytes(), "capacity_bytes": self.capacity_bytes}

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        return complete_breakdown(peak_bytes, {})
