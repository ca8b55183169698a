"""Short malloc/free sequences whose exact allocator statistics were derived by hand from
c10/cuda/CUDACachingAllocator.cpp and c10/core/AllocatorConfig.cpp (torch >= 2.10), each pinning a rule:
the test suite asserts the model gives these numbers (tests/test_allocator_sequences.py) and gpu_check
asserts torch.cuda gives them on a GPU (bench/gpucheck/sequences.py), so the model is checked against
torch, not against itself. The derivation of each is in its `why`.

Operations: ("malloc", name, bytes[, stream]), ("free", name), ("record", name, stream) (record_stream),
("busy", stream) (queue a long kernel there), ("sync",) (torch.cuda.synchronize), ("empty_cache",),
("oom", bytes) (a malloc that must raise OutOfMemoryError). Stream 0 is the default stream. Each sequence
starts from an empty allocator with zeroed statistics, under `conf` (PYTORCH_CUDA_ALLOC_CONF text) and,
where `allowed_mib` is set, torch.cuda.set_per_process_memory_fraction giving that allowed maximum."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple, Type

from bench.accounting.caching_allocator.errors import SimulatedOutOfMemory
from bench.accounting.caching_allocator.model import CachingAllocatorModel
from bench.accounting.caching_allocator.settings import AllocatorSettings
from bench.accounting.caching_allocator.sizes import KIB, MIB

RESERVED_PEAK, RESERVED = "reserved_bytes.all.peak", "reserved_bytes.all.current"
ALLOCATED_PEAK, ALLOCATED = "allocated_bytes.all.peak", "allocated_bytes.all.current"
INACTIVE_SPLIT, SEGMENTS = "inactive_split_bytes.all.current", "segment.all.current"
RETRIES, OOMS = "num_alloc_retries", "num_ooms"

MODEL_CAPACITY_BYTES = 80 << 30  # room for every sequence: only `allowed_mib` limits them


@dataclass(frozen=True)
class AllocatorSequence:
    name: str
    why: str
    ops: Tuple[tuple, ...]
    expected: Mapping[str, int]  # torch.cuda.memory_stats() keys after the ops, exact
    conf: str = ""
    allowed_mib: Optional[int] = None


SEQUENCES = (
    AllocatorSequence(
        "small pool split", "1000 B rounds to 1024 and takes a fresh 2 MiB small segment, split (remainder "
        "2 MiB - 1 KiB inactive); 5000 B rounds to 5120 from the remainder (inactive shrinks by 5120); freeing "
        "the first leaves a 1024 B inactive block that cannot merge (its neighbour is live)",
        (("malloc", "a", 1000), ("malloc", "b", 5000), ("free", "a")),
        {RESERVED_PEAK: 2 * MIB, ALLOCATED: 5 * KIB, ALLOCATED_PEAK: 6 * KIB,
         INACTIVE_SPLIT: 2 * MIB - 5 * KIB, SEGMENTS: 1}),
    AllocatorSequence(
        "large pool 20 MiB segment and 2 MiB rounding", "3 MiB (under 10 MiB) takes a 20 MiB segment, split "
        "(17 MiB left > 1 MiB); 5 MiB from the remainder (12 MiB left); 13 MiB fits no cached block and gets "
        "a 14 MiB segment (2 MiB rounding) it is not split from (1 MiB left is not > 1 MiB), so allocated "
        "counts all 14 MiB",
        (("malloc", "a", 3 * MIB), ("malloc", "b", 5 * MIB), ("malloc", "c", 13 * MIB)),
        {RESERVED_PEAK: 34 * MIB, ALLOCATED: 22 * MIB, INACTIVE_SPLIT: 12 * MIB, SEGMENTS: 2}),
    AllocatorSequence(
        "oversize blocks under max_split_size_mb", "max_split_size 40 MiB: a freed 50 MiB segment (oversize) "
        "serves a 45 MiB request whole (50 < 45 + 20 MiB max_non_split_rounding) but not a 15 MiB one (no "
        "oversize block for a request under max_split_size): that takes a 16 MiB segment",
        (("malloc", "a", 50 * MIB), ("free", "a"), ("malloc", "b", 45 * MIB), ("free", "b"),
         ("malloc", "c", 15 * MIB)),
        {RESERVED_PEAK: 66 * MIB, ALLOCATED: 16 * MIB, ALLOCATED_PEAK: 50 * MIB, INACTIVE_SPLIT: 0,
         SEGMENTS: 2}, conf="max_split_size_mb:40"),
    AllocatorSequence(
        "max_non_split_rounding bounds oversize reuse", "max_split_size 40 MiB: a cached 100 MiB block does "
        "not serve 60 MiB (100 >= 60 + 20): a new 60 MiB segment; nothing is released (no memory pressure)",
        (("malloc", "a", 100 * MIB), ("free", "a"), ("malloc", "b", 60 * MIB)),
        {RESERVED_PEAK: 160 * MIB, ALLOCATED: 60 * MIB, SEGMENTS: 2}, conf="max_split_size_mb:40"),
    AllocatorSequence(
        "release and retry, then OOM", "allowed 64 MiB: 30 MiB cached + 40 MiB would pass it, so the cache is "
        "released and the 40 MiB segment allocated on the retry (1); a further 30 MiB finds nothing to "
        "release: the retry (2) fails and it is an OOM (1)",
        (("malloc", "a", 30 * MIB), ("free", "a"), ("malloc", "b", 40 * MIB), ("oom", 30 * MIB)),
        {RESERVED_PEAK: 40 * MIB, RESERVED: 40 * MIB, ALLOCATED: 40 * MIB, RETRIES: 2, OOMS: 1, SEGMENTS: 1},
        allowed_mib=64),
    AllocatorSequence(
        "expandable segments", "3 MiB maps one 20 MiB page and is split off it (17 MiB free); 18 MiB fits no "
        "free block, so the next page is mapped after the free 17 MiB and the two merge (37 MiB), 18 MiB "
        "split off; expandable blocks never count as inactive split",
        (("malloc", "a", 3 * MIB), ("malloc", "b", 18 * MIB)),
        {RESERVED_PEAK: 40 * MIB, ALLOCATED: 21 * MIB, INACTIVE_SPLIT: 0}, conf="expandable_segments:True"),
    AllocatorSequence(
        "garbage collection threshold", "allowed 100 MiB, threshold 0.5: with 60 MiB reserved, a 32 MiB "
        "request no cached block serves first frees the cached 30 MiB segment (unsplit, aged 1 >= the mean "
        "age 1): 62 MiB reserved, not 92",
        (("malloc", "a", 30 * MIB), ("malloc", "b", 30 * MIB), ("free", "a"), ("malloc", "c", 32 * MIB)),
        {RESERVED_PEAK: 62 * MIB, RESERVED: 62 * MIB, ALLOCATED: 62 * MIB, SEGMENTS: 2, RETRIES: 0},
        conf="garbage_collection_threshold:0.5", allowed_mib=100),
    AllocatorSequence(
        "roundup_power2_divisions", "4 divisions: 5 MiB + 1 B rounds to 6 MiB (steps of 1 MiB above 4 MiB), "
        "1,200,000 B to 1.25 MiB (steps of 256 KiB above 1 MiB); both from one 20 MiB segment",
        (("malloc", "a", 5 * MIB + 1), ("malloc", "b", 1_200_000)),
        {RESERVED_PEAK: 20 * MIB, ALLOCATED: 7 * MIB + 256 * KIB, INACTIVE_SPLIT: 12 * MIB + 768 * KIB,
         SEGMENTS: 1}, conf="roundup_power2_divisions:4"),
    AllocatorSequence(
        "record_stream defers the free", "12 MiB used on a busy side stream and freed: its block waits for "
        "the stream's event, so a second 12 MiB gets a new segment (24 MiB reserved); after a synchronize, "
        "the next malloc's process_events frees the first block and 4 MiB is split from it (8 MiB left) "
        "instead of taking a new 20 MiB segment",
        (("malloc", "a", 12 * MIB), ("busy", 1), ("record", "a", 1), ("free", "a"), ("malloc", "b", 12 * MIB),
         ("sync",), ("malloc", "c", 4 * MIB)),
        {RESERVED_PEAK: 24 * MIB, ALLOCATED: 16 * MIB, INACTIVE_SPLIT: 8 * MIB, SEGMENTS: 2}),
    AllocatorSequence(
        "per-stream pools", "a 12 MiB block freed on a side stream serves that stream only: 4 MiB on the "
        "default stream takes a new 20 MiB segment (split, 16 MiB left), and 12 MiB on the side stream "
        "reuses the freed block",
        (("malloc", "a", 12 * MIB, 1), ("free", "a"), ("malloc", "b", 4 * MIB), ("malloc", "c", 12 * MIB, 1)),
        {RESERVED_PEAK: 32 * MIB, ALLOCATED: 16 * MIB, INACTIVE_SPLIT: 16 * MIB, SEGMENTS: 2}),
    AllocatorSequence(
        "empty_cache keeps split segments", "a 3 MiB block split from a 20 MiB segment and a whole 30 MiB "
        "segment; after freeing the 30 MiB one, empty_cache returns it and keeps the 20 MiB one (in use)",
        (("malloc", "a", 3 * MIB), ("malloc", "b", 30 * MIB), ("free", "b"), ("empty_cache",)),
        {RESERVED_PEAK: 50 * MIB, RESERVED: 20 * MIB, ALLOCATED: 3 * MIB, INACTIVE_SPLIT: 17 * MIB,
         SEGMENTS: 1}),
    AllocatorSequence(
        "large_segment_size_mb", "32 MiB large segments: 3 MiB takes a 32 MiB segment (29 MiB left, split); "
        "max_split_size and max_non_split_rounding default to it",
        (("malloc", "a", 3 * MIB),),
        {RESERVED_PEAK: 32 * MIB, ALLOCATED: 3 * MIB, INACTIVE_SPLIT: 29 * MIB, SEGMENTS: 1},
        conf="large_segment_size_mb:32"),
)


class SequenceFailed(AssertionError):
    """An operation did not do what the sequence says (an "oom" that allocated)."""


def run_on_model(sequence: AllocatorSequence, model_type=CachingAllocatorModel) -> Dict[str, int]:
    """The sequence through the allocator model: its statistics at the end, for the expected keys."""
    allowed = None if sequence.allowed_mib is None else sequence.allowed_mib * MIB
    model = model_type(MODEL_CAPACITY_BYTES, AllocatorSettings.parse(sequence.conf), allowed_bytes=allowed)
    run_ops(model, sequence.ops, SimulatedOutOfMemory)
    stats = model.memory_stats()
    return {key: stats.get(key, 0) for key in sequence.expected}


def run_ops(allocator, ops: Tuple[tuple, ...], out_of_memory: Type[BaseException]) -> None:
    """Apply a sequence's operations to `allocator`: the model, or anything with its methods (malloc(bytes,
    key, stream), free, record_stream, stream_busy, synchronize, empty_cache), such as torch.cuda behind
    bench/gpucheck/sequences.py. An "oom" must raise `out_of_memory`."""
    for op in ops:
        kind = op[0]
        if kind == "malloc":
            allocator.malloc(op[2], op[1], op[3] if len(op) > 3 else 0)
        elif kind == "free":
            allocator.free(op[1])
        elif kind == "record":
            allocator.record_stream(op[1], op[2])
        elif kind == "busy":
            allocator.stream_busy(op[1])
        elif kind == "sync":
            allocator.synchronize()
        elif kind == "empty_cache":
            allocator.empty_cache()
        elif kind == "oom":
            _expect_out_of_memory(allocator, op[1], out_of_memory)
        else:
            raise ValueError(f"unknown allocator sequence operation {op!r}")


def _expect_out_of_memory(allocator, nbytes: int, out_of_memory: Type[BaseException]) -> None:
    try:
        allocator.malloc(nbytes, ("oom", nbytes), 0)
    except out_of_memory:
        return
    raise SequenceFailed(f"{nbytes:,} B allocated where an OOM was expected")
