"""Blocks, block pools and expandable segments of the caching allocator (the source's Block, BlockPool,
ExpandableSegment) and try_merge_blocks.

A BlockPool's free blocks are kept as the source's std::set ordered by BlockComparatorSize (stream, size,
then address): a sorted list of (stream, size, address) keys searched with bisect (O(log n)) and edited
with list insert/delete (O(n) memmove, fast for the thousands of free blocks a training step leaves), plus
a dict from address to Block. Its unmapped blocks (expandable segments) are the set BlockComparatorAddress
orders (stream, then address), kept the same way. Streams are small integers, 0 the default stream."""
from __future__ import annotations

from bisect import bisect_left, insort
from typing import Dict, List, Optional, Set, Tuple

from bench.accounting.caching_allocator.stats import LARGE_POOL, SMALL_POOL


class Block:
    """A range of device memory: a whole segment or part of one (linked to its neighbours by prev/next).
    `mapped` is False only for address space of an expandable segment with no physical pages behind it."""
    __slots__ = ("address", "size", "requested_size", "pool", "allocated", "mapped", "prev", "next",
                 "gc_count_base", "expandable_segment", "stream", "stream_uses", "event_count")

    def __init__(self, address: int, size: int, pool: "BlockPool",
                 expandable_segment: Optional["ExpandableSegment"] = None, mapped: bool = True, stream: int = 0):
        self.address, self.size, self.pool = address, size, pool
        self.stream = stream  # the stream it was allocated on: only that stream's requests reuse it
        self.stream_uses: Set[int] = set()  # other streams record_stream named while it was allocated
        self.event_count = 0  # events not yet complete since its free: until 0, it is not free
        self.requested_size = 0
        self.allocated = False
        self.mapped = mapped
        self.prev: Optional[Block] = None
        self.next: Optional[Block] = None
        self.gc_count_base = 0  # pool.get_free_blocks_call_count when the block entered the pool
        self.expandable_segment = expandable_segment

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def splice(self, before: Optional["Block"], after: Optional["Block"]) -> None:
        """Block::splice: link this block between `before` and `after`, neighbours of each other."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after

    def is_free(self) -> bool:
        """Neither allocated nor waiting for another stream's work (the source's `allocatable`)."""
        return not self.allocated and self.event_count == 0 and not self.stream_uses

    def gc_count(self) -> int:
        """How many get_free_block calls on its pool this cached block has sat through."""
        return self.pool.get_free_blocks_call_count - self.gc_count_base


class BlockPool:
    """Free (cached) blocks of one pool, small or large, best fit first."""
    __slots__ = ("is_small", "stat_index", "_keys", "_by_address", "_unmapped_addresses", "_unmapped",
                 "get_free_blocks_call_count")

    def __init__(self, is_small: bool):
        self.is_small = is_small
        self.stat_index = SMALL_POOL if is_small else LARGE_POOL
        self._keys: List[Tuple[int, int, int]] = []  # (stream, size, address), sorted: BlockComparatorSize
        self._by_address: Dict[int, Block] = {}
        self._unmapped_addresses: List[Tuple[int, int]] = []  # (stream, address), sorted: BlockComparatorAddress
        self._unmapped: Dict[int, Block] = {}
        self.get_free_blocks_call_count = 0

    def __len__(self) -> int:
        return len(self._keys)

    def insert_into_blocks(self, block: Block) -> None:
        """BlockPool::insert_into_blocks: cache `block`, stamping the gc counter it is aged against."""
        block.gc_count_base = self.get_free_blocks_call_count
        insort(self._keys, (block.stream, block.size, block.address))
        self._by_address[block.address] = block

    def erase(self, block: Block) -> None:
        """pool.blocks.erase(block); call it before changing the block's size or address."""
        del self._keys[bisect_left(self._keys, (block.stream, block.size, block.address))]
        del self._by_address[block.address]

    def lower_bound(self, size: int, stream: int = 0) -> int:
        """Index of the first cached block not before (stream, size), lowest address first among equals (the
        search key's null pointer sorts before every block): the best fit when it is of `stream`; len(self)
        when there is none. Callers check the block's stream, as the source does."""
        return bisect_left(self._keys, (stream, size, 0))

    def block_at(self, index: int) -> Block:
        return self._by_address[self._keys[index][2]]

    def blocks(self) -> List[Block]:
        """The cached blocks in BlockComparatorSize order (a copy: callers release blocks while iterating)."""
        by_address = self._by_address
        return [by_address[address] for _, _, address in self._keys]

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._keys)

    def insert_unmapped(self, block: Block) -> None:
        insort(self._unmapped_addresses, (block.stream, block.address))
        self._unmapped[block.address] = block

    def erase_unmapped(self, block: Block) -> None:
        del self._unmapped_addresses[bisect_left(self._unmapped_addresses, (block.stream, block.address))]
        del self._unmapped[block.address]

    def unmapped_blocks(self, stream: int = 0) -> List[Block]:
        """The unmapped blocks of `stream`'s expandable segments from the lowest address up (a copy)."""
        start = bisect_left(self._unmapped_addresses, (stream, 0))
        blocks = []
        for block_stream, address in self._unmapped_addresses[start:]:
            if block_stream != stream:
                break
            blocks.append(self._unmapped[address])
        return blocks


class ExpandableSegment:
    """The source's ExpandableSegment: address space reserved for `page_count` pages of `page_size` bytes
    (2 MiB in the small pool, 20 MiB in the large), mapped and unmapped a page at a time. The model keeps no
    page handles: the blocks' `mapped` flags already say which pages are backed, and map/unmap only turn a
    byte range into the whole pages it covers (map) or the whole pages inside it (unmap)."""
    __slots__ = ("base", "page_size", "page_count")

    def __init__(self, base: int, page_size: int, page_count: int):
        self.base, self.page_size, self.page_count = base, page_size, page_count

    @property
    def size(self) -> int:
        return self.page_size * self.page_count

    def pages_to_map(self, address: int, size: int) -> Tuple[int, int]:
        """map(): from segmentLeft(ptr) to segmentRight(ptr + size): (address, bytes) of the pages covering
        [address, address + size). `address` is page aligned (unmapped blocks always are)."""
        begin = (address - self.base) // self.page_size
        end = -(-(address + size - self.base) // self.page_size)
        return self.base + begin * self.page_size, (end - begin) * self.page_size

    def pages_to_unmap(self, address: int, size: int) -> Tuple[int, int]:
        """unmap(): from segmentRight(ptr) to segmentLeft(ptr + size): (address, bytes) of the pages wholly
        inside [address, address + size); bytes 0 when no page is."""
        begin = -(-(address - self.base) // self.page_size)
        end = (address + size - self.base) // self.page_size
        if begin >= end:
            return address, 0
        return self.base + begin * self.page_size, (end - begin) * self.page_size


def try_merge_blocks(dst: Block, src: Optional[Block], pool: BlockPool) -> int:
    """The source's try_merge_blocks: fold the free neighbour `src` (no pending events or stream uses) into
    `dst` when both are mapped or both unmapped; `src` leaves its pool's set. Returns the bytes subsumed, 0
    when nothing merged."""
    if src is None or not src.is_free() or dst.mapped != src.mapped:
        return 0
    if src.mapped:
        pool.erase(src)
    else:
        pool.erase_unmapped(src)
    if dst.prev is src:  # [src dst]
        dst.address = src.address
        dst.prev = src.prev
        if dst.prev is not None:
            dst.prev.next = dst
    else:  # [dst src]
        dst.next = src.next
        if dst.next is not None:
            dst.next.prev = dst
    dst.size += src.size
    return src.size
