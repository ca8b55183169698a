"""Exact live-tensor accounting on one device, by storage, with emulated capacity.

A TorchDispatchMode sees every op output on its thread (forward, CPU backward, optimizer), so each
new storage is counted once when it appears and uncounted by a weakref callback when it dies. The
numbers are a pure function of the ops run, hence byte-identical across runs of the same config;
they count tensors, not allocator behaviour (no fragmentation or kernel scratch).

With an `allocator` (a model of PyTorch's CUDA caching allocator: bench.accounting.caching_allocator),
every storage that appears is also allocated in the model and every one that goes is freed there, in
the same order; the model raises when it cannot place one, which becomes a torch.OutOfMemoryError at
that op, as on a GPU.

One source of run-to-run noise needs a rule: a tensor handed to a collective (a c10d op) may be
released by the backend's own thread (gloo) a few microseconds before or after the training thread
moves on. Such frees are therefore applied at the end of the phase in which they happen (see
`flush_deferred`), which makes the accounting deterministic at the cost of counting those buffers
slightly longer than they live.
"""
from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Callable, Dict, Iterable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter

from bench.accounting.caching_allocator import SimulatedOutOfMemory
from bench.accounting.oom import format_emulated_oom, format_simulated_oom


def _strided(values):
    """The tensors among `values` that own storage; a sparse COO tensor counts as its indices + values."""
    for value in values:
        if not isinstance(value, torch.Tensor):
            continue
        if value.layout == torch.sparse_coo:
            yield value._indices()
            yield value._values()
        elif value.layout == torch.strided:
            yield value


SETTLE_PAUSE_S = 0.001
SETTLE_QUIET_ROUNDS = 2
SETTLE_MAX_ROUNDS = 40


class LiveTensorTracker(TorchDispatchMode):
    """Counts live bytes per category on `device`; raises torch.OutOfMemoryError past `capacity_bytes`, or
    when the `allocator` model cannot place a storage."""

    def __init__(self, device: torch.device, capacity_bytes: int, rank: int,
                 on_new_peak: Optional[Callable[[], None]] = None, allocator=None):
        super().__init__()
        self.allocator = allocator
        self.device = device
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
        # storages that went through a collective, and released entries waiting for `flush_deferred`
        self._comm_touched: set = set()
        self._deferred: list = []
        self._owner_thread = threading.get_ident()
        self._comm_in_phase = False
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

    def _release(self, cdata: int, ref: weakref.ref) -> None:
        entry = self._entries.get(cdata)
        if entry is None or entry[2] is not ref:
            return
        del self._entries[cdata]  # frees the slot at once: the address may be reused right away
        if cdata in self._comm_touched or threading.get_ident() != self._owner_thread:
            # Only list operations here: this may run on a backend thread, counters are not touched.
            self._comm_touched.discard(cdata)
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
        """Apply the frees of collective buffers released during the phase that is ending."""
        if self._comm_in_phase:
            self._settle()
            self._comm_in_phase = False
        while self._deferred:
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
            key = self._allocate(nbytes)
            ref = weakref.ref(storage, lambda r, c=cdata: self._release(c, r))
            self._entries[cdata] = [nbytes, category, ref, key]
            self._charge(category, nbytes)
            return
        if entry[1] != category or entry[0] != nbytes:
            resized = entry[0] != nbytes  # resized in place: the allocator sees a new block; retagged: nothing
            self._uncharge(entry, release=resized)
            if resized:
                entry[3] = self._allocate(nbytes)
            entry[0], entry[1] = nbytes, category
            self._charge(category, nbytes)

    def track_tensors(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        for tensor in _strided(tensors):
            self.track(tensor.untyped_storage(), category)

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def reset_phase_peak(self) -> None:
        self.phase_peak_bytes = self.live_bytes

    def _settle(self) -> None:
        """Let backend threads finish releasing collective buffers before the phase is closed.

        A gloo thread that drops the last reference to a buffer must take the GIL to run the release
        (the storage's Python object and our weakref callback); while this thread runs Python it waits,
        so without this pause its release would land after the phase boundary in some runs only.
        Sleeping hands over the GIL; stop after SETTLE_QUIET_ROUNDS pauses in a row with no release.
        """
        quiet = 0
        for _ in range(SETTLE_MAX_ROUNDS):
            before = len(self._deferred)
            time.sleep(SETTLE_PAUSE_S)
            quiet = quiet + 1 if len(self._deferred) == before else 0
            if quiet >= SETTLE_QUIET_ROUNDS:
                return

    def _mark_comm(self, tree) -> None:
        self._comm_in_phase = True
        for tensor in _strided(tree_iter(tree)):
            self._comm_touched.add(tensor.untyped_storage()._cdata)

    # -- interception ----------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace == "c10d":
            self._mark_comm((args, kwargs, out))
        new_bytes = 0
        fresh = []
        for tensor in _strided(tree_iter(out)):
            storage = tensor.untyped_storage()
            if not self._on_device(storage):
                continue
            entry = self._entries.get(storage._cdata)
            if entry is None:
                new_bytes += storage.nbytes()
                fresh.append(storage)
            elif entry[0] != storage.nbytes():  # resized in place (resize_, out= ops)
                fresh.append(storage)
                new_bytes += storage.nbytes() - entry[0]
        if new_bytes and self.live_bytes + new_bytes > self.capacity_bytes:
            # The op ran, but a device with this capacity could not have held its output.
            raise torch.OutOfMemoryError(
                format_emulated_oom(new_bytes, self.rank, self.capacity_bytes, self.live_bytes))
        for storage in fresh:
            self.track(storage, self.category)
        return out
