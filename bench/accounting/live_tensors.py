"""Exact live-tensor accounting on one device, by storage, with emulated capacity.

A TorchDispatchMode sees every op output on its thread (forward, CPU backward, optimizer), so each
new storage is counted once when it appears and uncounted by a weakref callback when it dies. The
numbers are a pure function of the ops run, hence byte-identical across runs of the same config;
they count tensors, not allocator behaviour (no fragmentation or kernel scratch).

With an `allocator` (a model of PyTorch's CUDA caching allocator: bench.accounting.caching_allocator),
every storage that appears is also allocated in the model and every one that goes is freed there, in
the same order; the model raises when it cannot place one, which becomes a torch.OutOfMemoryError at
that op, as on a GPU.

Frees are applied when they happen, on the training thread. The one thread that could otherwise drop a
storage's last reference at a moment that varies from run to run is gloo's worker, which holds a
collective's tensors until a moment after the collective completes; so each collective is completed where
it is launched (bench.accounting.collectives), after which only the training thread frees, at the same
point of the program in every run. A free that still arrives from another thread (none is expected) is
counted in `late_frees` and applied at the end of its phase.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from typing import Callable, Dict, Iterable, Optional

import torch
from torch.utils._pytree import tree_iter

from bench.accounting.caching_allocator import SimulatedOutOfMemory
from bench.accounting.collectives import complete_collectives
from bench.accounting.dispatch_mode import DispatchMode, op_tensors
from bench.accounting.oom import format_emulated_oom, format_simulated_oom

# layouts are singletons: `is` against these is the cheap test on every op's outputs
_STRIDED = torch.strided
_SPARSE_COO = torch.sparse_coo


def _strided_tensors(values):
    """_strided over the tensors among `values` (the tracker's callers hand over lists that may hold others)."""
    return _strided(value for value in values if isinstance(value, torch.Tensor))


def _strided(tensors):
    """The tensors among `tensors` that own storage; a sparse COO tensor counts as its indices + values."""
    for tensor in tensors:
        layout = tensor.layout
        if layout is _STRIDED:
            yield tensor
        elif layout is _SPARSE_COO:
            yield tensor._indices()
            yield tensor._values()


class LiveTensorTracker(DispatchMode):
    """Counts live bytes per category on `device`; raises torch.OutOfMemoryError past `capacity_bytes`, or
    when the `allocator` model cannot place a storage."""

    def __init__(self, device: torch.device, capacity_bytes: int, rank: int,
                 on_new_peak: Optional[Callable[[], None]] = None, allocator=None):
        super().__init__()
        self.allocator = allocator
        self.device = device
        self._device_is_cpu = device.type == "cpu"
        self.capacity_bytes = capacity_bytes
        self.rank = rank
        self.category = "other"  # what new storages are charged to (set by the recorder per phase)
        self.live_bytes = 0
        self.peak_bytes = 0
        self.phase_peak_bytes = 0  # reset by the recorder at each phase start
        self.by_category: Dict[str, int] = {}
        # storage cdata -> [nbytes, category, weakref]; cdata identifies a live C++ storage uniquely
        self._entries: Dict[int, list] = {}
        self._on_new_peak = on_new_peak
        # entries released on another thread, waiting for `flush_deferred`; how many there were in all
        self._deferred: list = []
        self.late_frees = 0
        # collectives whose gloo threads were not seen to let go (their frees may come late)
        self.unsettled_collectives = 0
        self._owner_thread = threading.get_ident()
        self._frozen = False
        # the allocator model's key of each allocation: a count, since a deferred free may still hold a
        # cdata that a new storage already reuses
        self._allocations = itertools.count(1)

    # -- accounting ------------------------------------------------------------------------------
    def _charge(self, category: str, nbytes: int) -> None:
        self.by_category[category] = self.by_category.get(category, 0) + nbytes
        self.live_bytes += nbytes
        if self.live_bytes > self.phase_peak_bytes:
            self.phase_peak_bytes = self.live_bytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            if self._on_new_peak is not None:
                self._on_new_peak()

    def freeze(self) -> None:
        """Counting is over: storages that die from now on change nothing, here or in the allocator model (whose
        snapshot is written after the counting stops, while the garbage collector may still free tensors)."""
        self._frozen = True

    def _release(self, cdata: int, ref: weakref.ref) -> None:
        if self._frozen:
            return
        entry = self._entries.get(cdata)
        if entry is None or entry[2] is not ref:
            return
        del self._entries[cdata]  # frees the slot at once: the address may be reused right away
        if threading.get_ident() != self._owner_thread:
            # Only list operations here: this runs on a backend thread, counters are not touched.
            self._deferred.append(entry)
            return
        self._uncharge(entry)

    def _uncharge(self, entry: list, release: bool = True) -> None:
        self.by_category[entry[1]] -= entry[0]
        self.live_bytes -= entry[0]
        if release and self.allocator is not None:
            self.allocator.free(entry[3])

    def _allocate(self, nbytes: int) -> Optional[int]:
        """Place a new storage in the allocator model (when there is one): its key there; the model's refusal
        is an OOM here."""
        if self.allocator is None:
            return None
        key = next(self._allocations)
        try:
            self.allocator.malloc(nbytes, key)
        except SimulatedOutOfMemory as oom:
            raise torch.OutOfMemoryError(format_simulated_oom(oom, self.rank)) from None
        return key

    def flush_deferred(self) -> None:
        """Apply the frees that arrived from other threads during the phase that is ending."""
        while self._deferred:
            self.late_frees += 1
            self._uncharge(self._deferred.pop())

    def _on_device(self, storage: torch.UntypedStorage) -> bool:
        return storage.device == self.device

    def track(self, storage: torch.UntypedStorage, category: str) -> None:
        """Count `storage` under `category`, or move it there if already counted."""
        if not self._on_device(storage):
            return
        cdata = storage._cdata
        entry = self._entries.get(cdata)
        nbytes = storage.nbytes()
        if entry is None:
            self._track_new_storage(storage, cdata, nbytes, category)
            return
        if entry[1] != category or entry[0] != nbytes:
            resized = entry[0] != nbytes  # resized in place: the allocator sees a new block; retagged: nothing
            self._uncharge(entry, release=resized)
            if resized:
                entry[3] = self._allocate(nbytes)
            entry[0], entry[1] = nbytes, category
            self._charge(category, nbytes)

    def _track_new_storage(self, storage: torch.UntypedStorage, cdata: int, nbytes: int, category: str) -> None:
        key = self._allocate(nbytes)
        ref = weakref.ref(storage, lambda r, c=cdata: self._release(c, r))
        self._entries[cdata] = [nbytes, category, ref, key]
        self._charge(category, nbytes)

    def track_tensors(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        for tensor in _strided_tensors(tensors):
            self.track(tensor.untyped_storage(), category)

    def track_new(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Count the storages of `tensors` that are not counted yet under `category` (counted ones keep theirs):
        what was made outside any op the mode sees, such as tensors wrapped from numpy arrays."""
        for tensor in _strided_tensors(tensors):
            storage = tensor.untyped_storage()
            if storage._cdata not in self._entries:
                self.track(storage, category)

    def recharge(self, category: str, new_category: Optional[str]) -> None:
        """Move every live storage of `category` to `new_category`; None stops counting them (they leave the
        allocator model too), as if they had never been tracked."""
        for cdata, entry in list(self._entries.items()):
            if entry[1] != category:
                continue
            if new_category is None:
                del self._entries[cdata]
                self._uncharge(entry)
            else:
                self.by_category[category] -= entry[0]
                self.by_category[new_category] = self.by_category.get(new_category, 0) + entry[0]
                entry[1] = new_category
        if not self.by_category.get(category):
            self.by_category.pop(category, None)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def reset_phase_peak(self) -> None:
        self.phase_peak_bytes = self.live_bytes

    # -- interception ----------------------------------------------------------------------------
    def _on_tracked_device(self, tensor: torch.Tensor) -> bool:
        return tensor.is_cpu if self._device_is_cpu else tensor.device == self.device

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **kwargs) if kwargs else func(*args)
        if func.namespace == "c10d" and threading.get_ident() == self._owner_thread:
            if not complete_collectives(tree_iter(out)):
                self.unsettled_collectives += 1
        new_bytes = 0
        fresh = []  # (storage, its cdata, its bytes): not counted yet, or counted at another size (resized in place)
        entries = self._entries
        for tensor in _strided(op_tensors(out)):
            if not self._on_tracked_device(tensor):
                continue
            storage = tensor.untyped_storage()
            cdata, nbytes = storage._cdata, storage.nbytes()
            entry = entries.get(cdata)
            if entry is None or entry[0] != nbytes:  # new, or resized in place (resize_, out= ops)
                new_bytes += nbytes if entry is None else nbytes - entry[0]
                fresh.append((storage, cdata, nbytes))
        if not fresh:
            return out
        if new_bytes and self.live_bytes + new_bytes > self.capacity_bytes:
            # The op ran, but a device with this capacity could not have held its output.
            raise torch.OutOfMemoryError(
                format_emulated_oom(new_bytes, self.rank, self.capacity_bytes, self.live_bytes))
        for storage, cdata, nbytes in fresh:
            if cdata in entries:  # resized in place, or a storage that appears twice among the outputs
                self.track(storage, self.category)
            else:
                self._track_new_storage(storage, cdata, nbytes, self.category)
        return out
