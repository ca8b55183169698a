"""DeviceStats of the caching allocator and their torch.cuda.memory_stats() form.

A Stat is a 4-slot list [current, peak, allocated, freed] (increase_stat / decrease_stat of the source);
a stat array holds one Stat per StatType in the source's order: AGGREGATE ("all"), SMALL_POOL, LARGE_POOL.
Lists, not objects, because every malloc and free updates about ten of them."""
from __future__ import annotations

from typing import Dict, List

from bench.accounting.caching_allocator.sizes import SIZE_MAX

CURRENT, PEAK, ALLOCATED, FREED = 0, 1, 2, 3
AGGREGATE, SMALL_POOL, LARGE_POOL = 0, 1, 2
STAT_TYPE_NAMES = ("all", "small_pool", "large_pool")  # kStatTypeNames of torch/csrc/cuda/Module.cpp
STAT_FIELD_NAMES = ("current", "peak", "allocated", "freed")

# the StatArrays of DeviceStats, by the key torch.cuda.memory_stats() gives them
STAT_ARRAY_NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                    "active_bytes", "inactive_split_bytes", "requested_bytes")
SINGLE_STAT_NAMES = ("oversize_allocations", "oversize_segments")
COUNTER_NAMES = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                 "num_device_free", "num_oom_rejections")

Stat = List[int]


def new_stat() -> Stat:
    return [0, 0, 0, 0]


def increase(stat: Stat, amount: int) -> None:
    """increase_stat: current and the historical total grow; the peak follows the current."""
    current = stat[CURRENT] + amount
    stat[CURRENT] = current
    if current > stat[PEAK]:
        stat[PEAK] = current
    stat[ALLOCATED] += amount


def decrease(stat: Stat, amount: int) -> None:
    """decrease_stat: current falls, the historical total freed grows."""
    stat[CURRENT] -= amount
    stat[FREED] += amount


class DeviceStats:
    """The source's DeviceStats, with the pool-pair updates (for_each_selected_stat_type over AGGREGATE and
    the block's pool) as methods. `pool_index` is SMALL_POOL or LARGE_POOL."""

    def __init__(self, max_split_size: int):
        for name in STAT_ARRAY_NAMES:
            setattr(self, name, [new_stat(), new_stat(), new_stat()])
        self.oversize_allocations = new_stat()
        self.oversize_segments = new_stat()
        for name in COUNTER_NAMES:
            setattr(self, name, 0)
        # stats.max_split_size is an int64_t: SIZE_MAX (unset) reads -1, as torch reports it
        self.max_split_size = -1 if max_split_size == SIZE_MAX else max_split_size

    @staticmethod
    def increase_pool(stat_array: List[Stat], pool_index: int, amount: int) -> None:
        increase(stat_array[AGGREGATE], amount)
        increase(stat_array[pool_index], amount)

    @staticmethod
    def decrease_pool(stat_array: List[Stat], pool_index: int, amount: int) -> None:
        decrease(stat_array[AGGREGATE], amount)
        decrease(stat_array[pool_index], amount)

    def _all_stats(self) -> List[Stat]:
        stats = [stat for name in STAT_ARRAY_NAMES for stat in getattr(self, name)]
        return stats + [self.oversize_allocations, self.oversize_segments]

    def reset_peak(self) -> None:
        """resetPeakStats: every peak back to its current value."""
        for stat in self._all_stats():
            stat[PEAK] = stat[CURRENT]

    def reset_accumulated(self) -> None:
        """resetAccumulatedStats: the historical totals and the event counters back to 0."""
        for stat in self._all_stats():
            stat[ALLOCATED] = stat[FREED] = 0
        for name in COUNTER_NAMES:
            setattr(self, name, 0)

    def as_memory_stats(self) -> Dict[str, int]:
        """torch.cuda.memory_stats(): THCPModule_memoryStats's nested dict flattened with "." and sorted.
        num_oom_rejections is 0: the model never rejects before trying (torch's throw_on_cudamalloc_oom);
        reserved_bytes_by_private_pools adds no keys without private pools."""
        flat: Dict[str, int] = {name: getattr(self, name) for name in COUNTER_NAMES}
        flat["max_split_size"] = self.max_split_size
        for name in STAT_ARRAY_NAMES:
            for type_name, stat in zip(STAT_TYPE_NAMES, getattr(self, name)):
                for field, value in zip(STAT_FIELD_NAMES, stat):
                    flat[f"{name}.{type_name}.{field}"] = value
        for name in SINGLE_STAT_NAMES:
            for field, value in zip(STAT_FIELD_NAMES, getattr(self, name)):
                flat[f"{name}.{field}"] = value
        return dict(sorted(flat.items()))
