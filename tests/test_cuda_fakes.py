"""CUDA / NVML / snapshot wrappers, exercised on CPU with fakes in place of the driver."""
from __future__ import annotations

import json
import os
import pickle
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bench.run.memory import cuda_stats, snapshot
from bench.run.memory.cuda_stats import CudaAllocatorStats, parse_memory_stats
from bench.run.memory.nvml import NvmlSample, NvmlSampler
from bench.accounting.oom import OomEvent, format_emulated_oom, parse_requested_bytes

GiB = 1 << 30
MiB = 1 << 20

# ---------------------------------------------------------------------------------------------
# cuda_stats


def _realistic_memory_stats() -> dict[str, int]:
    """Shape of torch.cuda.memory_stats() after some training steps (subset of its ~100 keys)."""
    stats: dict[str, int] = {}
    values = {
        "allocated_bytes": (3 * GiB, 5 * GiB),
        "reserved_bytes": (4 * GiB, 6 * GiB),
        "active_bytes": (3 * GiB + 10 * MiB, 5 * GiB + 10 * MiB),
        "inactive_split_bytes": (200 * MiB, 700 * MiB),
        "requested_bytes": (3 * GiB - 1234, 5 * GiB - 1234),
        "segment": (40, 55),
    }
    for name, (current, peak) in values.items():
        for pool, share in (("all", 1.0), ("large_pool", 0.9), ("small_pool", 0.1)):
            stats[f"{name}.{pool}.current"] = int(current * share)
            stats[f"{name}.{pool}.peak"] = int(peak * share)
            stats[f"{name}.{pool}.allocated"] = int(peak * share * 7)
            stats[f"{name}.{pool}.freed"] = int(peak * share * 7 - current * share)
    stats.update({"num_alloc_retries": 2, "num_ooms": 1, "num_sync_all_streams": 0,
                  "num_device_alloc": 60, "num_device_free": 5, "max_split_size": -1})
    return stats


def test_parse_memory_stats_reads_all_pool_counters() -> None:
    parsed = parse_memory_stats(_realistic_memory_stats())
    assert parsed == CudaAllocatorStats(
        allocated_bytes=3 * GiB,
        peak_allocated_bytes=5 * GiB,
        reserved_bytes=4 * GiB,
        peak_reserved_bytes=6 * GiB,
        active_bytes=3 * GiB + 10 * MiB,
        peak_active_bytes=5 * GiB + 10 * MiB,
        inactive_split_bytes=200 * MiB,
        peak_inactive_split_bytes=700 * MiB,
        num_alloc_retries=2,
        num_ooms=1,
    )
    as_dict = parsed.to_dict()
    assert as_dict["peak_reserved_bytes"] == 6 * GiB
    assert set(as_dict) == {
        "allocated_bytes", "peak_allocated_bytes", "reserved_bytes", "peak_reserved_bytes",
        "active_bytes", "peak_active_bytes", "inactive_split_bytes", "peak_inactive_split_bytes",
        "num_alloc_retries", "num_ooms",
    }
    assert all(type(v) is int for v in as_dict.values())
    json.dumps(as_dict)


def test_parse_memory_stats_empty_dict_before_cuda_init_is_all_zero() -> None:
    parsed = parse_memory_stats({})
    assert parsed == CudaAllocatorStats()
    assert set(parsed.to_dict().values()) == {0}


def test_stats_are_frozen() -> None:
    with pytest.raises(AttributeError):
        CudaAllocatorStats().allocated_bytes = 1  # type: ignore[misc]


def test_read_allocator_stats_and_reset_peak_call_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[tuple[str, Any]] = []

    def fake_memory_stats(device: Any) -> dict[str, int]:
        calls.append(("memory_stats", device))
        return {"allocated_bytes.all.current": 7, "num_ooms": 3}

    monkeypatch.setattr(torch.cuda, "memory_stats", fake_memory_stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: calls.append(("reset", d)))

    stats = cuda_stats.read_allocator_stats("cuda:1")
    cuda_stats.reset_peak(1)
    assert stats.allocated_bytes == 7 and stats.num_ooms == 3 and stats.reserved_bytes == 0
    assert calls == [("memory_stats", "cuda:1"), ("reset", 1)]


# ---------------------------------------------------------------------------------------------
# oom

OLD_CUDA = (
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity; "
    "75.12 GiB already allocated; 1.06 GiB free; 76.50 GiB reserved in total by PyTorch) "
    "If reserved memory is >> allocated memory try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
NEW_CUDA = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 3.06 MiB is free. Process 1234 has 79.09 GiB memory in use. "
    "Of the allocated memory 77.59 GiB is allocated by PyTorch, and 17.18 MiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
    "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
NEW_CUDA_NON_PYTORCH = (
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 14.57 GiB of "
    "which 1.58 GiB is free. Process 2493055 has 12.02 GiB memory in use. Including non-PyTorch "
    "memory, this process has 966.00 MiB memory in use."
)
OLD_CUDA_SMALL = (
    "RuntimeError: CUDA out of memory. Tried to allocate 36.00 MiB (GPU 0; 7.93 GiB total "
    "capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)"
)
HIP = "HIP out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 63.98 GiB"
MPS = (
    "MPS backend out of memory (MPS allocated: 17.00 GB, other allocations: 1.23 MB, max allowed: "
    "18.13 GB). Tried to allocate 256.00 MB on private pool."
)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (OLD_CUDA, 2 * GiB),
        (NEW_CUDA, 20 * MiB),
        (NEW_CUDA_NON_PYTORCH, round(1.95 * GiB)),
        (OLD_CUDA_SMALL, 36 * MiB),
        (HIP, GiB),
        (MPS, 256 * MiB),
        ("CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity", 512),
        ("CUDA out of memory. Tried to allocate 2.50 KiB. GPU 0", 2560),
        ("Tried to allocate 1.50 TiB", round(1.5 * (1 << 40))),
        ("Tried to allocate 3.00 KB", 3072),
        ("Tried to allocate 1.00 GB", GiB),
        ("Tried to allocate 100 B", 100),
    ],
)
def test_parse_requested_bytes_real_messages(message: str, expected: int) -> None:
    assert parse_requested_bytes(message) == expected


def test_parse_requested_bytes_inside_a_traceback() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 10, in <module>\n'
        "    loss.backward()\n"
        f"torch.OutOfMemoryError: {NEW_CUDA}\n"
    )
    assert parse_requested_bytes(text) == 20 * MiB


@pytest.mark.parametrize(
    "message",
    ["", "CUDA error: an illegal memory access was encountered", "CUDA out of memory.",
     "Tried to allocate lots of memory"],
)
def test_parse_requested_bytes_none_when_nothing_parses(message: str) -> None:
    assert parse_requested_bytes(message) is None


def test_emulated_format_matches_spec_and_round_trips_exactly() -> None:
    message = format_emulated_oom(1610612736, rank=1, capacity_bytes=4 * GiB,
                                  in_use_bytes=round(3.2 * GiB))
    assert message == (
        "membench emulated OOM on rank 1: Tried to allocate 1.50 GiB (1610612736 bytes); "
        "capacity 4.00 GiB, in use 3.20 GiB"
    )
    assert parse_requested_bytes(message) == 1610612736


@pytest.mark.parametrize("requested", [0, 1, 1000, 1025, 123_456_789, 3 * GiB + 1, 5 << 40])
def test_emulated_round_trip_is_exact_where_human_size_is_not(requested: int) -> None:
    message = format_emulated_oom(requested, rank=0, capacity_bytes=4 * GiB, in_use_bytes=0)
    assert parse_requested_bytes(message) == requested


def test_emulated_rejects_negative_sizes() -> None:
    with pytest.raises(ValueError):
        format_emulated_oom(-1, rank=0, capacity_bytes=1, in_use_bytes=0)


def test_oom_event_round_trip_and_message_headline() -> None:
    event = OomEvent(
        rank=3,
        step=-1,
        phase="materialize",
        requested_bytes=parse_requested_bytes(NEW_CUDA),
        message=NEW_CUDA + "\nsecond line of the traceback",
        stats={"allocated_bytes": 5, "num_ooms": 1},
        snapshot_path="results/rank3.pickle",
    )
    assert "\n" not in event.message and len(event.message) == 500
    assert event.message == NEW_CUDA[:500]
    data = json.loads(json.dumps(event.to_dict()))
    assert OomEvent.from_dict(data) == event
    assert data["requested_bytes"] == 20 * MiB and data["step"] == -1


def test_oom_event_from_exception_and_optional_fields() -> None:
    exc = RuntimeError(format_emulated_oom(GiB + 7, rank=2, capacity_bytes=4 * GiB, in_use_bytes=GiB))
    event = OomEvent.from_exception(exc, rank=2, step=12, phase="backward", stats={"x": 1})
    assert event.requested_bytes == GiB + 7 and event.snapshot_path is None
    restored = OomEvent.from_dict({"rank": 2, "phase": "forward", "requested_bytes": None,
                                   "message": "boom"})
    assert restored.step == -1 and restored.requested_bytes is None and restored.stats == {}


# ---------------------------------------------------------------------------------------------
# nvml


class FakeNvml:
    """The slice of pynvml that NvmlSampler calls; test_fake_matches_real_pynvml keeps it honest."""

    class NVMLError(Exception):
        pass

    nvmlMemory_v2 = 0x02000028  # pynvml's version tag of c_nvmlMemory_v2_t

    def __init__(self, used: list[int] | None = None, total: int = 80 * GiB, driver_reserved: int = 0) -> None:
        self.used = list(used or [GiB])
        self.total = total
        self.driver_reserved = driver_reserved  # v2 reports it apart; v1's `used` includes it
        self.calls: list[str] = []
        self.init_error: str | None = None
        self.handle_error: str | None = None
        self.process_error = False
        self.util_error = False
        self.memory_errors = 0  # how many upcoming memory queries fail
        self.processes: list[Any] = [
            SimpleNamespace(pid=os.getpid(), usedGpuMemory=900 * MiB),
            SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=10 * GiB),
        ]
        self._i = 0
        self._lock = threading.Lock()

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self.calls.append(f"handle:{index}")
        if self.handle_error:
            raise self.NVMLError(self.handle_error)
        return ("handle", index)

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        assert handle[0] == "handle"
        with self._lock:
            if self.memory_errors:
                self.memory_errors -= 1
                raise self.NVMLError("GPU is lost")
            used = self.used[min(self._i, len(self.used) - 1)]
            self._i += 1
        if version is None:  # c_nvmlMemory_t
            used += self.driver_reserved
            return SimpleNamespace(used=used, total=self.total, free=self.total - used)
        assert version == self.nvmlMemory_v2  # c_nvmlMemory_v2_t
        return SimpleNamespace(version=version, total=self.total, reserved=self.driver_reserved,
                               free=self.total - used - self.driver_reserved, used=used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        if self.process_error:
            raise self.NVMLError("Insufficient Permissions")
        return self.processes

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        if self.util_error:
            raise self.NVMLError("Not Supported")
        return SimpleNamespace(gpu=87, memory=40)


def _wait_for(predicate: Any, timeout_s: float = 3.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "sampler thread produced too few samples"
        time.sleep(0.002)


def test_sampler_collects_samples_in_background_and_stops() -> None:
    fake = FakeNvml(used=[GiB, 3 * GiB, 2 * GiB])
    sampler = NvmlSampler(2, interval_s=0.005, nvml=fake)
    sampler.start()
    _wait_for(lambda: len(sampler.samples) >= 5)
    sampler.stop()
    samples = sampler.samples
    assert fake.calls[:2] == ["init", "handle:2"] and fake.calls[-1] == "shutdown"
    assert all(isinstance(s, NvmlSample) for s in samples)
    assert [s.device_used_bytes for s in samples[:3]] == [GiB, 3 * GiB, 2 * GiB]
    assert all(s.device_total_bytes == 80 * GiB for s in samples)
    assert all(s.process_used_bytes == 900 * MiB and s.gpu_util_pct == 87 for s in samples)
    times = [s.time_s for s in samples]
    assert times == sorted(times)
    assert sampler.peak_device_used_bytes == 3 * GiB == max(s.device_used_bytes for s in samples)
    assert sampler.latest() == samples[-1]
    # stopped means stopped: no more samples arrive
    count = len(sampler.samples)
    time.sleep(0.03)
    assert len(sampler.samples) == count


def test_stop_is_idempotent_and_safe_before_start() -> None:
    fake = FakeNvml()
    sampler = NvmlSampler(0, interval_s=10.0, nvml=fake)
    sampler.stop()  # never started
    assert fake.calls == []
    sampler.start()
    started = time.monotonic()
    sampler.stop()
    sampler.stop()
    assert time.monotonic() - started < 1.0, "stop must not wait out the interval"
    assert fake.calls.count("shutdown") == 1
    assert len(sampler.samples) == 1  # the synchronous sample taken by start()


def test_sample_now_and_peak_with_injected_clock() -> None:
    ticks = iter(range(100))
    fake = FakeNvml(used=[GiB, 5 * GiB, 2 * GiB, 4 * GiB])
    sampler = NvmlSampler(0, interval_s=60.0, nvml=fake, clock=lambda: float(next(ticks)))
    assert sampler.latest() is None and sampler.peak_device_used_bytes is None
    with pytest.raises(RuntimeError, match="not started"):
        sampler.sample_now()
    with sampler:
        for _ in range(3):
            sampler.sample_now()
        assert sampler.latest() == NvmlSample(3.0, 4 * GiB, 80 * GiB, 900 * MiB, 87, device_reserved_bytes=0)
    assert [s.time_s for s in sampler.samples] == [0.0, 1.0, 2.0, 3.0]
    assert sampler.peak_device_used_bytes == 5 * GiB
    assert fake.calls[-1] == "shutdown"


def test_samples_is_a_copy() -> None:
    sampler = NvmlSampler(0, interval_s=60.0, nvml=FakeNvml())
    with sampler:
        sampler.samples.clear()
        assert len(sampler.samples) == 1


def test_failing_process_and_util_queries_record_none_and_sampling_continues() -> None:
    fake = FakeNvml(used=[GiB, 2 * GiB])
    fake.process_error = True
    fake.util_error = True
    with NvmlSampler(0, interval_s=0.005, nvml=fake) as sampler:
        _wait_for(lambda: len(sampler.samples) >= 4)
    samples = sampler.samples
    assert all(s.process_used_bytes is None and s.gpu_util_pct is None for s in samples)
    assert all(s.device_used_bytes > 0 for s in samples)
    assert sampler.peak_device_used_bytes == 2 * GiB


def test_transient_memory_query_failure_skips_one_sample_only() -> None:
    fake = FakeNvml()
    with NvmlSampler(0, interval_s=0.005, nvml=fake) as sampler:
        fake.memory_errors = 2
        _wait_for(lambda: len(sampler.samples) >= 4)
    assert sampler.failed_samples == 2 and sampler.last_error == "GPU is lost"


@pytest.mark.parametrize(
    ("processes", "expected"),
    [
        ([SimpleNamespace(pid=os.getpid(), usedGpuMemory=None)], None),  # WDDM / no permission
        ([SimpleNamespace(pid=os.getpid() + 1, usedGpuMemory=GiB)], None),  # PID namespace
        ([], None),
        ([SimpleNamespace(pid=os.getpid(), usedGpuMemory=GiB),
          SimpleNamespace(pid=os.getpid(), usedGpuMemory=MiB)], GiB + MiB),
    ],
)
def test_process_memory_filtering(processes: list[Any], expected: int | None) -> None:
    fake = FakeNvml()
    fake.processes = processes
    with NvmlSampler(0, interval_s=60.0, nvml=fake) as sampler:
        assert sampler.latest().process_used_bytes == expected  # type: ignore[union-attr]


def test_init_failure_raises_clear_one_line_error() -> None:
    fake = FakeNvml()
    fake.init_error = "Driver Not Loaded"
    sampler = NvmlSampler(0, nvml=fake)
    with pytest.raises(RuntimeError, match=r"^NVML unavailable: Driver Not Loaded$"):
        sampler.start()
    sampler.stop()  # safe after a failed start
    assert fake.calls == ["init"]


def test_bad_device_index_raises_and_shuts_nvml_down() -> None:
    fake = FakeNvml()
    fake.handle_error = "Invalid Argument"
    with pytest.raises(RuntimeError, match=r"^NVML unavailable: device 7: Invalid Argument$"):
        NvmlSampler(7, nvml=fake).start()
    assert fake.calls == ["init", "handle:7", "shutdown"]


def test_constructor_rejects_non_positive_interval() -> None:
    with pytest.raises(ValueError):
        NvmlSampler(0, interval_s=0, nvml=FakeNvml())


def test_fake_matches_real_pynvml() -> None:
    import inspect

    pynvml = pytest.importorskip("pynvml")
    functions = [name for name in vars(FakeNvml) if name.startswith("nvmlDevice") or name in ("nvmlInit",
                                                                                                 "nvmlShutdown")]
    assert len(functions) == 6
    for name in functions:
        assert callable(getattr(pynvml, name)), name
        real = list(inspect.signature(getattr(pynvml, name)).parameters)
        fake = list(inspect.signature(getattr(FakeNvml(), name)).parameters)
        assert fake == real, (name, fake, real)
    assert issubclass(pynvml.NVMLError, Exception)
    # the structs the fake returns, field for field
    assert FakeNvml.nvmlMemory_v2 == pynvml.nvmlMemory_v2
    fake = FakeNvml()
    v2 = fake.nvmlDeviceGetMemoryInfo(("handle", 0), version=pynvml.nvmlMemory_v2)
    assert set(vars(v2)) == {name for name, _ in pynvml.c_nvmlMemory_v2_t._fields_}
    v1 = fake.nvmlDeviceGetMemoryInfo(("handle", 0))
    assert set(vars(v1)) == {name for name, _ in pynvml.c_nvmlMemory_t._fields_}
    assert {"pid", "usedGpuMemory"} <= {name for name, _ in pynvml.c_nvmlProcessInfo_v3_t._fields_}
    assert set(vars(fake.processes[0])) <= {name for name, _ in pynvml.c_nvmlProcessInfo_v3_t._fields_}
    # a driver without the v2 call raises this class (what NvmlSampler falls back to v1 on)
    assert pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND).__class__.__name__ == "NVMLError_FunctionNotFound"


def test_real_pynvml_start_fails_cleanly_or_samples() -> None:
    """Without a driver (CI), start() must give the one-line error; with one, a real sample."""
    pytest.importorskip("pynvml")
    sampler = NvmlSampler(0, interval_s=60.0)
    try:
        sampler.start()
    except RuntimeError as exc:
        assert str(exc).startswith("NVML unavailable: ") and "\n" not in str(exc)
        return
    finally:
        sampler.stop()
    assert sampler.samples[0].device_total_bytes > 0


# ---------------------------------------------------------------------------------------------
# snapshot


class FakeMemoryBackend:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def _record_memory_history(self, **kwargs: Any) -> None:
        self.calls.append(("_record_memory_history", kwargs))

    def _dump_snapshot(self, filename: str) -> None:
        self.calls.append(("_dump_snapshot", {"filename": filename}))
        with open(filename, "wb") as f:
            pickle.dump({"segments": [], "device_traces": [[]]}, f)


def test_snapshot_functions_call_backend_with_right_args(tmp_path: Any) -> None:
    backend = FakeMemoryBackend()
    snapshot.start_history(100_000, backend=backend)
    target = tmp_path / "rank0" / "oom.pickle"
    written = snapshot.dump_snapshot(target, backend=backend)
    snapshot.stop_history(backend=backend)

    assert written == str(target) and os.path.isfile(written)
    with open(written, "rb") as f:
        assert "segments" in pickle.load(f)
    assert backend.calls == [
        ("_record_memory_history", {"enabled": "all", "stacks": "python", "max_entries": 100_000}),
        ("_dump_snapshot", {"filename": str(target)}),
        ("_record_memory_history", {"enabled": None}),
    ]


def test_start_history_rejects_non_positive_max_entries() -> None:
    backend = FakeMemoryBackend()
    with pytest.raises(ValueError):
        snapshot.start_history(0, backend=backend)
    assert backend.calls == []


def test_snapshot_wrappers_match_real_torch_api() -> None:
    import inspect

    import torch.cuda.memory as real

    assert "max_entries" in inspect.signature(real._record_memory_history).parameters or (
        "kwargs" in inspect.signature(real._record_memory_history).parameters
    )
    assert "enabled" in inspect.signature(real._record_memory_history).parameters
    assert "filename" in inspect.signature(real._dump_snapshot).parameters
    for func in (snapshot.start_history, snapshot.stop_history, snapshot.dump_snapshot):
        assert "pytorch.org/memory_viz" in (func.__doc__ or "")
