"""`record.cpu_mode=memtracker`: PyTorch's own `MemTracker` counts instead of membench's tracker.

A cross-check of the exact CPU accounting (tests/test_memory_regression.py): the same worker, model,
batches and step order, with `torch.distributed._tools.mem_tracker.MemTracker` counting live storages.
MemTracker applies every free when its weakref callback runs, on whatever thread drops the storage, so
a gloo thread that releases a collective's buffer late would move its numbers from run to run; as under
membench's tracker, each collective is completed where it is launched (`CollectiveSettler`, a dispatch mode
entered above MemTracker's: it sees the op after MemTracker has counted its outputs), after which only the
training thread frees. It has no categories of membench's: the breakdown is all `other`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Optional

import threading

import torch
from torch.utils._pytree import tree_iter

from bench.accounting.collectives import complete_collectives
from bench.accounting.dispatch_mode import DispatchMode
from bench.results.schema import complete_breakdown
from bench.run.memory.recorder import MemoryRecorder, PhaseSample, TrackingMixin

TOTAL_KEY = "Total"  # MemTracker's per-device total in its snapshots


def restart_peak(tracker, device: torch.device, live_bytes: int) -> None:
    """Start MemTracker's running peak for `device` over from `live_bytes` (it has no public reset: the one
    place its private peak fields are touched)."""
    tracker._peak_mem[device] = live_bytes
    snapshot = tracker.get_tracker_snapshot("current").get(device, {TOTAL_KEY: 0})
    tracker._peak_mem_snap[device] = snapshot


class CollectiveSettler(DispatchMode):
    """Completes each c10d op launched on this thread where it is launched (bench.accounting.collectives),
    counting nothing; `unsettled` counts those whose gloo threads were not seen to let go."""

    def __init__(self):
        super().__init__()
        self.unsettled = 0
        self._owner_thread = threading.get_ident()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d" and threading.get_ident() == self._owner_thread:
            self.unsettled += not complete_collectives(tree_iter(out))
        return out


class MemTrackerRecorder(TrackingMixin, MemoryRecorder):
    name = "memtracker"

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int):
        from torch.distributed._tools.mem_tracker import MemTracker

        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps)
        self.tracker = MemTracker()  # a dispatch mode too: TrackingMixin enters and leaves it
        self._settler = CollectiveSettler()
        self._stats_step = None

    def start(self) -> None:
        super().start()
        self._settler.__enter__()  # entered last, so it sees each op first and completes it after MemTracker

    def stop(self) -> None:
        if self._active:
            self._settler.__exit__(None, None, None)
        super().stop()

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
