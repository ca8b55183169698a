"""A GPU preset simulated on CPU (`hardware.simulate=true`): the CUDA recorder, reading a model of PyTorch's
caching allocator instead of torch.cuda.

The rank trains on CPU. The live-tensor tracker sees every storage appear and go, in a deterministic
order, and replays that stream into the allocator model (bench.accounting.caching_allocator), which rounds,
splits, caches and retries as the real allocator does, and refuses what it cannot place within the rank's
memory less its non-torch reserve: a torch.OutOfMemoryError at that op, recorded like a GPU's. The CUDA
recorder is the same class as on a GPU, only its sources differ: allocator statistics from the model,
an NVML reading of reserved + the reserve (the CUDA context and NCCL buffers a real process holds),
snapshots in the layout pytorch.org/memory_viz reads.

What it cannot model: what CUDA kernels allocate that CPU kernels do not (cuBLAS / cuDNN workspaces,
fbgemm's CUDA temporaries) and the reverse; NCCL's own buffers beyond the fixed reserve; several streams.
"""
from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Optional

import torch

from bench.accounting.caching_allocator import AllocatorSettings, CachingAllocatorModel
from bench.accounting.live_tensors import LiveTensorTracker
from bench.run.memory.cuda import CudaRecorder
from bench.run.memory.cuda_stats import parse_memory_stats
from bench.run.memory.nvml import NvmlSample
from bench.run.memory.recorder import PhaseSample, TaggingMixin, TrackingMixin
from workloads.units import UNBOUNDED_BYTES



class SimulatedNvml:
    """NVML of the simulated device: this process holds what the allocator reserved plus the reserve."""

    def __init__(self, model: CachingAllocatorModel, reserve_bytes: int, total_bytes: int):
        self.model, self.reserve_bytes, self.total_bytes = model, reserve_bytes, total_bytes
        self.peak_device_used_bytes: Optional[int] = None
        self.failed_samples = 0
        self._latest: Optional[NvmlSample] = None

    def start(self) -> "SimulatedNvml":
        return self

    def stop(self) -> None:
        pass

    def sample_now(self) -> NvmlSample:
        used = self.model.memory_stats()["reserved_bytes.all.current"] + self.reserve_bytes
        self.peak_device_used_bytes = max(self.peak_device_used_bytes or 0, used)
        self._latest = NvmlSample(time.monotonic(), used, self.total_bytes, used, None, 0)
        return self._latest

    def take_window_peak(self) -> Optional[int]:
        return None  # the recorder adds the reserve to the phase's peak reserved itself

    def latest(self) -> Optional[NvmlSample]:
        return self._latest


class SimulatedSnapshots:
    """torch.cuda.memory's snapshot calls, answered from the model (the pickle memory_viz reads)."""

    def __init__(self, model: CachingAllocatorModel):
        self.model = model

    def start_history(self, max_entries: int) -> None:
        pass  # the model keeps its trace anyway

    def stop_history(self) -> None:
        pass

    def dump_snapshot(self, path) -> str:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            pickle.dump(self.model.snapshot(), handle)
        return str(path)


class SimulatedCudaRecorder(TaggingMixin, TrackingMixin, CudaRecorder):
    name = "cuda_simulated"

    def __init__(self, rank: int, capacity_bytes: int, device_bytes: int, device_free_bytes: int,
                 allowed_bytes: Optional[int], settings: AllocatorSettings, timeline_path: Optional[Path],
                 warmup_steps: int, *, snapshot_dir: Optional[Path] = None, snapshot_max_entries: int = 100_000):
        """`capacity_bytes`: the rank's memory as on a GPU (the preset's x memory_fraction); `device_bytes`:
        the preset's memory; `device_free_bytes`: what cudaMalloc can get past the non-torch reserve;
        `allowed_bytes`: torch's allowed maximum (memory_fraction), None when uncapped."""
        self.model = CachingAllocatorModel(device_free_bytes, settings, allowed_bytes=allowed_bytes,
                                           trace_max_entries=snapshot_max_entries if snapshot_dir else 0)
        device = torch.device("cpu")
        # the tracker never refuses on its own: the allocator model decides
        self.tracker = LiveTensorTracker(device, UNBOUNDED_BYTES, rank, allocator=self.model)
        super().__init__(rank, device, capacity_bytes, timeline_path, warmup_steps,
                         read_stats=lambda d: parse_memory_stats(self.model.memory_stats()),
                         reset_peaks=lambda d: self.model.reset_peak_stats(),
                         sampler=SimulatedNvml(self.model, device_bytes - device_free_bytes, device_bytes),
                         snapshots=SimulatedSnapshots(self.model), synchronize=lambda d: None,
                         is_uvm=lambda tensor: False, snapshot_dir=snapshot_dir,
                         snapshot_max_entries=snapshot_max_entries, capped=allowed_bytes is not None)

    def attribute(self, ownership) -> None:
        # storages made before the mode started (the model, on build) enter the model here
        for category, tensors in ownership.items():
            self.tracker.track_tensors(tensors, category)
        super().attribute(ownership)

    def _sample(self) -> PhaseSample:
        self.tracker.flush_deferred()  # frees held to the phase end reach the model first, as on CPU
        return super()._sample()
