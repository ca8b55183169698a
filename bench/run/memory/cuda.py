"""CUDA backend: caching-allocator stats per phase, NVML device memory, optional allocator snapshots.

Every CUDA or NVML call goes through `cuda_stats`, `nvml` and `snapshot`, whose functions are passed
in, so the logic here is tested with fakes on CPU and validated for real by scripts/gpu_check.sh.
"""
from __future__ import annotations

import sys
import weakref
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from bench.run.memory import snapshot as snapshot_api
from bench.run.memory.cuda_stats import CudaAllocatorStats, read_allocator_stats, reset_peak
from bench.run.memory.nvml import NvmlSampler, nvml_device_index
from bench.results.schema import IN_FLIGHT, complete_breakdown
from bench.run.memory.recorder import MemoryRecorder, PhaseSample, unique_storage_bytes


def is_uvm_tensor(tensor: torch.Tensor) -> bool:
    """fbgemm's test for a tensor in CUDA managed memory (`torch.ops.fbgemm.is_uvm_tensor`), looked up at
    each call (fbgemm registers it when the torchrec backend imports it); without fbgemm there are no UVM
    tables."""
    try:
        op = torch.ops.fbgemm.is_uvm_tensor
    except (AttributeError, RuntimeError):
        return False
    return bool(op(tensor))


class CudaRecorder(MemoryRecorder):
    name = "cuda"

    def __init__(self, rank: int, device: torch.device, capacity_bytes: int,
                 timeline_path: Optional[Path], warmup_steps: int, *,
                 nvml_interval_s: float = 0.1, snapshot_dir: Optional[Path] = None,
                 snapshot_max_entries: int = 100_000,
                 read_stats: Callable[[torch.device], CudaAllocatorStats] = read_allocator_stats,
                 reset_peaks: Callable[[torch.device], None] = reset_peak,
                 sampler: Optional[NvmlSampler] = None, snapshots=snapshot_api,
                 synchronize: Optional[Callable[[torch.device], None]] = None,
                 is_uvm: Optional[Callable[[torch.Tensor], bool]] = None, capped: bool = False):
        """`capped`: the allocator runs under hardware.memory_fraction, and `capacity_bytes` is that cap."""
        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps)
        self.capped = capped
        self._read_stats, self._reset_peaks = read_stats, reset_peaks
        self._synchronize = synchronize or torch.cuda.synchronize
        # tensors in CUDA managed memory (fbgemm's UVM-cached tables): on the device, not in the allocator
        self._is_uvm = is_uvm or is_uvm_tensor
        self.uvm_bytes = 0
        self._snapshots, self.snapshot_dir = snapshots, snapshot_dir
        self.nvml_failures = 0
        self.snapshot_paths: List[str] = []
        self._failed = False
        self._static_bytes: Dict[str, int] = {}
        # the attributed tensors, weakly: a gradient zero_grad(set_to_none) drops leaves its category
        self._owned: Dict[str, List[weakref.ref]] = {}
        self._segment_static: Dict[str, Dict[str, int]] = {}  # the static bytes as of each segment's top
        self._phase_stats = CudaAllocatorStats()
        # per segment: (peak allocated, peak reserved, device used) of the phase with the top peak, the
        # key that phase won with, and the segment's highest peak allocated / reserved over all phases
        self._segment_stats: Dict[str, tuple] = {}
        self._segment_key: Dict[str, tuple] = {}
        self._segment_max: Dict[str, tuple] = {}
        self._segment_fragmentation: Dict[str, tuple] = {}
        self._segment_in_flight: Dict[str, int] = {}
        self.in_flight_probe: Callable[[], int] = lambda: 0
        self.sampler = sampler
        try:
            if self.sampler is None:  # torch's NVML mapping raises under MIG UUIDs or without libnvidia-ml
                self.sampler = NvmlSampler(nvml_device_index(device.index or 0), interval_s=nvml_interval_s)
            self.sampler.start()
        except (RuntimeError, OSError, ValueError) as err:  # no NVML here: allocator stats still work (N9)
            print(f"[rank {rank}] {err}; device-used columns will be empty", file=sys.stderr)
            self.sampler = None
        if snapshot_dir is not None:
            self._snapshots.start_history(snapshot_max_entries)

    def _nvml_peak(self, stats: CudaAllocatorStats) -> Optional[int]:
        """This phase's peak NVML reading: the highest background sample in the phase, and at least the
        allocator's peak reserved plus the memory outside it now (non-torch memory, such as the CUDA
        context and NCCL buffers, barely changes within a phase; a sample can miss the moment of the peak).
        None without NVML; a failed reading skips this phase's NVML column, not the rank."""
        if self.sampler is None:
            return None
        try:
            now = self.sampler.sample_now().used_bytes
        except Exception as exc:
            self.nvml_failures += 1
            print(f"[rank {self.rank}] NVML reading failed ({type(exc).__name__}: {exc}); phase without "
                  f"device-used", file=sys.stderr)
            self.sampler.take_window_peak()
            return None
        window = self.sampler.take_window_peak() or now
        outside_allocator = max(0, now - stats.reserved_bytes)
        return max(window, now, stats.peak_reserved_bytes + outside_allocator)

    def _reset_segment_peak(self) -> None:
        self._segment_static.pop(self._segment, None)
        self.segment_peaks[self._segment] = 0
        self.segment_peak_at.pop(self._segment, None)
        self._segment_key.pop(self._segment, None)
        self._segment_max.pop(self._segment, None)

    def _new_segment_top(self, key: tuple, peak_measure: int) -> bool:
        """Is this phase the segment's top so far? Ranked by the allocator's own peaks (reserved, then
        allocated), NVML's reading last: in steady state the reserved pool is flat from phase to phase and
        the phase where the tensors peak must still win over the segment's first phase (audit #3); and an
        NVML bump that is not the allocator's (a lazily loaded kernel module, NCCL connecting a peer, another
        tenant under the device-wide fallback) must not make its phase the peak (N21). The phase's
        `peak_measure` (NVML, else reserved) is what the segment's peak reports."""
        segment = self._segment
        if segment in self.segment_peak_at and key <= self._segment_key[segment]:
            return False
        self._segment_key[segment] = key
        self.segment_peaks[segment] = peak_measure
        self.segment_peak_at[segment] = (self.step, self.phase_name)
        return True

    def _begin_phase(self, category: str) -> None:
        self._reset_peaks(self.device)
        if self.sampler is not None:
            self.sampler.take_window_peak()  # this phase's window starts now

    def _sample(self) -> PhaseSample:
        stats = self._read_stats(self.device)
        self._phase_stats = stats
        device_used = self._nvml_peak(stats)
        # the breakdown adds up to NVML's device used when there is one, else to reserved
        peak_measure = device_used if device_used is not None else stats.peak_reserved_bytes
        key = (stats.peak_reserved_bytes, stats.peak_allocated_bytes, peak_measure)
        if self._new_segment_top(key, peak_measure):
            self._refresh_static()
            self._segment_static[self._segment] = dict(self._static_bytes)
            self._segment_stats[self._segment] = (stats.peak_allocated_bytes, stats.peak_reserved_bytes,
                                                  device_used)
            self._segment_fragmentation[self._segment] = (stats.inactive_split_bytes,
                                                          stats.peak_inactive_split_bytes)
            self._segment_in_flight[self._segment] = self.in_flight_bytes()
        allocated, reserved = self._segment_max.get(self._segment, (0, 0))
        self._segment_max[self._segment] = (max(allocated, stats.peak_allocated_bytes),
                                            max(reserved, stats.peak_reserved_bytes))
        return PhaseSample(in_use_bytes=stats.allocated_bytes, phase_peak_bytes=stats.peak_allocated_bytes,
                           reserved_bytes=stats.reserved_bytes, device_used_bytes=device_used)

    def synchronize(self) -> None:
        self._synchronize(self.device)

    def allocator_stats(self) -> CudaAllocatorStats:
        """The allocator's statistics now (gpu_check compares them with NVML's raw reading)."""
        return self._read_stats(self.device)

    def in_flight_bytes(self) -> int:
        """A train pipeline's batches held beyond the one being trained, on this device, at the end of the phase
        that set the segment's top (the pipeline runner points `in_flight_probe` at them; their distributed
        KJTs are not seen here)."""
        return self.in_flight_probe()

    def attribute(self, ownership: Dict[str, List[torch.Tensor]]) -> None:
        """Static memory by owner, counting only what the caching allocator holds: UVM tables live in
        managed memory, which its statistics leave out (counting them drove `other` negative)."""
        uvm = {}
        for category, tensors in ownership.items():
            on_device = [t for t in tensors if t.device == self.device]
            in_uvm = [t for t in on_device if self._is_uvm(t)]
            self._owned[category] = [weakref.ref(t) for t in on_device if not self._is_uvm(t)]
            uvm.update((t.untyped_storage()._cdata, t.untyped_storage().nbytes()) for t in in_uvm)
        self._refresh_static()
        self.uvm_bytes = sum(uvm.values())

    def _refresh_static(self) -> None:
        """Static bytes by owner from the attributed tensors still alive: the native backend re-attributes
        embedding_grads each backward and zero_grad frees them before the next forward, so a forward or
        input peak counted freed gradients and `other` went negative (audit N22)."""
        for category, refs in self._owned.items():
            alive = (ref() for ref in refs)
            self._static_bytes[category] = unique_storage_bytes(t for t in alive if t is not None)

    def failure_stats(self) -> Dict[str, int]:
        """The allocator's counters at a failure; the snapshot of it is written by `close`, once the rank's
        result is safe on disk (a dump can take long)."""
        self._failed = True
        return self._read_stats(self.device).to_dict()

    def _breakdown(self, segment: str, peak_bytes: int) -> Dict[str, int]:
        allocated, reserved, device_used = self._segment_stats.get(segment, (0, 0, None))
        static_bytes = self._segment_static.get(segment, self._static_bytes)
        static = sum(static_bytes.values())
        parts = dict(static_bytes)
        parts[IN_FLIGHT] = self._segment_in_flight.get(segment, 0)
        parts["activations"] = max(0, allocated - static - parts[IN_FLIGHT])
        parts["allocator_overhead"] = reserved - allocated
        if device_used is not None:
            parts["non_torch"] = device_used - reserved
        return complete_breakdown(peak_bytes, parts)

    def _extra_peaks(self, segment: str) -> Dict[str, Optional[int]]:
        allocated, reserved = self._segment_max.get(segment, (0, 0))
        inactive_split, peak_inactive_split = self._segment_fragmentation.get(segment, (0, 0))
        counters = self._phase_stats  # cumulative: the latest reading holds the whole run's
        return {"peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved,
                "allocator": {"num_alloc_retries": counters.num_alloc_retries, "num_ooms": counters.num_ooms,
                              "inactive_split_bytes": inactive_split,
                              "peak_inactive_split_bytes": peak_inactive_split, "uvm_bytes": self.uvm_bytes},
                "nvml": self._nvml_summary()}

    def _capacity_use(self, segment: str, peak_bytes: int) -> int:
        """Under a memory_fraction cap, the peak reserved: the cap limits the caching allocator only, while the
        peak (NVML's process memory) also holds the CUDA context and NCCL's buffers, which it does not cap
        (an 8 MiB cap against a 500 MiB process read utilization 62.5; audit N4)."""
        if self.capped:
            return self._segment_max.get(segment, (0, 0))[1]
        return peak_bytes

    def _nvml_summary(self) -> Optional[Dict[str, object]]:
        if self.sampler is None:
            return None
        latest = self.sampler.latest() if hasattr(self.sampler, "latest") else None
        return {"device_used_peak_bytes": getattr(self.sampler, "peak_device_used_bytes", None),
                "driver_reserved_bytes": latest.device_reserved_bytes if latest else None,
                "process_reported": bool(latest and latest.process_used_bytes is not None),
                "failed_readings": self.nvml_failures + getattr(self.sampler, "failed_samples", 0)}

    def close(self) -> None:
        if self.snapshot_dir is not None:
            name = f"{'oom' if self._failed else 'snapshot'}_rank{self.rank}.pickle"
            self.snapshot_paths.append(self._snapshots.dump_snapshot(Path(self.snapshot_dir) / name))
            self._snapshots.stop_history()
        if self.sampler is not None:
            self.sampler.stop()
        super().close()
