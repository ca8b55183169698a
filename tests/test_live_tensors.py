"""Exact live-tensor accounting: byte counts, frees, retagging, emulated OOM, deferred comm frees."""
from __future__ import annotations

import threading

import pytest
import torch

from bench.accounting.live_tensors import LiveTensorTracker

CPU = torch.device("cpu")


def tracker(capacity: int = 10**9) -> LiveTensorTracker:
    return LiveTensorTracker(CPU, capacity, rank=0)


def test_counts_new_storages_once_and_frees_them():
    tr = tracker()
    with tr:
        a = torch.ones(1000)                       # 4000 B
        b = a * 2                                  # 4000 B
        view = b.view(10, 100)                     # a view: same storage, nothing new
        assert tr.live_bytes == 8000
        del b, view
        assert tr.live_bytes == 4000
        c = torch.zeros(10, dtype=torch.float64)   # 80 B
        assert tr.live_bytes == 4080
    assert tr.peak_bytes == 8000
    assert tr.by_category == {"other": 4080}
    del a, c


def test_autograd_backward_is_counted_exactly():
    tr = tracker()
    x = torch.randn(100, 100, requires_grad=True)  # created outside: not counted
    with tr:
        y = (x * x).sum()
        y.backward()
    # what stays: y (4 B) and x.grad (40,000 B); x*x (40,000 B) lived until backward freed it
    assert tr.live_bytes == 40_004
    assert tr.peak_bytes >= 80_004


def test_categories_follow_the_current_phase_and_retagging():
    tr = tracker()
    weight = torch.zeros(250)  # 1000 B created before tracking
    with tr:
        tr.track(weight.untyped_storage(), "embedding_weights")
        tr.category = "activations"
        act = torch.ones(100)
        tr.track(act.untyped_storage(), "dense_grads")  # moved, not counted twice
        assert tr.by_category == {"embedding_weights": 1000, "activations": 0, "dense_grads": 400}
        assert tr.live_bytes == 1400
    del act


def test_capacity_raises_out_of_memory_with_exact_request():
    tr = tracker(capacity=10_000)
    with tr:
        keep = torch.ones(2000)  # 8000 B
        with pytest.raises(torch.OutOfMemoryError, match=r"Tried to allocate .*\(4000 bytes\)"):
            torch.ones(1000)
        assert tr.live_bytes == 8000  # the refused output is not counted
    del keep


def test_frees_of_collective_buffers_wait_for_the_phase_end():
    tr = tracker()
    with tr:
        buf = torch.ones(256)  # 1024 B
        tr._comm_touched.add(buf.untyped_storage()._cdata)
        del buf
        assert tr.live_bytes == 1024  # released, but counted until flush
        tr.flush_deferred()
        assert tr.live_bytes == 0


def test_free_on_another_thread_is_deferred_not_raced():
    tr = tracker()
    with tr:
        holder = [torch.ones(256)]
    worker = threading.Thread(target=holder.clear)
    worker.start()
    worker.join()
    assert tr.live_bytes == 1024
    tr.flush_deferred()
    assert tr.live_bytes == 0


def test_other_devices_are_ignored():
    tr = tracker()
    with tr:
        torch.empty(1000, device="meta")
        assert tr.live_bytes == 0
