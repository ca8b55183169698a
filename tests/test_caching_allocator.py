"""The caching allocator model against hand-computed cases, one per rule of c10/cuda/CUDACachingAllocator.cpp
(each with its arithmetic), and against torch's own readers of memory_stats() and snapshots."""
from __future__ import annotations

import pickle
import re

import pytest

from bench.accounting.caching_allocator import (AllocatorSettings, CachingAllocatorModel, SimulatedOutOfMemory,
                                                get_allocation_size, round_size)

KiB, MiB = 1024, 1024 * 1024
BIG = 64 * 1024 * MiB  # a device large enough never to refuse


def stats_of(model: CachingAllocatorModel, *keys: str) -> tuple:
    """memory_stats() values; a bare stat name ("reserved_bytes") means its "<name>.all.current"."""
    stats = model.memory_stats()
    return tuple(stats[key] if key in stats else stats[f"{key}.all.current"] for key in keys)


def stat(model: CachingAllocatorModel, key: str) -> int:
    return stats_of(model, key)[0]


def segment_layouts(model: CachingAllocatorModel):
    """[(total_size, [(block size, state), ...]), ...] of the snapshot, by address."""
    return [(segment["total_size"], [(block["size"], block["state"]) for block in segment["blocks"]])
            for segment in model.snapshot()["segments"]]


def test_sizes_round_to_512_bytes_and_segments_to_their_pool():
    # under 512 -> 512; otherwise the next multiple of 512
    assert [round_size(size) for size in (1, 512, 513)] == [512, 512, 1024]
    # <= 1 MiB: a 2 MiB small segment; < 10 MiB: a 20 MiB segment; else rounded up to 2 MiB
    assert [get_allocation_size(size) for size in (1 * MiB, 1 * MiB + 512, 10 * MiB - 512, 10 * MiB, 11 * MiB)] == [
        2 * MiB, 20 * MiB, 20 * MiB, 10 * MiB, 12 * MiB]
    model = CachingAllocatorModel(BIG)
    # a 0-byte request returns the null pointer and touches nothing, as torch's allocate(0)
    assert model.malloc(0, "empty") == 0 and model.memory_stats() == CachingAllocatorModel(BIG).memory_stats()
    model.free("empty")
    with pytest.raises(KeyError):
        model.free("never allocated")
    model.malloc(1, "one_byte")
    # 1 byte takes a 512-byte block of a new 2 MiB small segment
    assert stats_of(model, "allocated_bytes.small_pool.current", "requested_bytes.small_pool.current",
                    "reserved_bytes.small_pool.current") == (512, 1, 2 * MiB)


def test_small_requests_share_one_2mib_segment():
    model = CachingAllocatorModel(BIG)
    # 100_000 bytes round to 196 * 512 = 100_352; the three fit one after another in one 2 MiB segment
    addresses = [model.malloc(100_000, name) for name in "abc"]
    assert addresses == [addresses[0], addresses[0] + 100_352, addresses[0] + 200_704]
    assert stats_of(model, "segment.small_pool.current", "segment.large_pool.current",
                    "reserved_bytes.small_pool.current", "allocated_bytes.small_pool.current") == (
        1, 0, 2 * MiB, 3 * 100_352)
    # the rest of the segment is one inactive split block: 2_097_152 - 301_056 = 1_796_096
    assert stats_of(model, "inactive_split_bytes.small_pool.current", "inactive_split.small_pool.current") == (
        1_796_096, 1)


def test_3mib_request_splits_a_20mib_segment():
    model = CachingAllocatorModel(BIG)
    model.malloc(3 * MiB, "a")
    # 1 MiB < 3 MiB < 10 MiB: a 20 MiB segment; the remaining 17 MiB > 1 MiB (kSmallSize), so it is split off
    assert stats_of(model, "reserved_bytes", "allocated_bytes", "inactive_split_bytes", "inactive_split",
                    "segment.large_pool.current") == (20 * MiB, 3 * MiB, 17 * MiB, 1, 1)
    assert segment_layouts(model) == [(20 * MiB, [(3 * MiB, "active_allocated"), (17 * MiB, "inactive")])]


def test_12mib_request_gets_a_12mib_segment_reused_once_freed():
    model = CachingAllocatorModel(BIG)
    first = model.malloc(12 * MiB, "a")
    # >= 10 MiB: the segment is the size rounded up to 2 MiB, 12 MiB, with nothing left to split
    assert stats_of(model, "reserved_bytes", "inactive_split_bytes") == (12 * MiB, 0)
    model.free("a")
    # the cached 12 MiB block is the best fit for the same request: no new segment
    assert model.malloc(12 * MiB, "again") == first
    assert stats_of(model, "num_device_alloc", "segment.all.allocated", "reserved_bytes") == (1, 1, 12 * MiB)
    model.malloc(13 * MiB + 1, "b")
    # 13 MiB + 1 -> 13 MiB + 512 -> a 14 MiB segment; the remaining 1 MiB - 512 is not > 1 MiB: not split,
    # so the block (and allocated_bytes) is the whole 14 MiB
    assert stats_of(model, "reserved_bytes", "allocated_bytes", "requested_bytes") == (26 * MiB, 26 * MiB, 25 * MiB + 1)


def test_inactive_split_bytes_after_a_free_inside_a_split_segment_then_merge():
    model = CachingAllocatorModel(BIG)
    model.malloc(3 * MiB, "a")  # 20 MiB segment: a 3 | free 17
    model.malloc(3 * MiB, "b")  # the free 17 is split again: a 3 | b 3 | free 14
    assert stat(model, "inactive_split_bytes") == 14 * MiB
    model.free("a")  # a's neighbours: none before, b (allocated) after: no merge, a is one more split block
    assert stats_of(model, "inactive_split_bytes", "inactive_split") == (3 * MiB + 14 * MiB, 2)
    assert segment_layouts(model) == [(20 * MiB, [(3 * MiB, "inactive"), (3 * MiB, "active_allocated"),
                                                  (14 * MiB, "inactive")])]
    model.free("b")
    # b merges with a (before) and the free 14 MiB (after): 3 + 3 + 14 = the whole 20 MiB segment, unsplit,
    # so nothing is inactive-split any more (-2 blocks, -17 MiB)
    assert segment_layouts(model) == [(20 * MiB, [(20 * MiB, "inactive")])]
    assert stats_of(model, "inactive_split_bytes", "inactive_split", "inactive_split_bytes.all.peak") == (
        0, 0, 17 * MiB)
    # and the merged block serves a 19 MiB request alone: no new segment
    model.malloc(19 * MiB, "c")
    assert stat(model, "num_device_alloc") == 1


def test_oversize_blocks_are_never_split_nor_used_for_small_requests_nor_20mib_beyond_a_request():
    model = CachingAllocatorModel(BIG, AllocatorSettings(max_split_size_mb=25))
    model.malloc(30 * MiB, "x")  # 30 MiB >= 25 MiB: an oversize segment of 30 MiB, never split
    assert stats_of(model, "oversize_segments.current", "oversize_allocations.current") == (1, 1)
    model.free("x")
    model.malloc(3 * MiB, "y")
    # 3 MiB < 25 MiB may not take the cached 30 MiB block: a new 20 MiB segment, 30 + 20 = 50 MiB reserved
    assert stats_of(model, "reserved_bytes", "segment") == (50 * MiB, 2)
    assert (30 * MiB, [(30 * MiB, "inactive")]) in segment_layouts(model)
    # 28 MiB >= 25 MiB may: 30 < 28 + 20; the block is not split, so 30 MiB count as allocated
    model.malloc(28 * MiB, "z")
    assert stats_of(model, "reserved_bytes", "allocated_bytes", "max_split_size") == (
        50 * MiB, 3 * MiB + 30 * MiB, 25 * MiB)
    model.malloc(50 * MiB, "big")  # a 50 MiB segment: 100 MiB reserved
    model.free("big")
    model.malloc(26 * MiB, "a")  # 50 >= 26 + 20 (kLargeBuffer): too big to hand out, a new 26 MiB segment
    assert stat(model, "reserved_bytes") == 126 * MiB
    model.malloc(31 * MiB, "b")  # 50 < 31 + 20: the cached 50 MiB block, whole: 33 + 26 + 50 allocated
    assert stats_of(model, "reserved_bytes", "allocated_bytes") == (126 * MiB, 109 * MiB)


def test_release_available_cached_blocks_frees_one_oversize_block_without_a_retry():
    model = CachingAllocatorModel(100 * MiB, AllocatorSettings(max_split_size_mb=25))
    model.malloc(80 * MiB, "p")
    model.free("p")
    # 40 MiB: the cached 80 MiB is >= 40 + 20; cudaMalloc(40) fails (80 + 40 > 100); the smallest oversize
    # block >= max(40, 25) MiB, the 80, is freed and the second alloc_block succeeds: no retry is counted
    model.malloc(40 * MiB, "q")
    assert stats_of(model, "reserved_bytes", "num_device_free", "num_alloc_retries", "num_sync_all_streams") == (
        40 * MiB, 1, 0, 0)


def test_roundup_power2_divisions():
    four = AllocatorSettings(roundup_power2_divisions=4).division_table
    # 1200 MiB lies in [1024, 2048) MiB; 4 divisions: 1024, 1280, 1536, 1792 -> 1280 MiB
    assert round_size(1200 * MiB, four) == 1280 * MiB
    # 1200 bytes is not > 512 * 4 = 2048 bytes: plain 512 rounding, 1536
    assert round_size(1200, four) == 1536
    # 5 MiB + 1 in [4, 8) MiB, steps of 1 MiB -> 6 MiB (512 rounding alone would give 5 MiB + 512)
    model = CachingAllocatorModel(BIG, AllocatorSettings(roundup_power2_divisions=4))
    model.malloc(5 * MiB + 1, "a")
    assert stats_of(model, "allocated_bytes", "requested_bytes") == (6 * MiB, 5 * MiB + 1)
    settings = AllocatorSettings.parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    # index log2(interval in MiB): 256 -> 8 (and every index before it), 512 -> 9, 1024 -> 10, ">" -> 11 to 15
    assert settings.division_table == (1,) * 9 + (2, 4) + (8,) * 5
    # 600 MiB in [512, 1024) MiB: 2 divisions -> 768 MiB; 3000 MiB in [2048, 4096): 8 -> steps of 256 MiB
    assert round_size(600 * MiB, settings.division_table) == 768 * MiB
    assert round_size(3000 * MiB, settings.division_table) == 3072 * MiB


def _gc_pattern(model: CachingAllocatorModel) -> CachingAllocatorModel:
    """Ages: A cached at get_free_block count 3, B at 2; E (40 MiB) fits neither, at count 4."""
    model.malloc(30 * MiB, "A")  # count 1: new 30 MiB segment
    model.free("A")
    model.malloc(32 * MiB, "B")  # count 2: A too small, new 32 MiB segment (62 MiB reserved)
    model.free("B")
    model.malloc(30 * MiB, "C")  # count 3: reuses A
    model.free("C")              # A back in the cache at count 3
    model.malloc(40 * MiB, "E")  # count 4
    return model


def test_garbage_collection_frees_the_least_recently_used_cached_segment():
    settings = AllocatorSettings(garbage_collection_threshold=0.5, per_process_memory_fraction=0.5)
    model = _gc_pattern(CachingAllocatorModel(200 * MiB, settings))
    # allowed 0.5 x 200 = 100 MiB, threshold 0.5 x 100 = 50 MiB < 62 reserved: reclaim 12 MiB. Ages: A 4 - 3 = 1,
    # B 4 - 2 = 2, mean 1.5: B (32 MiB) goes, A stays; then 30 + 40 = 70 MiB reserved, no retry
    assert stats_of(model, "reserved_bytes", "num_device_free", "num_alloc_retries") == (70 * MiB, 1, 0)
    assert (30 * MiB, [(30 * MiB, "inactive")]) in segment_layouts(model)
    # without the threshold: 62 + 40 > 100 fails, every cached segment is freed and the retry succeeds
    model = _gc_pattern(CachingAllocatorModel(200 * MiB, AllocatorSettings(per_process_memory_fraction=0.5)))
    assert stats_of(model, "reserved_bytes", "num_device_free", "num_alloc_retries") == (40 * MiB, 2, 1)
    # the source collects only under an allowed maximum: on a 100 MiB device without one, the threshold is
    # inert (no ages counted); 62 + 40 > 100 makes cudaMalloc fail, and the same free-all-and-retry follows
    model = _gc_pattern(CachingAllocatorModel(100 * MiB, AllocatorSettings(garbage_collection_threshold=0.5)))
    assert model.large_blocks.get_free_blocks_call_count == 0
    assert stats_of(model, "reserved_bytes", "num_device_free", "num_alloc_retries") == (40 * MiB, 2, 1)


def test_failed_alloc_block_succeeds_after_release_cached_blocks():
    model = CachingAllocatorModel(40 * MiB)
    model.malloc(24 * MiB, "a")
    model.free("a")
    # 26 MiB: the cached 24 MiB is too small; cudaMalloc(26) fails (24 + 26 > 40); release_cached_blocks
    # frees the unsplit 24 MiB segment; the retry (isRetry) succeeds
    model.malloc(26 * MiB, "b")
    assert stats_of(model, "num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_free",
                    "reserved_bytes", "segment") == (1, 0, 1, 1, 26 * MiB, 1)


def test_fragmentation_oom():
    model = CachingAllocatorModel(40 * MiB)
    model.malloc(3 * MiB, "a")  # 20 MiB segment: a 3 | 17 free
    model.malloc(3 * MiB, "c")  # a 3 | c 3 | 14 free
    model.free("a")             # 3 free | c 3 | 14 free: 17 MiB free in the segment, 20 MiB free on the device
    with pytest.raises(SimulatedOutOfMemory) as caught:
        # 22 MiB: no free block is that large, cudaMalloc(22) fails (20 + 22 > 40), the segment is split so
        # release_cached_blocks frees nothing, the retry fails: OOM, with 37 MiB free in pieces
        model.malloc(22 * MiB, "x")
    oom = caught.value  # the exception's fields, bytes in MiB:
    in_mib = {field: size // MiB if field.endswith("_bytes") and size else size for field, size in vars(oom).items()}
    assert in_mib == dict(requested_bytes=22, rounded_bytes=22, allocation_bytes=22, reserved_bytes=20,
                          allocated_bytes=3, capacity_bytes=40, allowed_bytes=None, device_free_bytes=20,
                          inactive_split_bytes=17, num_alloc_retries=1, num_ooms=1)
    assert "Tried to allocate 22.00 MiB" in str(oom)
    assert stats_of(model, "num_ooms", "num_alloc_retries") == (1, 1)
    # nothing changed: the 14 MiB block still serves a request that fits it
    model.malloc(14 * MiB, "fits")
    assert stat(model, "reserved_bytes") == 20 * MiB


def _growing_steps(model: CachingAllocatorModel) -> None:
    """Three steps of three tensors each 30, 32, then 34 MiB, all freed at the end of their step."""
    for step, size_mib in enumerate((30, 32, 34)):
        for index in range(3):
            model.malloc(size_mib * MiB, (step, index))
        for index in range(3):
            model.free((step, index))


def test_expandable_segments_lower_reserved_when_sizes_change_step_to_step():
    plain = CachingAllocatorModel(BIG)
    _growing_steps(plain)
    # a cached 30 MiB block cannot hold 32, nor 32 hold 34: 3 x (30 + 32 + 34) = 288 MiB of segments
    assert stat(plain, "reserved_bytes.all.peak") == 288 * MiB
    expandable = CachingAllocatorModel(BIG, AllocatorSettings(expandable_segments=True))
    _growing_steps(expandable)
    # 20 MiB pages in the large pool. Step 1: 30 maps 2 pages (30 | 10 free), the next 30 uses the 10 free
    # and maps 1 page, the third maps 2: 5 pages = 100 MiB, all one free block at the end of the step.
    # Step 2: 3 x 32 = 96 fit the 100. Step 3: 34 + 34 leave 32 free; the third 34 maps 1 more page: 120 MiB
    # (4 mappings; the source counts no `segment` for mapped pages, only cudaMalloc does)
    assert stats_of(expandable, "reserved_bytes.all.peak", "num_device_alloc", "segment") == (120 * MiB, 4, 0)
    assert segment_layouts(expandable) == [(120 * MiB, [(120 * MiB, "inactive")])]
    assert expandable.snapshot()["segments"][0]["is_expandable"] is True


def test_expandable_segments_unmap_whole_free_pages_only():
    model = CachingAllocatorModel(BIG, AllocatorSettings(expandable_segments=True))
    model.malloc(30 * MiB, "a")  # 2 pages mapped: a 30 | 10 free
    assert stat(model, "reserved_bytes") == 40 * MiB
    model.empty_cache()  # the free 10 MiB lies in a page a still uses: nothing to unmap
    assert stat(model, "reserved_bytes") == 40 * MiB
    model.free("a")
    model.empty_cache()  # 40 MiB free: both pages unmapped, then the empty segment is released
    assert stats_of(model, "reserved_bytes", "num_device_free") == (0, 1)
    assert model.segments.expandable_segments == []
    actions = [entry["action"] for entry in model.snapshot()["device_traces"][0]]
    assert actions.count("segment_map") == 1 and actions.count("segment_unmap") == 1
    # the small pool's expandable segment maps 2 MiB pages
    model.malloc(600 * KiB, "a")  # 1 page of 2 MiB
    model.malloc(600 * KiB, "b")  # fits the rest of it
    model.malloc(1 * MiB, "c")    # 2 MiB - 1200 KiB = 848 KiB left: 1 more page
    # (and expandable blocks never count as inactive split)
    assert stats_of(model, "reserved_bytes.small_pool.current", "inactive_split_bytes") == (4 * MiB, 0)


def test_reset_peak_stats():
    model = CachingAllocatorModel(BIG)
    model.malloc(12 * MiB, "a")
    model.free("a")
    model.malloc(2 * MiB, "b")  # the cached 12 MiB block is the best fit, split: 2 | 10 free (10 > 1 MiB)
    assert stat(model, "allocated_bytes.all.peak") == 12 * MiB
    model.reset_peak_stats()
    stats = model.memory_stats()
    assert (stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"]) == (2 * MiB, 12 * MiB)
    assert all(stats[key.replace(".peak", ".current")] == peak for key, peak in stats.items() if key.endswith(".peak"))


def test_empty_cache_releases_unsplit_cached_segments_only():
    model = CachingAllocatorModel(BIG)
    model.malloc(12 * MiB, "whole")
    model.malloc(3 * MiB, "part")  # 20 MiB segment, split
    model.free("whole")
    model.empty_cache()  # the free 12 MiB segment goes back to CUDA; the 20 MiB one holds an allocation
    assert stats_of(model, "reserved_bytes", "num_device_free") == (20 * MiB, 1)
    model.free("part")
    model.empty_cache()
    assert stats_of(model, "reserved_bytes", "segment") == (0, 0)


def _documented_memory_stats_keys():
    import torch

    def expand(pattern):  # "a.{b,c}" -> {"a.b", "a.c"}
        match = re.search(r"\{([^}]*)\}", pattern)
        return {key for choice in match.group(1).split(",")
                for key in expand(pattern[:match.start()] + choice + pattern[match.end():])} if match else {pattern}

    doc = torch.cuda.memory.memory_stats.__doc__
    # quoted names, less the "_" and "0_1" of the note on how private-pool ids are flattened
    patterns = [pattern for pattern in re.findall(r'``"([^"]+)"``', doc) if re.match(r"[a-z]", pattern)]
    return {key for pattern in patterns for key in expand(pattern)}


def test_memory_stats_keys_are_torchs_and_memory_summary_reads_them(monkeypatch):
    import torch.cuda.memory as torch_memory

    model = CachingAllocatorModel(BIG)
    model.malloc(3 * MiB, "a")
    documented, keys = _documented_memory_stats_keys(), set(model.memory_stats())
    # the docstring calls the allocation counts "allocated.*"; the C++ (THCPModule_memoryStats) names them
    # "allocation.*", and torch's own memory_summary reads "allocation": the model follows the C++
    renamed = {key.replace("allocation.", "allocated.", 1) for key in keys}
    assert renamed <= documented
    # and everything documented is there, but the nested per-private-pool dict (no private pools here)
    assert documented - renamed == {"reserved_bytes_by_private_pools"}
    monkeypatch.setattr(torch_memory, "memory_stats", lambda device=None: model.memory_stats())
    summary = torch_memory.memory_summary(device=0)
    assert "Allocated memory" in summary and "3072 KiB" in summary


def test_snapshot_is_read_by_torch_memory_viz():
    from torch.cuda import _memory_viz

    model = CachingAllocatorModel(80 * MiB, AllocatorSettings(max_split_size_mb=40))
    model.malloc(3 * MiB, "a")
    model.malloc(3 * MiB, "b")  # a 3 | b 3 | 14 free in a 20 MiB segment
    model.malloc(100_000, "small")  # a 2 MiB small segment
    model.malloc(45 * MiB, "oversize")  # a 46 MiB oversize segment: 68 MiB reserved
    model.free("a")
    with pytest.raises(SimulatedOutOfMemory):
        model.malloc(35 * MiB, "too_much")  # 68 + 36 > 80, and no cached segment is unsplit
    before = model.snapshot()
    model.free("oversize")
    model.empty_cache()
    after = pickle.loads(pickle.dumps(model.snapshot()))  # what dump_snapshot writes and viewers load
    identity = lambda lines: lines  # noqa: E731  (format_flamegraph would run flamegraph.pl)
    summary = _memory_viz.segsum(before)  # asserts free + allocated == reserved for every segment
    assert "segments: 3" in summary
    assert "raise OutOfMemoryError" in _memory_viz.trace(before)
    assert "active_allocated" in _memory_viz.segments(before, format_flamegraph=identity)
    assert _memory_viz.memory(after, format_flamegraph=identity)
    assert "only_before" in _memory_viz.compare(before["segments"], after["segments"], format_flamegraph=identity)
    assert "Allocator State History" in _memory_viz.segment_plot(after)
    assert "Active Memory Timeline" in _memory_viz.trace_plot(after)
    _memory_viz.filter_alloc_free_pairs(after)  # warns (prints) on a free_completed without free_requested
    segment = before["segments"][0]
    assert set(segment) == {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                            "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
    assert set(segment["blocks"][0]) == {"address", "size", "requested_size", "state", "frames"}
    # the trace holds the source's events in order
    model = CachingAllocatorModel(BIG)
    address = model.malloc(12 * MiB, "a")
    model.free("a")
    model.empty_cache()
    trace = model.snapshot()["device_traces"][0]
    assert [(entry["action"], entry["addr"], entry["size"]) for entry in trace] == [
        ("segment_alloc", address, 12 * MiB), ("alloc", address, 12 * MiB),
        ("free_requested", address, 12 * MiB), ("free_completed", address, 12 * MiB),
        ("segment_free", address, 12 * MiB), ("snapshot", 0, 0)]


def test_settings_parse_alloc_conf_text():
    settings = AllocatorSettings.parse("expandable_segments:True,max_split_size_mb:128")
    assert settings == AllocatorSettings(expandable_segments=True, max_split_size_mb=128)
    assert settings.max_split_size == 128 * MiB
    parsed = AllocatorSettings.parse(
        "backend:native, garbage_collection_threshold:0.6,roundup_power2_divisions:[1:2,>:4],"
        "pinned_use_cuda_host_register:True,per_process_memory_fraction:0.8")
    assert parsed.garbage_collection_threshold == 0.6 and parsed.per_process_memory_fraction == 0.8
    assert parsed.roundup_power2_divisions == (("1", 2), (">", 4))
    assert AllocatorSettings.parse("roundup_power2_divisions:8").division_table == (8,) * 16
    assert AllocatorSettings.parse("") == AllocatorSettings() == AllocatorSettings.parse(None)
    assert AllocatorSettings(roundup_power2_divisions={"256": 2}) == AllocatorSettings.parse(
        "roundup_power2_divisions:[256:2]")
    for bad in ("max_split_size_mb:19", "garbage_collection_threshold:1.0", "roundup_power2_divisions:3",
                "expandable_segments:yes", "max_split_size_mb 128"):
        with pytest.raises(ValueError):
            AllocatorSettings.parse(bad)


def test_stats_agree_with_the_snapshot_on_a_mixed_workload():
    for settings in (AllocatorSettings(), AllocatorSettings(expandable_segments=True),
                     AllocatorSettings(max_split_size_mb=32, roundup_power2_divisions=4)):
        model = CachingAllocatorModel(BIG, settings)
        live = []
        for index in range(600):  # deterministic sizes from 512 bytes to ~40 MiB, frees of every third
            size = (index * 7919 % 97 + 1) * (index * 104729 % 421 + 1) * 1024
            model.malloc(size, index)
            live.append(index)
            if index % 3 == 2:
                model.free(live.pop(index * 31 % len(live)))
        segments = model.snapshot()["segments"]
        active = [block for segment in segments for block in segment["blocks"] if block["state"] == "active_allocated"]
        assert (sum(segment["total_size"] for segment in segments), sum(block["size"] for block in active), len(active),
                sum(block["requested_size"] for block in active)) == stats_of(
            model, "reserved_bytes", "allocated_bytes", "allocation", "requested_bytes")
        assert len(active) == len(live)
        for live_key in live:
            model.free(live_key)
        assert stat(model, "allocated_bytes") == 0
        model.empty_cache()
        assert stat(model, "reserved_bytes") == 0
