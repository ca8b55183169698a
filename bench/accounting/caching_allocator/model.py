"""CachingAllocatorModel: DeviceCachingAllocator's malloc and free paths for one device: per-stream pools
(a freed block serves only requests on the stream it was allocated on) and record_stream's deferred frees."""
from __future__ import annotations

from typing import Dict, Hashable, Optional

from bench.accounting.caching_allocator.blocks import Block, BlockPool, try_merge_blocks
from bench.accounting.caching_allocator.device import SimulatedDevice
from bench.accounting.caching_allocator.errors import SimulatedOutOfMemory
from bench.accounting.caching_allocator.events import StreamEvents
from bench.accounting.caching_allocator.release import (garbage_collect_cached_blocks, release_available_cached_blocks,
                                                        release_cached_blocks)
from bench.accounting.caching_allocator.segments import SegmentManager
from bench.accounting.caching_allocator.settings import AllocatorSettings, division_table_of
from bench.accounting.caching_allocator.sizes import get_allocation_size, kMinBlockSize, kSmallSize, round_size
from bench.accounting.caching_allocator.stats import AGGREGATE, CURRENT, DeviceStats, decrease, increase
from bench.accounting.caching_allocator.trace import (ALLOC, FREE_COMPLETED, FREE_REQUESTED, OOM, SNAPSHOT,
                                                      TraceRecorder, segment_dicts)

# NativeCachingAllocator::allocate refuses 1 EB or more before the caching allocator sees the request
ONE_EXA_BYTES = 1 << 60


class CachingAllocatorModel:
    """PyTorch's CUDA caching allocator on a simulated device of `capacity_bytes` (cudaMalloc fails past it).

    `allowed_bytes` is torch's allowed maximum (torch.cuda.set_per_process_memory_fraction(f) gives
    f x the device's memory); without it, settings.per_process_memory_fraction < 1 sets it. Under an
    allowed maximum, alloc_block fails past it and garbage_collection_threshold acts; without one the
    threshold is inert, as in the source. `trace_max_entries` bounds the history snapshot() returns
    (0: none kept, None: all). Keys are opaque handles the caller frees by."""

    def __init__(self, capacity_bytes: int, settings: AllocatorSettings = AllocatorSettings(), *,
                 allowed_bytes: Optional[int] = None, trace_max_entries: Optional[int] = 100_000):
        self.settings = settings
        if allowed_bytes is None:
            allowed_bytes = settings.allowed_bytes(capacity_bytes)
        self.device = SimulatedDevice(capacity_bytes, allowed_bytes)
        self.max_split_size = settings.max_split_size
        self.stats = DeviceStats(self.max_split_size)
        self.trace = TraceRecorder(trace_max_entries)
        self.segments = SegmentManager(self.device, self.stats, self.trace, self.max_split_size)
        self.large_blocks, self.small_blocks = BlockPool(is_small=False), BlockPool(is_small=True)
        self._division_table = division_table_of(settings)
        self._max_non_split_rounding = settings.max_non_split_rounding_size
        self._large_segment_size = settings.large_segment_size
        self._expandable = settings.expandable_segments
        threshold = settings.garbage_collection_threshold or 0.0
        # the source counts get_free_block calls and collects garbage only under an allowed maximum
        self._gc_threshold = threshold if allowed_bytes is not None and threshold > 0.0 else 0.0
        self._active: Dict[Hashable, Block] = {}  # active_blocks, by the caller's key
        self.events = StreamEvents()
        self._zero_byte_keys = set()

    # -- public API ------------------------------------------------------------------------------------

    def malloc(self, nbytes: int, key: Hashable, stream: int = 0) -> int:
        """Allocate `nbytes` for `key` on `stream` (0: the default stream); returns the block's address (0
        for a 0-byte request, which, as torch's allocate(), takes no block and leaves the statistics alone)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes")
        if key in self._active or key in self._zero_byte_keys:
            raise KeyError(f"key {key!r} already holds an allocation")
        if nbytes == 0:
            self._zero_byte_keys.add(key)
            return 0
        if nbytes >= ONE_EXA_BYTES:
            raise self._out_of_memory(nbytes, nbytes, nbytes)
        if self.events:  # process_events, first thing in malloc
            for freed in self.events.completed():
                self._free_block(freed)
        block = self._malloc(nbytes, stream)
        self._active[key] = block
        return block.address

    def record_stream(self, key: Hashable, stream: int) -> None:
        """recordStream: `stream` uses the allocation of `key`; its free waits for that stream's work."""
        block = self._active[key]
        if stream != block.stream:
            block.stream_uses.add(stream)

    def stream_busy(self, stream: int) -> None:
        """Work was queued on `stream` (an event recorded there now completes only at its synchronize)."""
        self.events.busy(stream)

    def synchronize(self, stream: Optional[int] = None) -> None:
        """torch.cuda.synchronize() (every stream) or stream.synchronize(): queued work has run. Blocks whose
        events complete are freed at the next malloc (process_events) or empty_cache, as in the source."""
        self.events.synchronize(None if stream is None else [stream])

    def free(self, key: Hashable) -> None:
        """Free the allocation of `key` (the source's free + free_block: merge with free neighbours, cache)."""
        if key in self._zero_byte_keys:
            self._zero_byte_keys.discard(key)
            return
        block = self._active.pop(key, None)
        if block is None:
            raise KeyError(f"invalid device pointer: no allocation for key {key!r}")
        block.allocated = False
        stats, pool_index = self.stats, block.pool.stat_index
        stats.decrease_pool(stats.allocation, pool_index, 1)
        stats.decrease_pool(stats.allocated_bytes, pool_index, block.size)
        self.trace.record(FREE_REQUESTED, block.address, block.requested_size)
        if block.size >= self.max_split_size:
            decrease(stats.oversize_allocations, 1)
        if block.stream_uses:
            self.events.record(block)  # insert_events: free_block once they complete
        else:
            self._free_block(block)

    def memory_stats(self) -> Dict[str, int]:
        """torch.cuda.memory_stats() of the simulated device: same keys, sorted."""
        return self.stats.as_memory_stats()

    def reset_peak_stats(self) -> None:
        self.stats.reset_peak()

    def reset_accumulated_stats(self) -> None:
        self.stats.reset_accumulated()

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release_cached_blocks."""
        self._release_cached_blocks()

    def _release_cached_blocks(self) -> bool:
        for freed in self.events.wait_all():  # synchronize_and_free_events comes first
            self._free_block(freed)
        return release_cached_blocks(self.segments, self.large_blocks, self.small_blocks)

    def snapshot(self) -> dict:
        """torch.cuda.memory._snapshot() of the simulated device (records a "snapshot" trace entry, as the
        source does)."""
        all_blocks = (self.small_blocks.blocks() + self.large_blocks.blocks() + list(self._active.values())
                      + self.events.pending_blocks())
        segments = segment_dicts(all_blocks)
        self.trace.record(SNAPSHOT, 0, sum(segment["active_size"] for segment in segments))
        return {"segments": segments, "device_traces": [self.trace.entries()]}

    # -- malloc path (DeviceCachingAllocator::malloc) --------------------------------------------------

    def _malloc(self, orig_size: int, stream: int) -> Block:
        size = round_size(orig_size, self._division_table)
        pool = self.small_blocks if size <= kSmallSize else self.large_blocks
        alloc_size = get_allocation_size(size, self._large_segment_size)
        block = self._get_free_block(pool, size, stream)  # FreeCudaMemoryCallbacks free no block here
        if block is None:
            if self._gc_threshold:
                garbage_collect_cached_blocks(self.segments, self.large_blocks, self._gc_threshold)
            block = self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
            if block is None and release_available_cached_blocks(self.segments, pool, size, self.max_split_size,
                                                                 stream):
                block = self._alloc_block(pool, size, alloc_size, stream, is_retry=False)
            if block is None and self._release_cached_blocks():
                block = self._alloc_block(pool, size, alloc_size, stream, is_retry=True)
        if block is None:
            self.trace.record(OOM, self.device.free_bytes(), size)
            self.stats.num_ooms += 1
            raise self._out_of_memory(orig_size, size, alloc_size)
        return self._alloc_found_block(block, pool, size, orig_size, self._should_split(block, size))

    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Optional[Block]:
        """get_free_block: the best-fit cached block of `stream`, within the max_split_size rules; it leaves
        the pool."""
        if self._gc_threshold:
            pool.get_free_blocks_call_count += 1  # ages cached blocks only while garbage collection is on
        index = pool.lower_bound(size, stream)
        if index == len(pool) or pool.block_at(index).stream != stream:
            return None
        block = pool.block_at(index)
        if block.expandable_segment is not None:
            # an expandable segment's free tail counts as big as it can grow (its size plus the unmapped space
            # after it) for best fit, so a later block that is smaller by that measure is preferred
            # (expandable blocks exist only with expandable_segments on: the model's settings never change)
            while index + 1 < len(pool) and block.expandable_segment is not None:
                following = pool.block_at(index + 1)
                if following.stream != stream or _expandable_size(following) >= _expandable_size(block):
                    break
                index, block = index + 1, following
        if size < self.max_split_size and block.size >= self.max_split_size:
            return None  # no oversize block for a request that is not oversize
        if size >= self.max_split_size and block.size >= size + self._max_non_split_rounding:
            return None  # an oversize block serves an oversize request only within max_non_split_rounding
        pool.erase(block)
        return block

    def _alloc_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int,
                     is_retry: bool) -> Optional[Block]:
        """alloc_block: past the allowed maximum it fails at once; else a new cudaMalloc'd segment of
        alloc_size, or with expandable segments pages mapped for `size`."""
        if is_retry:
            self.stats.num_alloc_retries += 1
        if self.device.exceeds_allowed(alloc_size):
            return None
        if self._expandable:
            return self.segments.try_allocate_expandable_block(pool, size, stream)
        return self.segments.cuda_malloc(pool, alloc_size, stream)

    def _should_split(self, block: Block, size: int) -> bool:
        """should_split: small pool or expandable segments: a remainder of 512 bytes or more; large pool:
        only requests under max_split_size, and only a remainder over 1 MiB."""
        remaining = block.size - size
        if block.pool.is_small or self._expandable:
            return remaining >= kMinBlockSize
        return size < self.max_split_size and remaining > kSmallSize

    def _alloc_found_block(self, block: Block, pool: BlockPool, size: int, orig_size: int, split: bool) -> Block:
        """alloc_found_block: carve `size` bytes off the front of `block` when splitting (the rest goes back
        to the pool), mark it allocated, count it."""
        stats, pool_index = self.stats, pool.stat_index
        already_split = block.is_split()
        counts_split = block.expandable_segment is None  # inactive_split leaves expandable segments out
        if split:
            remaining = block
            block = Block(remaining.address, size, pool, remaining.expandable_segment, stream=remaining.stream)
            block.splice(remaining.prev, remaining)
            remaining.address += size
            remaining.size -= size
            pool.insert_into_blocks(remaining)
            if already_split and counts_split:  # an inactive split block shrinks by `size`
                stats.decrease_pool(stats.inactive_split_bytes, pool_index, size)
            elif counts_split:  # an unsplit block becomes split: its remainder is a new inactive split block
                stats.increase_pool(stats.inactive_split_bytes, pool_index, remaining.size)
                stats.increase_pool(stats.inactive_split, pool_index, 1)
        elif already_split and counts_split:  # a whole inactive split block becomes active
            stats.decrease_pool(stats.inactive_split_bytes, pool_index, block.size)
            stats.decrease_pool(stats.inactive_split, pool_index, 1)
        block.allocated = True
        block.requested_size = orig_size
        self.trace.record(ALLOC, block.address, orig_size)
        stats.increase_pool(stats.allocation, pool_index, 1)
        stats.increase_pool(stats.allocated_bytes, pool_index, block.size)
        stats.increase_pool(stats.active, pool_index, 1)
        stats.increase_pool(stats.active_bytes, pool_index, block.size)
        stats.increase_pool(stats.requested_bytes, pool_index, orig_size)
        if block.size >= self.max_split_size:
            increase(stats.oversize_allocations, 1)
        return block

    def _free_block(self, block: Block) -> None:
        """free_block: merge with free neighbours and cache; inactive_split follows the net change."""
        self.trace.record(FREE_COMPLETED, block.address, block.requested_size)
        original_size, requested_size, pool = block.size, block.requested_size, block.pool
        net_blocks = net_bytes = 0
        for candidate in (block.prev, block.next):
            subsumed = try_merge_blocks(block, candidate, pool)
            if subsumed:
                net_blocks -= 1
                net_bytes -= subsumed
        pool.insert_into_blocks(block)
        if block.is_split():
            net_blocks += 1
            net_bytes += block.size
        stats, pool_index = self.stats, pool.stat_index
        if block.expandable_segment is None:
            _apply_net(stats.inactive_split, pool_index, net_blocks)
            _apply_net(stats.inactive_split_bytes, pool_index, net_bytes)
        stats.decrease_pool(stats.active, pool_index, 1)
        stats.decrease_pool(stats.active_bytes, pool_index, original_size)
        stats.decrease_pool(stats.requested_bytes, pool_index, requested_size)

    def _out_of_memory(self, requested: int, rounded: int, alloc_size: int) -> SimulatedOutOfMemory:
        stats = self.stats
        return SimulatedOutOfMemory(
            requested_bytes=requested, rounded_bytes=rounded, allocation_bytes=alloc_size,
            reserved_bytes=stats.reserved_bytes[AGGREGATE][CURRENT],
            allocated_bytes=stats.allocated_bytes[AGGREGATE][CURRENT], capacity_bytes=self.device.capacity_bytes,
            allowed_bytes=self.device.allowed_bytes, device_free_bytes=self.device.free_bytes(),
            inactive_split_bytes=stats.inactive_split_bytes[AGGREGATE][CURRENT],
            num_alloc_retries=stats.num_alloc_retries, num_ooms=stats.num_ooms)


def _expandable_size(block: Block) -> int:
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)


def _apply_net(stat_array, pool_index: int, change: int) -> None:
    if change > 0:
        DeviceStats.increase_pool(stat_array, pool_index, change)
    elif change < 0:
        DeviceStats.decrease_pool(stat_array, pool_index, -change)
