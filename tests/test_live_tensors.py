"""Exact live-tensor accounting: byte counts, frees, retagging, emulated OOM, collective buffers freed in step."""
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


@pytest.fixture
def gloo_group():
    """A one-rank gloo process group: its collectives run on gloo's worker threads, as in a real run."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield dist
    dist.destroy_process_group()


def test_collective_buffers_are_freed_when_the_training_thread_drops_them(gloo_group):
    """The input of an async all-to-all, dropped before the wait: the work holds it until the work itself is
    dropped. That free used to be held to the phase end (it had passed through a collective), and when
    gloo's worker dropped the work last it came from gloo's thread at a varying moment. Now the collective
    is completed at launch and the free happens at the training thread's `del work`, every time."""
    tr = tracker()
    with tr:
        for _ in range(20):
            received = torch.empty(1 << 16)
            sent = torch.ones(1 << 16)                 # 256 KiB each
            work = gloo_group.all_to_all_single(received, sent, async_op=True)
            del sent
            assert tr.live_bytes == 2 << 18            # the work still holds what it sends
            work.wait()
            del work
            assert tr.live_bytes == 1 << 18            # freed at once (before: 2 << 18 until the phase end)
            del received
            assert tr.live_bytes == 0
    assert tr.late_frees == 0 and tr.unsettled_collectives == 0


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


def test_gloo_threads_count_as_busy_while_they_run(tmp_path, monkeypatch):
    """The idle check reads the scheduler state of the threads named like gloo's: a thread of that name that
    is computing (outside the GIL, as gloo's workers do) keeps the tracker waiting; once it blocks, the wait
    ends."""
    import ctypes
    import hashlib

    from bench.accounting import collectives

    libc = ctypes.CDLL(None)
    named, computed, release = threading.Event(), threading.Event(), threading.Event()
    data = bytes(64 << 20)

    def gloo_like_worker():
        libc.prctl(15, b"pt_gloo_runloop", 0, 0, 0)  # PR_SET_NAME, as c10::setThreadName names gloo's workers
        named.set()
        for _ in range(8):
            hashlib.sha256(data).digest()  # about a second of work without the GIL
        computed.set()
        release.wait()

    worker = threading.Thread(target=gloo_like_worker, daemon=True)
    worker.start()
    named.wait()
    assert collectives._thread_states() != []
    assert not collectives.wait_until_gloo_idle(timeout_s=0.05)  # running
    computed.wait()
    assert collectives.wait_until_gloo_idle(timeout_s=5)         # blocked in Event.wait
    release.set()
    worker.join()
    monkeypatch.setattr(collectives, "TASKS_DIR", tmp_path / "absent")  # no /proc: never seen idle
    assert not collectives.wait_until_gloo_idle(timeout_s=0.05)


def test_frees_after_counting_stops_change_nothing_not_even_the_allocator_model():
    """A simulated device's snapshot is written after its recorder stops counting, while the garbage collector may
    still free tensors: those frees must not reach the allocator model (they once mutated its trace while the
    snapshot iterated it: 'deque mutated during iteration')."""
    from bench.accounting.caching_allocator import AllocatorSettings, CachingAllocatorModel

    model = CachingAllocatorModel(1 << 30, AllocatorSettings(), trace_max_entries=100)
    tracker = LiveTensorTracker(torch.device("cpu"), 1 << 30, rank=0, allocator=model)
    with tracker:
        kept = torch.ones(1000)
    entries = len(model.trace.entries())
    tracker.freeze()
    del kept
    assert tracker.live_bytes == 4000 and len(model.trace.entries()) == entries
    assert model.memory_stats()["allocated_bytes.all.current"] > 0


def test_gloo_threads_are_found_by_the_name_in_their_stat_line(monkeypatch, tmp_path):
    """One read of /proc/self/task/<tid>/stat gives a thread's name and state; a name may hold spaces and
    parentheses (the state follows the last ')')."""
    from bench.accounting import collectives

    lines = {"11": "11 (pt_gloo_runloop) S 1 2 3", "12": "12 (python) R 1 2 3", "13": "13 (gloo_tcp_loop) R 1",
             "14": "14 (odd (pt_gloo_runloop) x) R 1"}
    for tid, line in lines.items():
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "stat").write_text(line)
    monkeypatch.setattr(collectives, "TASKS_DIR", tmp_path)
    assert sorted(collectives._thread_states()) == ["R", "S"]
    assert not collectives.gloo_threads_idle()  # gloo_tcp_loop is running
    (tmp_path / "13" / "stat").write_text("13 (gloo_tcp_loop) D 1")
    assert collectives.gloo_threads_idle()


def test_resized_in_place_and_sparse_outputs_are_counted():
    """The op-output walk's two less common paths: a storage an op resizes in place (`out=`, resize_) is counted
    at its new size, and a sparse COO output as its indices + values."""
    tr = tracker()
    with tr:
        out = torch.empty(10)                                  # 40 B
        out.resize_(100)                                       # the same storage, now 400 B
        assert tr.live_bytes == 400
        torch.add(torch.ones(200), 1, out=out.resize_(0))      # resized by an out= op to 800 B; the ones die
        assert tr.live_bytes == 800
        sparse = torch.ones(4, 4).to_sparse()                  # 16 values (64 B) + 2x16 int64 indices (256 B)
        assert tr.live_bytes == 800 + 64 + 256
    del out, sparse


def test_op_outputs_are_walked_as_pytree_walks_them():
    from collections import namedtuple

    from torch.utils._pytree import tree_iter

    from bench.accounting.dispatch_mode import op_tensors

    a, b, c = torch.ones(1), torch.ones(2), torch.ones(3)
    pair = namedtuple("pair", "first second")
    outputs = [a, (a, b), [a, [b, c]], (None, 3, [b]), pair(a, [c]), {"x": a, "y": (b,)}, None, 7, 1.5,
               ([a, b], torch.float32, "s"), (pair(b, c), {"k": [c]})]
    for out in outputs:
        expected = [value for value in tree_iter(out) if isinstance(value, torch.Tensor)]
        assert [id(t) for t in op_tensors(out)] == [id(t) for t in expected], out


def test_membench_modes_run_their_dispatch_without_the_per_op_dynamo_wrapper():
    """torch wraps a mode's __torch_dispatch__ in torch._disable_dynamo unless the class opts out (about 5 us an
    op); membench's modes opt out, the plain torch mode is still wrapped (so the check can fail)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from bench.accounting.dispatch_mode import DispatchMode
    from bench.run.memory.memtracker import CollectiveSettler

    class Plain(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    assert hasattr(Plain.__torch_dispatch__, "__wrapped__")
    for mode in (LiveTensorTracker, CollectiveSettler):
        assert issubclass(mode, DispatchMode)
        assert not hasattr(mode.__torch_dispatch__, "__wrapped__"), mode
