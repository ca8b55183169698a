"""The dry run's stand-ins for every CUDA / NVML / snapshot call, driven by an exact CPU live-tensor count."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from bench.run.memory.cuda_stats import CudaAllocatorStats
from bench.run.memory.nvml import NvmlSample
from workloads.units import MIB


class DryRunCuda:
    """Fake allocator/NVML/snapshot functions driven by an exact CPU live-tensor count."""

    def __init__(self, capacity_bytes: int):
        from bench.accounting.live_tensors import LiveTensorTracker

        self.tracker = LiveTensorTracker(torch.device("cpu"), capacity_bytes, rank=0)
        self.ooms = 0

    def read_stats(self, device) -> CudaAllocatorStats:
        allocated, peak = self.tracker.live_bytes, self.tracker.phase_peak_bytes
        rounded = lambda n: -(-n // (2 * MIB)) * 2 * MIB  # the caching allocator's 2 MiB segments
        return CudaAllocatorStats(allocated_bytes=allocated, peak_allocated_bytes=peak,
                                  reserved_bytes=rounded(allocated), peak_reserved_bytes=rounded(peak),
                                  num_ooms=self.ooms)

    def reset_peaks(self, device) -> None:
        self.tracker.reset_phase_peak()

    def sampler(self) -> "DryRunSampler":
        return DryRunSampler(self)

    # snapshots
    def start_history(self, max_entries: int) -> None:
        pass

    def stop_history(self) -> None:
        pass

    def dump_snapshot(self, path) -> str:
        Path(path).write_bytes(b"dry-run snapshot")
        return str(path)


class DryRunSampler:
    CONTEXT_BYTES = 500 * MIB  # what a CUDA context costs, roughly

    def __init__(self, fake: DryRunCuda):
        self.fake = fake

    def start(self):
        return self

    def stop(self) -> None:
        pass

    def sample_now(self) -> NvmlSample:
        reserved = self.fake.read_stats(None).reserved_bytes
        return NvmlSample(time.monotonic(), reserved + self.CONTEXT_BYTES, 80 << 30, None, None)

    def take_window_peak(self):  # no background thread in the dry run
        return None
