"""Size rules of the CUDA caching allocator: the constants at the top of c10/cuda/CUDACachingAllocator.cpp,
`round_size` with `roundup_power2_next_division`, `get_pool` (which pool a size belongs to) and
`get_allocation_size`, plus AcceleratorAllocatorConfig::roundup_power2_divisions (which divisions apply to a
size). Pure integer arithmetic, O(1) per call."""
from __future__ import annotations

from typing import Sequence

KIB = 1024
MIB = 1024 * 1024

# the source's constants (CUDACachingAllocator.cpp, namespace Native)
kMinBlockSize = 512  # all sizes are rounded to at least 512 bytes
kSmallSize = 1 * MIB  # largest "small" allocation is 1 MiB
kSmallBuffer = 2 * MIB  # "small" allocations are packed in 2 MiB blocks
kLargeBuffer = 20 * MIB  # "large" allocations may be packed in 20 MiB blocks
kMinLargeAlloc = 10 * MIB  # allocations between 1 and 10 MiB may use kLargeBuffer
kRoundLarge = 2 * MIB  # round up large allocations to 2 MiB

# max_split_size defaults to std::numeric_limits<size_t>::max(): no block is "oversize"
SIZE_MAX = (1 << 64) - 1

# roundup_power2_divisions keeps one entry per power-of-two interval from 1 MiB to 64 GiB
# (c10/core/AllocatorConfig.cpp: kRoundUpPowerOfTwoIntervals, kRoundUpPowerOfTwoStart/End)
ROUNDUP_INTERVALS = 16
_ROUNDUP_START_LOG2 = 20  # log2(1 MiB)


def roundup_power2_divisions_for(size: int, division_table: Sequence[int]) -> int:
    """AcceleratorAllocatorConfig::roundup_power2_divisions(size): the divisions configured for the
    power-of-two interval `size` falls in (sizes under 1 MiB use the first entry, over 64 GiB the last)."""
    log_size = size.bit_length() - 1
    index = log_size - _ROUNDUP_START_LOG2 if log_size > _ROUNDUP_START_LOG2 else 0
    return division_table[min(index, ROUNDUP_INTERVALS - 1)]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """The source's roundup_power2_next_division: `size` rounded up to the next of `divisions` equal steps
    between the powers of two around it (1200 with 4 divisions: steps 1024, 1280, 1536, 1792 -> 1280)."""
    if size & (size - 1) == 0:  # llvm::isPowerOf2_64
        return size
    if divisions < 2:
        raise ValueError("Only 2 or more divisions are supported")
    power2_floor = 1 << (size.bit_length() - 1)  # llvm::PowerOf2Floor
    # power2_floor >> (63 - countLeadingZeros(divisions)), i.e. >> floor(log2(divisions))
    power2_division = power2_floor >> (divisions.bit_length() - 1)
    if power2_division == 0:
        return power2_floor << 1
    round_size_floor = size & ~(power2_division - 1)
    return size if round_size_floor == size else round_size_floor + power2_division


def round_size(size: int, division_table: Sequence[int] = ()) -> int:
    """The source's round_size: at least kMinBlockSize; a multiple of 512 bytes, or, where divisions > 1
    are configured for the size's interval and size > 512 * divisions, the next power-of-two division."""
    if size < kMinBlockSize:
        return kMinBlockSize
    if division_table:
        divisions = roundup_power2_divisions_for(size, division_table)
        if divisions > 1 and size > kMinBlockSize * divisions:
            return roundup_power2_next_division(size, divisions)
    return kMinBlockSize * ((size + kMinBlockSize - 1) // kMinBlockSize)


def is_small_size(rounded_size: int) -> bool:
    """get_pool: rounded sizes up to kSmallSize (1 MiB) belong to the small pool, larger ones to the large."""
    return rounded_size <= kSmallSize


def get_allocation_size(rounded_size: int, large_segment_size: int = kLargeBuffer) -> int:
    """The source's get_allocation_size: the segment cudaMalloc'd for a request no cached block serves.
    Small requests get a 2 MiB segment; requests under 10 MiB a large segment (20 MiB unless
    large_segment_size_mb is set); larger ones their size rounded up to 2 MiB."""
    if rounded_size <= kSmallSize:
        return kSmallBuffer
    if rounded_size < kMinLargeAlloc:
        return large_segment_size
    return kRoundLarge * ((rounded_size + kRoundLarge - 1) // kRoundLarge)


def format_size(size: int) -> str:
    """c10's format_size, as the OOM message prints sizes (2 decimals; bytes, KiB, MiB or GiB)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= MIB:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1024 * MIB:
        return f"{size / MIB:.2f} MiB"
    return f"{size / (1024.0 * MIB):.2f} GiB"
