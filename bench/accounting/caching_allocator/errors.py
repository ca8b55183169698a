"""The model's torch.OutOfMemoryError."""
from __future__ import annotations

from typing import Optional

from bench.accounting.caching_allocator.sizes import format_size


class SimulatedOutOfMemory(Exception):
    """A request the modelled allocator could not place, after the source's whole malloc path (cached
    blocks, new segment, freeing oversize blocks, freeing every unsplit cached segment and retrying).

    requested_bytes: what the caller asked for; rounded_bytes: after round_size; allocation_bytes: the
    segment size it tried to obtain (torch's "Tried to allocate"); reserved/allocated/inactive_split_bytes:
    the allocator's current totals when it gave up; capacity_bytes: the device; allowed_bytes: torch's
    allowed maximum (None without a memory fraction); device_free_bytes: what CUDA would report free."""

    def __init__(self, *, requested_bytes: int, rounded_bytes: int, allocation_bytes: int, reserved_bytes: int,
                 allocated_bytes: int, capacity_bytes: int, allowed_bytes: Optional[int], device_free_bytes: int,
                 inactive_split_bytes: int, num_alloc_retries: int, num_ooms: int):
        self.requested_bytes = requested_bytes
        self.rounded_bytes = rounded_bytes
        self.allocation_bytes = allocation_bytes
        self.reserved_bytes = reserved_bytes
        self.allocated_bytes = allocated_bytes
        self.capacity_bytes = capacity_bytes
        self.allowed_bytes = allowed_bytes
        self.device_free_bytes = device_free_bytes
        self.inactive_split_bytes = inactive_split_bytes
        self.num_alloc_retries = num_alloc_retries
        self.num_ooms = num_ooms
        super().__init__(self._message())

    def _message(self) -> str:
        # the wording of DeviceCachingAllocator::malloc's TORCH_CHECK_WITH(OutOfMemoryError, ...)
        allowed = f"{format_size(self.allowed_bytes)} allowed; " if self.allowed_bytes is not None else ""
        return (f"CUDA out of memory. Tried to allocate {format_size(self.allocation_bytes)}. GPU 0 has a total "
                f"capacity of {format_size(self.capacity_bytes)} of which {format_size(self.device_free_bytes)} "
                f"is free. {allowed}Of the allocated memory {format_size(self.allocated_bytes)} is allocated by "
                f"PyTorch, and {format_size(self.reserved_bytes - self.allocated_bytes)} is reserved by PyTorch "
                f"but unallocated. (simulated: requested {self.requested_bytes} bytes)")
