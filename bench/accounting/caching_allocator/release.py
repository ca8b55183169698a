"""Giving cached memory back to the device: release_blocks and release_cached_blocks (empty_cache and the
last retry of malloc), release_available_cached_blocks (only with max_split_size), and
garbage_collect_cached_blocks (only with garbage_collection_threshold under an allowed maximum)."""
from __future__ import annotations

from bench.accounting.caching_allocator.blocks import BlockPool
from bench.accounting.caching_allocator.segments import SegmentManager
from bench.accounting.caching_allocator.sizes import SIZE_MAX


def release_blocks(segments: SegmentManager, pool: BlockPool) -> None:
    """release_blocks: cudaFree every unsplit cached segment; unmap the whole free pages of expandable
    segments, and release an expandable segment left with nothing mapped."""
    to_unmap = []
    for block in pool.blocks():
        if block.expandable_segment is not None:
            to_unmap.append(block)  # unmapping reshapes the pool, so it comes after the walk
        elif block.prev is None and block.next is None:
            segments.release_block(block)
    for block in to_unmap:
        segments.unmap_block(block)
        if block.prev is None and block.next is None:
            segments.release_expandable_segment(block)


def release_cached_blocks(segments: SegmentManager, large_pool: BlockPool, small_pool: BlockPool) -> bool:
    """release_cached_blocks: synchronize_and_free_events (counted; there are no events to wait for here),
    then release_blocks on the large pool and on the small pool. Always True, as in the source."""
    segments.stats.num_sync_all_streams += 1
    release_blocks(segments, large_pool)
    release_blocks(segments, small_pool)
    return True


def release_available_cached_blocks(segments: SegmentManager, pool: BlockPool, size: int,
                                    max_split_size: int, stream: int = 0) -> bool:
    """release_available_cached_blocks: with max_split_size set, cudaFree the smallest oversize cached block
    of `stream` of at least max(size, max_split_size) bytes; failing one, free that stream's oversize blocks
    from the largest down until that many bytes are released. Expandable blocks are skipped, as the newer
    source does (the older one asserts in release_block instead; unsplit oversize blocks are all
    cudaMalloc'd in practice)."""
    if max_split_size == SIZE_MAX:
        return False
    key_size = max(size, max_split_size)
    index = pool.lower_bound(key_size, stream)
    if index < len(pool):
        found = pool.block_at(index)
        if found.stream == stream and found.expandable_segment is None:
            segments.release_block(found)
            return True
    if index == 0:
        return False
    total_released = 0
    index -= 1  # the largest block
    while total_released < key_size and index >= 0:
        block = pool.block_at(index)
        if block.size < max_split_size or block.stream != stream:
            break
        index -= 1  # move on first: releasing removes the block at this index
        if block.expandable_segment is None:
            total_released += block.size
            segments.release_block(block)
    return total_released >= key_size


def garbage_collect_cached_blocks(segments: SegmentManager, large_pool: BlockPool, threshold: float) -> None:
    """garbage_collect_cached_blocks: once reserved memory passes threshold x the allowed maximum, free
    unsplit large cached segments that have waited at least the average number of get_free_block calls,
    again with the new average, until the excess is reclaimed (it does not stop mid-pass at the target)."""
    device = segments.device
    gc_threshold = int(threshold * device.allowed_bytes)
    if device.total_allocated_memory <= gc_threshold:
        return
    target_size = device.total_allocated_memory - gc_threshold
    freeable = [block for block in large_pool.blocks() if not block.is_split()]
    total_age, freeable_count = sum(block.gc_count() for block in freeable), len(freeable)
    if freeable_count == 0:
        return
    reclaimed, block_freed = 0, True
    while reclaimed < target_size and block_freed and freeable_count > 0:
        age_threshold = total_age / freeable_count
        block_freed = False
        for block in large_pool.blocks():
            if block.is_split() or block.expandable_segment is not None or block.gc_count() < age_threshold:
                continue
            block_freed = True
            reclaimed += block.size
            total_age -= block.gc_count()
            freeable_count -= 1
            segments.release_block(block)
