"""A model of PyTorch's CUDA caching allocator in pure Python (one device; per-stream pools and
record_stream's end-of-life events; no CUDA graphs, IPC or private memory pools), to predict reserved
memory, fragmentation and OOMs without a GPU.

It follows c10/cuda/CUDACachingAllocator.cpp at pytorch commit 001074d25084fdb87a799823e395a50f5ec044d3
(main of mid-2024, just after "Support IPC for Expandable Segments", #130890: the torch 2.5 development line;
the file alone does not pin the release), checked against a later stored revision of the same file (CUDA 13
era, December 2025 or later: torch 2.10+), where the rules modelled here are unchanged but for the three
points noted below. Settings are parsed as c10/core/AllocatorConfig.cpp (AcceleratorAllocatorConfig::
parseArgs) parses them. Functions mirrored, by module:

- sizes: round_size, roundup_power2_next_division, get_pool (is_small_size), get_allocation_size,
  AcceleratorAllocatorConfig::roundup_power2_divisions (roundup_power2_divisions_for), format_size;
- events: insert_events, process_events (first in malloc), synchronize_and_free_events (before
  release_cached_blocks), recordStream;
- model: DeviceCachingAllocator::malloc (its order: get_free_block; garbage_collect_cached_blocks under an
  allowed maximum; alloc_block; release_available_cached_blocks + alloc_block; release_cached_blocks +
  alloc_block(isRetry) counting num_alloc_retries; else OOM counting num_ooms), get_free_block,
  alloc_block, should_split, alloc_found_block, free, free_block, emptyCache, resetPeakStats,
  resetAccumulatedStats, snapshot;
- blocks: Block, BlockPool (insert_into_blocks, gc counts), ExpandableSegment (map/unmap page ranges),
  try_merge_blocks;
- segments: alloc_block's cudaMalloc branch, release_block, find_expandable_block, map_block,
  try_allocate_expandable_block, unmap_block, release_expandable_segment;
- release: release_blocks, release_cached_blocks, release_available_cached_blocks,
  garbage_collect_cached_blocks;
- stats: DeviceStats with increase_stat / decrease_stat / reset_peak_stat / reset_accumulated_stat and
  torch's memory_stats() key layout (torch/csrc/cuda/Module.cpp);
- trace: record_trace's ring buffer and the snapshot layout (torch/csrc/cuda/Module.cpp, memory.py).

Where the later revision differs and the model takes its side: release_available_cached_blocks and
garbage_collect_cached_blocks skip expandable blocks; max_non_split_rounding_mb (default the large
segment size) bounds oversize reuse; setMemoryFraction sets an allowed maximum only below 1.0. Simplified
or left out (said where it happens): events complete only as the caller says (stream_busy / synchronize:
the model runs no kernels), CUDA graphs and private pools, IPC, FreeCudaMemoryCallbacks, peer access,
stack frames and timestamps in traces; the device holds nothing else and addresses are never reused
(device.py).
"""
from bench.accounting.caching_allocator.errors import SimulatedOutOfMemory
from bench.accounting.caching_allocator.model import CachingAllocatorModel
from bench.accounting.caching_allocator.settings import AllocatorSettings
from bench.accounting.caching_allocator.sizes import (get_allocation_size, kLargeBuffer, kMinBlockSize,
                                                      kMinLargeAlloc, kRoundLarge, kSmallBuffer, kSmallSize,
                                                      round_size)

__all__ = ["AllocatorSettings", "CachingAllocatorModel", "SimulatedOutOfMemory", "get_allocation_size",
           "kLargeBuffer", "kMinBlockSize", "kMinLargeAlloc", "kRoundLarge", "kSmallBuffer", "kSmallSize",
           "round_size"]
