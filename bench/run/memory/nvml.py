"""Background NVML sampling of device and per-process GPU memory.

NVML sees memory the caching allocator does not (CUDA context, NCCL buffers, cuBLAS workspaces),
which is what actually runs a rank out of HBM. What counts for a rank is its own process's use
(`nvmlDeviceGetComputeRunningProcesses`), not the device's, which includes other processes; where the
driver does not report it, the device's `used` from the v2 memory struct, which leaves out the memory
the driver reserves for itself (v1's `used` includes it). Samples are kept in a bounded window; the
highest reading between two `take_window_peak` calls is what a phase's peak is judged by.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Callable, Iterator

# Recent samples kept for inspection (a minute at the default 0.1 s): a run of hours must not grow memory
SAMPLES_KEPT = 600


@dataclass(frozen=True)
class NvmlSample:
    time_s: float
    device_used_bytes: int  # v2: without the driver's reserved memory; v1 (old drivers): with it
    device_total_bytes: int
    process_used_bytes: int | None  # None: not reported (no permission, PID namespace, WDDM)
    gpu_util_pct: int | None
    device_reserved_bytes: int | None = None  # the driver's own (v2 only)

    @property
    def used_bytes(self) -> int:
        """This process's use when the driver reports it, else the device's."""
        return self.process_used_bytes if self.process_used_bytes is not None else self.device_used_bytes


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def nvml_device_index(cuda_index: int) -> int:
    """NVML's index of torch's CUDA device `cuda_index`. CUDA_VISIBLE_DEVICES renumbers the devices torch
    sees; NVML ignores it. Uses torch's own mapping (by index or UUID), PRIVATE torch API
    `torch.cuda._get_nvml_device_index`: this is its only caller. It does not initialize CUDA."""
    import torch.cuda

    return int(torch.cuda._get_nvml_device_index(cuda_index))


def _load_nvml(nvml: Any = None) -> Any:
    if nvml is not None:
        return nvml
    try:
        import pynvml  # lazy: CPU-only hosts never need the driver library
    except ImportError as exc:
        raise RuntimeError(f"NVML unavailable: {_one_line(exc)}") from exc
    return pynvml


@contextlib.contextmanager
def nvml_session(nvml: Any = None) -> Iterator[Any]:
    """NVML initialised for a few reads (None when it cannot be); a failed read inside reads as None too
    (the caller's answer is then unknown, never an error), and NVML is shut down after."""
    try:
        nvml = _load_nvml(nvml)
        nvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield nvml
    except Exception:
        pass
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def cuda_device_name(cuda_index: int, nvml: Any = None) -> str | None:
    """The name of torch's CUDA device `cuda_index` through NVML (no CUDA context); None when unknown."""
    with nvml_session(nvml) as session:
        if session is None:
            return None
        name = session.nvmlDeviceGetName(session.nvmlDeviceGetHandleByIndex(nvml_device_index(cuda_index)))
        return name.decode() if isinstance(name, bytes) else str(name)


def cuda_device_memory_bytes(count: int, nvml: Any = None) -> int | None:
    """The smallest total memory of torch's first `count` CUDA devices, read through NVML, so the launching
    process needs no CUDA context (it would sit on GPU 0 during the run); None when NVML cannot tell."""
    with nvml_session(nvml) as session:
        if session is None:
            return None
        totals = [int(session.nvmlDeviceGetMemoryInfo(session.nvmlDeviceGetHandleByIndex(nvml_device_index(i))).total)
                  for i in range(count)]
        return min(totals) if totals else None


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
        self._samples: deque[NvmlSample] = deque(maxlen=SAMPLES_KEPT)
        self._peak: int | None = None
        self._window_peak: int | None = None
        self._memory_v2 = True  # until the driver says it has no nvmlDeviceGetMemoryInfo_v2
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
        memory = self._memory_info(nvml, handle)
        reserved = getattr(memory, "reserved", None)
        sample = NvmlSample(
            time_s=self._clock(),
            device_used_bytes=int(memory.used),
            device_total_bytes=int(memory.total),
            process_used_bytes=self._process_used(nvml, handle),
            gpu_util_pct=self._gpu_util(nvml, handle),
            device_reserved_bytes=None if reserved is None else int(reserved),
        )
        with self._lock:
            self._samples.append(sample)
            if self._peak is None or sample.device_used_bytes > self._peak:
                self._peak = sample.device_used_bytes
            if self._window_peak is None or sample.used_bytes > self._window_peak:
                self._window_peak = sample.used_bytes
        return sample

    def take_window_peak(self) -> int | None:
        """The highest reading (`NvmlSample.used_bytes`) since the last call, and start a new window."""
        with self._lock:
            peak, self._window_peak = self._window_peak, None
        return peak

    def _memory_info(self, nvml: Any, handle: Any) -> Any:
        version = getattr(nvml, "nvmlMemory_v2", None)
        if self._memory_v2 and version is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except Exception as exc:  # a driver without the v2 call: v1 from now on
                if not type(exc).__name__.endswith(("NotSupported", "FunctionNotFound", "ArgumentVersionMismatch")):
                    raise
                self._memory_v2 = False
        return nvml.nvmlDeviceGetMemoryInfo(handle)

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
        self._nvml = _load_nvml(self._nvml)
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
