"""Fakes of NVML for the recorder and sampler tests: the slice of pynvml that NvmlSampler calls (FakeNvml,
held to the real module by test_nvml_sampler.py), and a sampler with one fixed reading (FakeSampler)."""
from __future__ import annotations

import os
import threading
from types import SimpleNamespace
from typing import Any

from bench.run.memory.nvml import NvmlSample

GiB = 1 << 30
MiB = 1 << 20


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


class FakeSampler:
    """NvmlSampler's interface with one fixed reading: `used` bytes on an 80 GiB device, no process figure."""

    def __init__(self, used):
        self.used, self.started, self.stopped = used, False, False

    def start(self):
        self.started = True

    def stop(self):
        self.stopped = True

    def sample_now(self):
        return NvmlSample(0.0, self.used, 80 << 30, None, None)

    def take_window_peak(self):  # no background thread here: the phase-end reading is the window
        return None
