"""NvmlSampler (bench.run.memory.nvml) on a fake of pynvml: background sampling, peaks, failures, and the
fake held to the real module's calls and structs."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bench.run.memory.nvml import NvmlSample, NvmlSampler

from nvml_fakes import FakeNvml, GiB, MiB


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
