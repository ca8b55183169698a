"""An allocation stream: the mallocs and frees a run (or a dry run) sends to the allocator, in order, so it
can be replayed through the model under other settings or sizes before it (the planner, per rank), or through
the real torch.cuda allocator on a GPU (scripts/gpu_check.sh compares the two)."""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import islice
from typing import Dict, Hashable, Iterable, List, Mapping, Optional, Tuple

from bench.accounting.caching_allocator.model import CachingAllocatorModel
from bench.accounting.caching_allocator.settings import AllocatorSettings
from workloads.units import UNBOUNDED_BYTES

# one event: (key, bytes) allocates, (key, None) frees
Event = Tuple[Hashable, Optional[int]]


@dataclass
class AllocationStream:
    """Stands in for an allocator model and keeps what it is asked (the tracker's `allocator=`)."""
    events: List[Event] = field(default_factory=list)

    def malloc(self, nbytes: int, key: Hashable) -> int:
        self.events.append((key, nbytes))
        return 0

    def free(self, key: Hashable) -> None:
        self.events.append((key, None))

    def to_json(self) -> List[List[int]]:
        """[[key, bytes], [key, -1]]: keys made ints (the tracker's are already), -1 for a free."""
        ids: Dict[Hashable, int] = {}
        return [[ids.setdefault(key, len(ids)), -1 if nbytes is None else nbytes] for key, nbytes in self.events]

    @classmethod
    def from_json(cls, rows: Iterable[Iterable[int]]) -> "AllocationStream":
        return cls([(int(key), None if int(nbytes) < 0 else int(nbytes)) for key, nbytes in rows])


@dataclass(frozen=True)
class ReplayPeaks:
    """What a replay reached: torch's memory_stats() names, peaks over the whole stream."""
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    peak_inactive_split_bytes: int
    num_alloc_retries: int

    @classmethod
    def from_stats(cls, stats: Mapping[str, int]) -> "ReplayPeaks":
        """From torch.cuda.memory_stats() (or the model's, in the same layout)."""
        return cls(stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"],
                   stats["inactive_split_bytes.all.peak"], stats["num_alloc_retries"])

    @property
    def overhead_bytes(self) -> int:
        """Reserved beyond allocated at their peaks: what the allocator costs over the tensors."""
        return self.peak_reserved_bytes - self.peak_allocated_bytes


def replay(events: Iterable[Event], settings: AllocatorSettings, before: Iterable[int] = (),
           capacity_bytes: int = UNBOUNDED_BYTES, before_at: int = 0) -> ReplayPeaks:
    """Replay `events` through a fresh model, allocating the (never freed) sizes in `before` after the first
    `before_at` events (0: before them all)."""
    model = CachingAllocatorModel(capacity_bytes, settings, trace_max_entries=0)
    events = iter(events)
    _apply(model, islice(events, before_at))
    for index, nbytes in enumerate(before):
        if nbytes:
            model.malloc(nbytes, ("before", index))
    _apply(model, events)
    return ReplayPeaks.from_stats(model.memory_stats())


def _apply(model: CachingAllocatorModel, events: Iterable[Event]) -> None:
    for key, nbytes in events:
        if nbytes is None:
            model.free(key)
        else:
            model.malloc(nbytes, key)
