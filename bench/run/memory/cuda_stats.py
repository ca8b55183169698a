"""CUDA caching-allocator counters, read through one function so everything else stays GPU-free."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping

# Keys of torch.cuda.memory_stats(); "all" aggregates the small and large pools.
MEMORY_STATS_KEYS: dict[str, str] = {
    "allocated_bytes": "allocated_bytes.all.current",
    "peak_allocated_bytes": "allocated_bytes.all.peak",
    "reserved_bytes": "reserved_bytes.all.current",
    "peak_reserved_bytes": "reserved_bytes.all.peak",
    "active_bytes": "active_bytes.all.current",
    "peak_active_bytes": "active_bytes.all.peak",
    "inactive_split_bytes": "inactive_split_bytes.all.current",
    "peak_inactive_split_bytes": "inactive_split_bytes.all.peak",
    "num_alloc_retries": "num_alloc_retries",
    "num_ooms": "num_ooms",
}


@dataclass(frozen=True)
class CudaAllocatorStats:
    allocated_bytes: int = 0
    peak_allocated_bytes: int = 0
    reserved_bytes: int = 0
    peak_reserved_bytes: int = 0
    active_bytes: int = 0
    peak_active_bytes: int = 0
    inactive_split_bytes: int = 0
    peak_inactive_split_bytes: int = 0  # free bytes inside split blocks at their phase peak: fragmentation
    num_alloc_retries: int = 0
    num_ooms: int = 0

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_memory_stats(stats: Mapping[str, Any]) -> CudaAllocatorStats:
    """Map torch's flat stats dict onto CudaAllocatorStats.

    Missing keys read as 0: torch returns {} before the allocator has been initialised on a device.
    """
    return CudaAllocatorStats(**{field: int(stats.get(key, 0) or 0) for field, key in MEMORY_STATS_KEYS.items()})


def read_allocator_stats(device: Any) -> CudaAllocatorStats:
    """The only call to torch.cuda.memory_stats in membench."""
    import torch

    return parse_memory_stats(torch.cuda.memory_stats(device))


def reset_peak(device: Any) -> None:
    """Reset the peak counters so each step/phase reports its own peak."""
    import torch

    torch.cuda.reset_peak_memory_stats(device)
