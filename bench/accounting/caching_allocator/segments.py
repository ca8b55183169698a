"""Device memory in and out of the allocator: cudaMalloc'd segments (alloc_block's cudaMalloc branch,
release_block) and expandable segments (find_expandable_block, map_block, try_allocate_expandable_block,
unmap_block, release_expandable_segment), each with the statistics and trace entries the source records.

Note the source's accounting of expandable segments, kept here: mapping pages adds to reserved_bytes and
num_device_alloc but not to the `segment` count (only cudaMalloc counts a segment), and their blocks never
enter inactive_split (free_block excludes them)."""
from __future__ import annotations

from typing import List, Optional

from bench.accounting.caching_allocator.blocks import Block, BlockPool, ExpandableSegment, try_merge_blocks
from bench.accounting.caching_allocator.device import SimulatedDevice
from bench.accounting.caching_allocator.sizes import kLargeBuffer, kSmallBuffer
from bench.accounting.caching_allocator.stats import DeviceStats, increase, decrease
from bench.accounting.caching_allocator.trace import (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP,
                                                      TraceRecorder)


def _allocatable(block: Optional[Block]) -> bool:
    # find_expandable_block's `allocatable`: free, no events or stream uses to wait for
    return block is not None and block.is_free()


class SegmentManager:
    def __init__(self, device: SimulatedDevice, stats: DeviceStats, trace: TraceRecorder, max_split_size: int):
        self.device, self.stats, self.trace = device, stats, trace
        self.max_split_size = max_split_size
        self.expandable_segments: List[ExpandableSegment] = []

    # -- cudaMalloc'd segments -------------------------------------------------------------------------

    def cuda_malloc(self, pool: BlockPool, alloc_size: int, stream: int = 0) -> Optional[Block]:
        """alloc_block after its checks: cudaMalloc(alloc_size), which fails without the physical memory;
        on success a new unsplit block, counted as a segment."""
        if not self.device.has_room(alloc_size):
            return None
        block = Block(self.device.reserve_addresses(alloc_size), alloc_size, pool, stream=stream)
        self.device.total_allocated_memory += alloc_size
        stats = self.stats
        stats.increase_pool(stats.segment, pool.stat_index, 1)
        stats.increase_pool(stats.reserved_bytes, pool.stat_index, alloc_size)
        if alloc_size >= self.max_split_size:
            increase(stats.oversize_segments, 1)
        stats.num_device_alloc += 1
        self.trace.record(SEGMENT_ALLOC, block.address, alloc_size)
        return block

    def release_block(self, block: Block) -> None:
        """release_block: cudaFree a whole cached segment (never an expandable one) and drop it from its pool."""
        stats, pool = self.stats, block.pool
        stats.num_device_free += 1
        self.trace.record(SEGMENT_FREE, block.address, block.size)
        self.device.total_allocated_memory -= block.size
        stats.decrease_pool(stats.segment, pool.stat_index, 1)
        stats.decrease_pool(stats.reserved_bytes, pool.stat_index, block.size)
        if block.size >= self.max_split_size:
            decrease(stats.oversize_segments, 1)
        pool.erase(block)

    # -- expandable segments ---------------------------------------------------------------------------

    def find_expandable_block(self, pool: BlockPool, size: int, stream: int = 0) -> Block:
        """The lowest address in any of the pool's expandable segments of `stream` where free and unmapped
        blocks in a row hold `size` bytes (starting at the free block before an unmapped one, if any); a new
        segment's whole unmapped address space when none does."""
        for candidate in pool.unmapped_blocks(stream):
            if _allocatable(candidate.prev):
                candidate = candidate.prev
            available, block = 0, candidate
            while available < size and _allocatable(block):
                available += block.size
                block = block.next
            if available >= size:
                return candidate
        page_size = kSmallBuffer if pool.is_small else kLargeBuffer
        page_count = self.device.expandable_reservation(page_size)
        segment = ExpandableSegment(self.device.reserve_addresses(page_size * page_count), page_size, page_count)
        self.expandable_segments.append(segment)
        candidate = Block(segment.base, segment.size, pool, segment, mapped=False, stream=stream)
        pool.insert_unmapped(candidate)
        return candidate

    def map_block(self, to_map: Block, size: int) -> bool:
        """map_block: back the first `size` bytes of the unmapped block `to_map` with pages (whole pages, so
        possibly more); the rest stays an unmapped block after it. False when the pages cannot be created."""
        segment = to_map.expandable_segment
        mapped_address, mapped_size = segment.pages_to_map(to_map.address, size)
        if mapped_size == 0 or not self.device.has_room(mapped_size):
            return False  # cuMemCreate reported CUDA_ERROR_OUT_OF_MEMORY: nothing stays mapped
        pool = to_map.pool
        pool.erase_unmapped(to_map)
        to_map.mapped = True
        if mapped_size < to_map.size:
            remaining = Block(to_map.address + mapped_size, to_map.size - mapped_size, pool, segment, mapped=False,
                              stream=to_map.stream)
            remaining.splice(to_map, to_map.next)
            pool.insert_unmapped(remaining)
            to_map.size = mapped_size
        try_merge_blocks(to_map, to_map.prev, pool)
        try_merge_blocks(to_map, to_map.next, pool)
        pool.insert_into_blocks(to_map)
        self.device.total_allocated_memory += mapped_size
        self.stats.increase_pool(self.stats.reserved_bytes, pool.stat_index, mapped_size)
        self.stats.num_device_alloc += 1
        self.trace.record(SEGMENT_MAP, mapped_address, mapped_size)
        return True

    def try_allocate_expandable_block(self, pool: BlockPool, size: int, stream: int = 0) -> Optional[Block]:
        """try_allocate_expandable_block: map pages from the candidate on until one free block holds `size`
        bytes; that block leaves the pool. None when mapping fails (what was mapped stays, cached)."""
        candidate = self.find_expandable_block(pool, size, stream)
        # candidate is: unmapped -> null | unmapped -> free -> * | free -> unmapped -> *
        if not candidate.mapped and not self.map_block(candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            # free -> unmapped -> *: map some of the unmapped block, which merges the free one into it
            next_block = candidate.next
            if not self.map_block(next_block, min(size - candidate.size, next_block.size)):
                return None
            candidate = next_block
        pool.erase(candidate)
        return candidate

    def unmap_block(self, block: Block) -> None:
        """unmap_block: give back the whole pages inside the cached block `block`; the partial pages at its
        ends stay mapped as cached blocks of their own, the unmapped range merges with unmapped neighbours."""
        segment, pool = block.expandable_segment, block.pool
        unmapped_address, unmapped_size = segment.pages_to_unmap(block.address, block.size)
        if unmapped_size == 0:
            return
        pool.erase(block)
        before_size = unmapped_address - block.address
        if before_size > 0:
            before_free = Block(block.address, before_size, pool, segment, stream=block.stream)
            before_free.splice(block.prev, block)
            pool.insert_into_blocks(before_free)
        after_size = block.size - (before_size + unmapped_size)
        if after_size > 0:
            after_free = Block(unmapped_address + unmapped_size, after_size, pool, segment, stream=block.stream)
            after_free.splice(block, block.next)
            pool.insert_into_blocks(after_free)
        block.address, block.size, block.mapped = unmapped_address, unmapped_size, False
        try_merge_blocks(block, block.prev, pool)
        try_merge_blocks(block, block.next, pool)
        pool.insert_unmapped(block)
        self.device.total_allocated_memory -= unmapped_size
        self.stats.decrease_pool(self.stats.reserved_bytes, pool.stat_index, unmapped_size)
        self.stats.num_device_free += 1
        self.trace.record(SEGMENT_UNMAP, unmapped_address, unmapped_size)

    def release_expandable_segment(self, block: Block) -> None:
        """release_expandable_segment: a wholly unmapped segment gives back its address space."""
        self.expandable_segments.remove(block.expandable_segment)
        block.pool.erase_unmapped(block)
