"""The caching allocator's end-of-life events (the source's cuda_events, insert_events, process_events and
synchronize_and_free_events): a block freed while other streams use it (record_stream) stays out of its
pool until an event recorded on each of those streams at the free has completed.

The model knows a stream's work only through what its caller says: `busy(stream)` (kernels were queued
there) and `synchronize(stream)` (they have run; torch.cuda.synchronize() for every stream). An event
recorded on a stream with nothing queued completes at once, as cudaEventQuery would find it."""
from __future__ import annotations

from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Set, Tuple

from bench.accounting.caching_allocator.blocks import Block


class StreamEvents:
    def __init__(self):
        # per stream, in record order: (the stream's synchronize count that completes it, or None: complete)
        self._pending: Dict[int, Deque[Tuple[Optional[int], Block]]] = {}
        self._busy: Set[int] = set()
        self._synchronized: Dict[int, int] = {}

    def __bool__(self) -> bool:
        """Does any freed block wait for an event (the simulated recorder's mallocs check this first)?"""
        return bool(self._pending)

    def busy(self, stream: int) -> None:
        self._busy.add(stream)

    def synchronize(self, streams: Optional[Iterable[int]] = None) -> None:
        """The work queued so far on `streams` (all when None) has run: their events complete."""
        for stream in list(self._busy if streams is None else streams):
            self._busy.discard(stream)
            self._synchronized[stream] = self._synchronized.get(stream, 0) + 1

    def record(self, block: Block) -> None:
        """insert_events: one event on each stream the block was used on; the uses are cleared."""
        for stream in sorted(block.stream_uses):
            done_at = self._synchronized.get(stream, 0) + 1 if stream in self._busy else None
            self._pending.setdefault(stream, deque()).append((done_at, block))
            block.event_count += 1
        block.stream_uses.clear()

    def completed(self) -> List[Block]:
        """process_events: the blocks whose last event has completed (each stream's events complete in order)."""
        freed = []
        for stream in sorted(self._pending):
            queue = self._pending[stream]
            while queue and (queue[0][0] is None or self._synchronized.get(stream, 0) >= queue[0][0]):
                freed.extend(_count_down(queue.popleft()[1]))
            if not queue:
                del self._pending[stream]
        return freed

    def wait_all(self) -> List[Block]:
        """synchronize_and_free_events: wait for every outstanding event; the blocks it frees."""
        freed = []
        for stream in sorted(self._pending):
            for _, block in self._pending[stream]:
                freed.extend(_count_down(block))
        self._pending.clear()
        self.synchronize()
        return freed

    def pending_blocks(self) -> List[Block]:
        """Blocks still waiting for an event (state "active_pending_free" in a snapshot), each once."""
        seen = {id(block): block for queue in self._pending.values() for _, block in queue}
        return list(seen.values())


def _count_down(block: Block) -> List[Block]:
    block.event_count -= 1
    return [block] if block.event_count == 0 else []
