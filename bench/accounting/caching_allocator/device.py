"""The simulated GPU under the allocator: its memory (what cudaMalloc and cuMemCreate draw from), torch's
allowed maximum (set_per_process_memory_fraction) and a virtual address space.

Simplifications, said here once: the device holds nothing but this allocator's memory (no CUDA context, no
other process), so a cudaMalloc or a page mapping fails exactly when the bytes reserved would pass
`capacity_bytes`; addresses come from a bump pointer and are never reused, so a newer segment always sits
above an older one (the real driver may hand a freed range back; only the address tie-break of best fit
could differ)."""
from __future__ import annotations

from typing import Optional

from bench.accounting.caching_allocator.sizes import kLargeBuffer

# first address handed out: clear of 0 (the null pointer a 0-byte request returns), segment aligned
ADDRESS_BASE = 1 << 40
# the source reserves 1 1/8 of the GPU's memory of address space per expandable segment; CUDA's virtual
# address space is 256 TiB, so a (modelled) device larger than that cannot reserve more than half of it
MAX_EXPANDABLE_RESERVATION = 1 << 47


class SimulatedDevice:
    """Memory accounting of the device: `total_allocated_memory` is the source's counter of bytes obtained
    by cudaMalloc or mapped into expandable segments (equal to reserved_bytes.all.current)."""

    def __init__(self, capacity_bytes: int, allowed_bytes: Optional[int]):
        if capacity_bytes <= 0:
            raise ValueError(f"capacity_bytes must be > 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.allowed_bytes = allowed_bytes  # allowed_memory_maximum; None: no fraction set
        self.total_allocated_memory = 0
        self._next_address = ADDRESS_BASE

    def free_bytes(self) -> int:
        """What cudaMemGetInfo would call free."""
        return self.capacity_bytes - self.total_allocated_memory

    def exceeds_allowed(self, size: int) -> bool:
        """alloc_block's first test: past the allowed maximum (only when a fraction is set)."""
        return self.allowed_bytes is not None and self.total_allocated_memory + size > self.allowed_bytes

    def has_room(self, size: int) -> bool:
        """Would cudaMalloc / cuMemCreate of `size` more bytes find physical memory?"""
        return self.total_allocated_memory + size <= self.capacity_bytes

    def reserve_addresses(self, size: int) -> int:
        """Virtual addresses for a segment (cudaMalloc's pointer, or cuMemAddressReserve's range)."""
        address = self._next_address
        # keep every range aligned to the large page so expandable page arithmetic stays whole
        self._next_address += -(-size // kLargeBuffer) * kLargeBuffer
        return address

    def expandable_reservation(self, page_size: int) -> int:
        """Pages an expandable segment reserves: numSegments(totalGlobalMem + totalGlobalMem / 8)."""
        total = self.capacity_bytes
        reservation = min(total + total // 8, MAX_EXPANDABLE_RESERVATION)
        return -(-reservation // page_size)
