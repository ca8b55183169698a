"""One recorder interface for every backend: phases, timeline rows, segment peaks, rank result.

The worker drives it the same way on CPU and GPU:

    with recorder.phase(-1, "build"): ...            # model build and sharding
    recorder.attribute(ownership)                    # static memory by owner
    for step ...: with recorder.phase(step, "forward"): ...

Peaks are kept per segment (build, warmup, measured steps) so a baseline compares steady state; the
breakdown is taken at the measured peak. Backends supply the numbers (`_sample`, `_breakdown`).
"""
from __future__ import annotations

import csv
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import torch

from bench.results.schema import IN_FLIGHT, RankResult, complete_breakdown

# What memory that first appears during a phase is charged to, unless ownership says otherwise.
PHASE_CATEGORY = {
    "build": "other",
    "input": "activations",
    "forward": "activations",
    "backward": "activations",
    # optimizer state is created lazily in the first optimizer step; step temporaries go with it
    "optimizer": "dense_optimizer",
}
# A train pipeline's batches in flight (bench.run.pipelines): while batch `step` waits, what is made for it is
# charged to `inputs_in_flight:<step>:<part>`, folded into `inputs_in_flight` in every breakdown; when its own
# forward starts it becomes what the plain loop would have made of it (IN_FLIGHT_SETTLES).
# part -> its category once the batch is the one being trained. made: what ops made of the batch (as the plain
# loop's input phase counts it); host: the batch's own tensors, wrapped from numpy without an op, which the plain
# loop never counts; dist: its input all-to-all, which the plain loop runs in the forward, in torchrec's comm
# modules
IN_FLIGHT_SETTLES = {"made": "activations", "host": None, "dist": "comm_buffers"}


def in_flight_category(step: int, part: str) -> str:
    return f"{IN_FLIGHT}:{step}:{part}"


def fold_in_flight(by_category: Dict[str, int]) -> Dict[str, int]:
    """Per-batch in-flight categories summed into `inputs_in_flight`."""
    folded: Dict[str, int] = {}
    for category, nbytes in by_category.items():
        key = IN_FLIGHT if category.startswith(IN_FLIGHT + ":") else category
        folded[key] = folded.get(key, 0) + nbytes
    return folded


TIMELINE_FIELDS = ("time_s", "step", "phase", "in_use_bytes", "phase_peak_bytes", "reserved_bytes",
                   "device_used_bytes")


@dataclass
class PhaseSample:
    in_use_bytes: int
    phase_peak_bytes: int
    reserved_bytes: Optional[int]
    device_used_bytes: Optional[int]


class TimelineWriter:
    """CSV rows flushed as they are written, so an OOM or a kill keeps the partial timeline."""

    def __init__(self, path: Optional[Path]):
        self._handle = open(path, "w", newline="") if path else None
        self._writer = csv.writer(self._handle) if self._handle else None
        if self._writer:
            self._writer.writerow(TIMELINE_FIELDS)
            self._handle.flush()

    def write(self, row: List[object]) -> None:
        if self._writer:
            self._writer.writerow(["" if value is None else value for value in row])
            self._handle.flush()

    def close(self) -> None:
        if self._handle:
            self._handle.close()
            self._handle = None


def unique_storage_bytes(tensors) -> int:
    seen = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


class MemoryRecorder:
    name = "base"

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int):
        self.rank = rank
        self.device = device
        self.capacity_bytes = capacity_bytes
        self.warmup_steps = warmup_steps
        self.timeline = TimelineWriter(timeline_path)
        self.step = -1
        self.phase_name = "init"
        self.step_times_s: List[float] = []
        self.segment_peaks: Dict[str, int] = {"build": 0, "warmup": 0, "measured": 0}
        # (step, phase) where each segment's peak happened
        self.segment_peak_at: Dict[str, tuple] = {}
        self.peak_device_used_bytes: Optional[int] = None
        self._segment = ""
        # called at every phase end: the worker points it at the launcher's watchdog heartbeat
        self.heartbeat: Callable[[], None] = lambda: None
        self._t0 = time.perf_counter()
        self._step_started: Optional[float] = None

    # -- backend hooks ---------------------------------------------------------------------------
    def start(self) -> None:
        """Begin counting (the CPU backend enters its dispatch mode on this thread)."""

    def stop(self) -> None:
        """Stop counting; results stay readable."""

    def _begin_phase(self, category: str) -> None:
        """Called at the start of each phase (after segment handling)."""

    def _sample(self) -> PhaseSample:
        raise NotImplementedError

    def _reset_segment_peak(self) -> None:
        raise NotImplementedError

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        raise NotImplementedError

    def _new_segment_peak(self, peak_bytes: int) -> bool:
        """Record `peak_bytes` for the current segment if it is a new high; True when it was."""
        if peak_bytes <= self.segment_peaks.get(self._segment, 0) and self._segment in self.segment_peak_at:
            return False
        self.segment_peaks[self._segment] = peak_bytes
        self.segment_peak_at[self._segment] = (self.step, self.phase_name)
        return True

    def attribute(self, ownership: Dict[str, List[torch.Tensor]]) -> None:
        """Charge the storages of these tensors to their owner's category from now on."""

    # what a recorder that tells categories apart by allocation site overrides (the exact CPU one)
    attributes_allocations = False

    @contextmanager
    def category(self, category: str, pinned: bool = False) -> Iterator[None]:
        """Allocations in this scope count as `category` (recorders that cannot tell: no effect); `pinned`:
        scopes opened inside it do not change that (a batch in flight stays in flight through the comm
        modules its input all-to-all runs in)."""
        yield

    def hold_in_flight(self, step: int, tensors: List[torch.Tensor]) -> None:
        """Batch `step`'s own tensors, now held by a train pipeline ahead of its turn."""

    def settle_in_flight(self, step: int) -> None:
        """Batch `step` is the one being trained now: what was in flight for it is counted as the plain loop
        counts its batch (IN_FLIGHT_SETTLES)."""

    def failure_stats(self) -> Dict[str, int]:
        return {}

    def close(self) -> None:
        self.timeline.close()

    # -- driving ---------------------------------------------------------------------------------
    def _segment_of(self, step: int) -> str:
        if step < 0:
            return "build"
        return "warmup" if step < self.warmup_steps else "measured"

    def synchronize(self) -> None:
        """Wait for the device's queued work, so that a step time measures the step, not its enqueueing
        (the CUDA recorder waits for the GPU; on CPU the work is done when the call returns)."""

    @contextmanager
    def phase(self, step: int, name: str) -> Iterator[None]:
        if step != self.step and step >= 0:
            self.synchronize()
            now = time.perf_counter()
            if self._step_started is not None and self.step >= 0:
                self.step_times_s.append(now - self._step_started)
            self._step_started = now
        self.step, self.phase_name = step, name
        segment = self._segment_of(step)
        if segment != self._segment:
            self._segment = segment
            self._reset_segment_peak()
        self._begin_phase(PHASE_CATEGORY.get(name, "other"))
        yield
        self._end_phase()

    def finish_steps(self, sync: bool = True) -> None:
        if self._step_started is not None:
            if sync:
                self.synchronize()
            self.step_times_s.append(time.perf_counter() - self._step_started)
            self._step_started = None

    def _end_phase(self, progress: bool = True) -> None:
        if progress:
            self.heartbeat()
        sample = self._sample()
        if sample.device_used_bytes is not None:
            self.peak_device_used_bytes = max(self.peak_device_used_bytes or 0, sample.device_used_bytes)
        self.timeline.write([f"{time.perf_counter() - self._t0:.6f}", self.step, self.phase_name,
                             sample.in_use_bytes, sample.phase_peak_bytes, sample.reserved_bytes,
                             sample.device_used_bytes])

    def record_failure_row(self) -> None:
        """A last timeline row for the phase that failed (OOM), with what was live then; not progress, so
        the launcher's watchdog does not count it as such."""
        self._end_phase(progress=False)

    # -- result ----------------------------------------------------------------------------------
    def result(self, status: str) -> RankResult:
        """Steady-state (measured) peak for a finished rank; for a failed one the highest peak seen. A failed
        rank does not wait for its device: a rank ended because a peer died has collectives queued that wait
        for that peer, and a device sync there never returns (no result would be written)."""
        self.finish_steps(sync=status == "ok")
        segment = "measured"
        if status != "ok" or segment not in self.segment_peak_at:
            seen = [name for name in self.segment_peaks if name in self.segment_peak_at] or ["measured"]
            segment = max(seen, key=self.segment_peaks.get)
        peak = self.segment_peaks[segment]
        peak_step, peak_phase = self.segment_peak_at.get(segment, (-1, ""))
        used = self._capacity_use(segment, peak)
        return RankResult(
            rank=self.rank,
            status=status,
            device=str(self.device),
            capacity_bytes=self.capacity_bytes,
            peak_bytes=peak,
            utilization=used / self.capacity_bytes if self.capacity_bytes else 0.0,
            headroom_bytes=self.capacity_bytes - used,
            peak_step=peak_step,
            peak_phase=peak_phase,
            breakdown=self._breakdown(segment, peak),
            build_peak_bytes=self.segment_peaks["build"],
            warmup_peak_bytes=self.segment_peaks["warmup"],
            step_times_s=[round(t, 6) for t in self.step_times_s],
            peak_device_used_bytes=self.peak_device_used_bytes,
            recorder=self.name,
            **self._extra_peaks(segment),
        )

    def _extra_peaks(self, segment: str) -> Dict[str, Optional[int]]:
        return {"peak_allocated_bytes": self.segment_peaks[segment]}

    def _capacity_use(self, segment: str, peak_bytes: int) -> int:
        """What utilization and headroom measure against capacity: the peak, unless a recorder knows better."""
        return peak_bytes


class TrackingMixin:
    """start / stop / close for a recorder whose tracker (`self.tracker`, a dispatch mode) counts what this
    thread allocates between start and stop (the CPU recorder, the simulated CUDA one, MemTracker's)."""
    _active = False

    def start(self) -> None:
        """Enter the dispatch mode on this thread; every storage from now on is counted."""
        self.tracker.__enter__()
        self._active = True

    def stop(self) -> None:
        if self._active:
            self._active = False
            self.tracker.__exit__(None, None, None)
            self._freeze()

    def _freeze(self) -> None:
        """What the tracker does once counting is over (a LiveTensorTracker ignores later frees)."""
        self.tracker.freeze()

    def close(self) -> None:
        self.stop()
        super().close()


class TaggingMixin:
    """Categories by allocation site for a recorder whose tracker is a LiveTensorTracker (`self.tracker`): the
    exact CPU one and the simulated device."""
    _pinned = 0

    @contextmanager
    def category(self, category: str, pinned: bool = False) -> Iterator[None]:
        if self._pinned:
            yield
            return
        previous, self.tracker.category = self.tracker.category, category
        self._pinned += pinned
        try:
            yield
        finally:
            self._pinned -= pinned
            self.tracker.category = previous

    def hold_in_flight(self, step: int, tensors: List[torch.Tensor]) -> None:
        self.tracker.track_new(tensors, in_flight_category(step, "host"))

    def settle_in_flight(self, step: int) -> None:
        for part, category in IN_FLIGHT_SETTLES.items():
            self.tracker.recharge(in_flight_category(step, part), category)

    def in_flight_bytes(self) -> int:
        return fold_in_flight(self.tracker.by_category).get(IN_FLIGHT, 0)


class StepTimeRecorder(MemoryRecorder):
    """`record.enabled=false`: phases and step times only, no memory accounting (the overhead baseline)."""

    name = "none"

    def synchronize(self) -> None:
        """The overhead baseline's step times must be synchronized like the recorder's (else 'off' times
        only the enqueueing on a GPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _sample(self) -> PhaseSample:
        return PhaseSample(in_use_bytes=0, phase_peak_bytes=0, reserved_bytes=None, device_used_bytes=None)

    def _reset_segment_peak(self) -> None:
        pass

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        return complete_breakdown(peak_bytes, {})
