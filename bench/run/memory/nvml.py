"""Background NVML sampling of device and per-process GPU memory.

NVML sees memory the caching allocator does not (CUDA context, NCCL buffers, cuBLAS workspaces),
which is what actually runs a rank out of HBM.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable


@dataclass(frozen=True)
class NvmlSample:
    time_s: float
    device_used_bytes: int
    device_total_bytes: int
    process_used_bytes: int | None  # None: not reported (no permission, PID namespace, WDDM)
    gpu_util_pct: int | None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


class NvmlSampler:
    """Samples one device every interval_s on a daemon thread; start()/stop() or `with`."""

    def __init__(
        self,
        device_index: int,
        interval_s: float = 0.1,
        nvml: Any = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.device_index = device_index
        self.interval_s = interval_s
        self._nvml = nvml
        self._clock = clock
        self._handle: Any = None
        self._initialised = False
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self._samples: list[NvmlSample] = []
        self._peak: int | None = None
        self.failed_samples = 0
        self.last_error: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "NvmlSampler":
        if self._thread is not None:
            return self
        nvml = self._resolve_nvml()
        try:
            nvml.nvmlInit()
        except Exception as exc:
            raise RuntimeError(f"NVML unavailable: {_one_line(exc)}") from exc
        self._initialised = True
        try:
            self._handle = nvml.nvmlDeviceGetHandleByIndex(self.device_index)
            # Sample once synchronously so a phase shorter than interval_s still has a reading.
            self.sample_now()
        except Exception as exc:
            self.stop()
            raise RuntimeError(f"NVML unavailable: device {self.device_index}: {_one_line(exc)}") from exc
        self._stop_event.clear()
        self._thread = threading.Thread(
            target=self._run, name=f"nvml-sampler-{self.device_index}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop_event.set()
        if self._thread is not None:
            # Bounded: a hung driver call must not hang the training process's exit.
            self._thread.join(timeout=max(5.0, 10 * self.interval_s))
            self._thread = None
        if self._initialised:
            self._initialised = False
            self._handle = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass  # nothing useful to do at teardown; the samples are already collected

    def __enter__(self) -> "NvmlSampler":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- sampling --------------------------------------------------------------------------------

    def sample_now(self) -> NvmlSample:
        """Take one sample synchronously and record it; raises if device memory can't be read."""
        if self._handle is None:
            raise RuntimeError("NvmlSampler is not started")
        nvml, handle = self._nvml, self._handle
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        sample = NvmlSample(
            time_s=self._clock(),
            device_used_bytes=int(memory.used),
            device_total_bytes=int(memory.total),
            process_used_bytes=self._process_used(nvml, handle),
            gpu_util_pct=self._gpu_util(nvml, handle),
        )
        with self._lock:
            self._samples.append(sample)
            if self._peak is None or sample.device_used_bytes > self._peak:
                self._peak = sample.device_used_bytes
        return sample

    @property
    def samples(self) -> list[NvmlSample]:
        with self._lock:
            return list(self._samples)

    @property
    def peak_device_used_bytes(self) -> int | None:
        with self._lock:
            return self._peak

    def latest(self) -> NvmlSample | None:
        with self._lock:
            return self._samples[-1] if self._samples else None

    # -- internals -------------------------------------------------------------------------------

    def _resolve_nvml(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # lazy: CPU-only hosts never need the driver library
            except ImportError as exc:
                raise RuntimeError(f"NVML unavailable: {_one_line(exc)}") from exc
            self._nvml = pynvml
        return self._nvml

    def _run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                self.sample_now()
            except Exception as exc:
                # A transient driver error loses one sample, not the rest of the run.
                self.failed_samples += 1
                self.last_error = _one_line(exc)

    @staticmethod
    def _process_used(nvml: Any, handle: Any) -> int | None:
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        pid = os.getpid()
        used = [p.usedGpuMemory for p in processes if p.pid == pid and p.usedGpuMemory is not None]
        # Absent is "unknown", not 0: inside a container NVML reports host PIDs.
        return sum(int(u) for u in used) if used else None

    @staticmethod
    def _gpu_util(nvml: Any, handle: Any) -> int | None:
        try:
            return int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        except Exception:
            return None
