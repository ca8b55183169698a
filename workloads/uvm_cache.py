"""Where a table shard's bytes live under each fbgemm compute kernel, and the HBM cache of UVM-caching tables:
the one place these formulas live.

- `fused`: weights and optimizer state in HBM.
- `fused_uvm`: weights and optimizer state in managed (UVM) memory: host memory the GPU reaches.
- `fused_uvm_caching`: the same in managed memory, plus an HBM cache of `caching_ratio` x the shard's rows
  (fbgemm's `lxu_cache_weights`, in the weights' dtype) and its bookkeeping (FBGEMM #3114):
  `cache_index_table_map` (int32 per row), `lxu_cache_state` and the LRU `lxu_state` (int64 per cache slot).
  fbgemm builds the cache in sets of CACHE_ASSOCIATIVITY slots and keeps the optimizer state out of it
  (`construct_split_state(..., cacheable=False)`): the state stays in managed memory.

torchrec's planner (`calculate_shard_storages`) sizes the bookkeeping as `rows x (4 + 16 x caching_ratio)`, the
same formula without the set rounding, and prices the cache with its optimizer state (`round(ddr x ratio)`
plus the optimizer multiplier) where fbgemm holds weights only: `torchrec_cache_bytes` gives its figure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from workloads.rules import ConfigError

FUSED, FUSED_UVM, FUSED_UVM_CACHING = "fused", "fused_uvm", "fused_uvm_caching"
UVM_KERNELS = (FUSED_UVM, FUSED_UVM_CACHING)
DEFAULT_CACHING_RATIO = 0.2  # torchrec's default cache load factor (CacheParams.load_factor)
CACHE_ASSOCIATIVITY = 32  # fbgemm's cache sets on NVIDIA GPUs (DEFAULT_ASSOC)
INDEX_BYTES_PER_ROW = 4  # cache_index_table_map: int32
STATE_BYTES_PER_SLOT = 8 + 8  # lxu_cache_state + lxu_state (LRU timestamps): int64 each


@dataclass(frozen=True)
class ShardTiers:
    """A shard's bytes by where they live: HBM (weights and state of a fused shard, a cached shard's cache and
    its bookkeeping) and managed host memory (a UVM shard's weights and state)."""
    hbm_weight_bytes: int = 0
    hbm_optimizer_bytes: int = 0
    cache_bytes: int = 0
    cache_state_bytes: int = 0
    host_bytes: int = 0

    @property
    def hbm_bytes(self) -> int:
        return self.hbm_weight_bytes + self.hbm_optimizer_bytes + self.cache_bytes + self.cache_state_bytes


def is_caching_ratio(ratio) -> bool:
    """A cache ratio torchrec takes: strictly between 0 and 1 (its planner refuses a cache load factor of 1.0
    for fused_uvm_caching; a whole-table cache is `fused`)."""
    return isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and 0 < ratio < 1


def validate_caching_ratio(ratio) -> None:
    """sharding.caching_ratio: null (torchrec's default) or a share of the rows in (0, 1)."""
    if ratio is not None and not is_caching_ratio(ratio):
        raise ConfigError("sharding.caching_ratio", ratio, "use a share of the rows in (0, 1), e.g. 0.2 (or null; "
                          "a whole-table cache is compute_kernel=fused)")


def effective_caching_ratio(ratio) -> float:
    return DEFAULT_CACHING_RATIO if ratio is None else float(ratio)


def cache_slots(rows: int, caching_ratio: float) -> int:
    """The rows fbgemm's cache holds for a shard of `rows`: caching_ratio x rows, in whole sets."""
    if rows <= 0 or caching_ratio <= 0:
        return 0
    sets = math.ceil(rows * caching_ratio / CACHE_ASSOCIATIVITY)
    return sets * CACHE_ASSOCIATIVITY


def cache_state_bytes(rows: int, slots: int) -> int:
    """The cache's bookkeeping (FBGEMM #3114): 4 B per table row + 8 + 8 B per cache slot."""
    return INDEX_BYTES_PER_ROW * rows + STATE_BYTES_PER_SLOT * slots


def cached_row_hbm_bytes(cols: int, bytes_per_element: int, caching_ratio: float) -> float:
    """The HBM one row of a cached shard costs on average: its share of the cache and of the bookkeeping."""
    return INDEX_BYTES_PER_ROW + caching_ratio * (cols * bytes_per_element + STATE_BYTES_PER_SLOT)


def shard_tiers(kernel: str, rows: int, cols: int, bytes_per_element: int, weight_bytes: int,
                optimizer_bytes: int, caching_ratio: float = DEFAULT_CACHING_RATIO) -> ShardTiers:
    """Where a shard of `rows` x `cols` (its weights and optimizer state already sized) lives under `kernel`."""
    if kernel not in UVM_KERNELS:
        return ShardTiers(hbm_weight_bytes=weight_bytes, hbm_optimizer_bytes=optimizer_bytes)
    if kernel == FUSED_UVM:
        return ShardTiers(host_bytes=weight_bytes + optimizer_bytes)
    slots = cache_slots(rows, caching_ratio)
    return ShardTiers(cache_bytes=slots * cols * bytes_per_element, cache_state_bytes=cache_state_bytes(rows, slots),
                      host_bytes=weight_bytes + optimizer_bytes)


def torchrec_cache_bytes(rows: int, weight_bytes: int, optimizer_multiplier: float, caching_ratio: float) -> int:
    """torchrec 1.8's HBM figure for a cached shard (`calculate_shard_storages` without its pipeline I/O): the
    cached share of the weights, that share times its optimizer multiplier, and the bookkeeping."""
    cached = round(weight_bytes * caching_ratio)
    return cached + math.ceil(cached * optimizer_multiplier) + math.ceil(rows * (4 + caching_ratio * 16))
