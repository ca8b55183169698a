"""The allocator's history and state in torch.cuda.memory._snapshot()'s layout.

record_trace keeps (action, address, size) tuples in a ring buffer, as the source's TraceEntryRingBuffer
keeps TraceEntry's (the oldest dropped past `max_entries`); the dicts are built only when a snapshot is taken.
Field names follow torch/csrc/cuda/Module.cpp (THCPModule_memorySnapshot) and the Snapshot / Segment /
Block / TraceEntry types documented in torch/cuda/memory.py: an "oom" entry carries `device_free` where the
others carry `addr`. Frames are empty lists (no Python stacks are modelled); there are no timestamps
(`time_us`), which keeps the model deterministic."""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Tuple

from bench.accounting.caching_allocator.blocks import Block

ALLOC, FREE_REQUESTED, FREE_COMPLETED = "alloc", "free_requested", "free_completed"
SEGMENT_ALLOC, SEGMENT_FREE = "segment_alloc", "segment_free"
SEGMENT_MAP, SEGMENT_UNMAP = "segment_map", "segment_unmap"  # expandable segments' pages
SNAPSHOT, OOM = "snapshot", "oom"

DEVICE, STREAM = 0, 0  # one device; trace entries name the default stream
POOL_ID = (0, 0)  # the default pool's MempoolId_t (no private pools are modelled)


class TraceRecorder:
    """The TraceEntryRingBuffer; `max_entries` 0 records nothing, None keeps everything."""

    def __init__(self, max_entries: Optional[int]):
        self.enabled = max_entries != 0
        self._entries: Deque[Tuple[str, int, int]] = deque(maxlen=max_entries)

    def record(self, action: str, address: int, size: int) -> None:
        if self.enabled:
            self._entries.append((action, address, size))

    def entries(self) -> List[Dict]:
        result = []
        for action, address, size in self._entries:
            entry = {"action": action, "device_free" if action == OOM else "addr": address, "size": size,
                     "stream": STREAM, "frames": [], "pool_id": POOL_ID}
            result.append(entry)
        return result


def _block_state(block: Block) -> str:
    if block.allocated:
        return "active_allocated"
    return "inactive" if block.is_free() else "active_pending_free"  # freed, waiting for another stream


def _segment_dict(head: Block) -> Dict:
    """One SegmentInfo: the mapped run of blocks from `head` (a whole cudaMalloc'd segment, or one
    contiguous mapped range of an expandable segment, as DeviceCachingAllocator::snapshot reports them)."""
    blocks, total, allocated, active, requested = [], 0, 0, 0, 0
    block: Optional[Block] = head
    while block is not None and block.mapped:
        blocks.append({"address": block.address, "size": block.size, "requested_size": block.requested_size,
                       "state": _block_state(block), "frames": []})
        total += block.size
        if block.allocated:
            allocated += block.size
            requested += block.requested_size
        if not block.is_free():
            active += block.size
        block = block.next
    return {"device": DEVICE, "address": head.address, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": head.stream,
            "segment_type": "small" if head.pool.is_small else "large", "segment_pool_id": POOL_ID,
            "is_expandable": head.expandable_segment is not None, "frames": [], "blocks": blocks}


def segment_dicts(all_blocks: Iterable[Block]) -> List[Dict]:
    """The snapshot's segments, by address: each starts at a mapped block with no mapped block before it."""
    heads = [block for block in all_blocks if block.prev is None or not block.prev.mapped]
    return [_segment_dict(head) for head in sorted(heads, key=lambda block: block.address)]
