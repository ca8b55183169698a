"""Out-of-memory events: what a rank tried to allocate, and where it was when it failed."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

MAX_MESSAGE_CHARS = 500

# KB/MB/GB/TB are binary too: PyTorch's MPS allocator prints "MB" for size / 1048576.
_UNITS: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": 1 << 10,
    "kb": 1 << 10,
    "mib": 1 << 20,
    "mb": 1 << 20,
    "gib": 1 << 30,
    "gb": 1 << 30,
    "tib": 1 << 40,
    "tb": 1 << 40,
}

# membench's own format carries the exact count; "[^(\n]*" keeps it from reaching into
# the old CUDA message's "(GPU 0; ...)" parenthesis.
_EXACT = re.compile(r"Tried to allocate [^(\n]*\((\d+) bytes\)")
_HUMAN = re.compile(
    r"Tried to allocate\s+(\d+(?:\.\d+)?)\s*(TiB|GiB|MiB|KiB|TB|GB|MB|KB|bytes|byte|B)\b",
    re.IGNORECASE,
)


def format_size(num_bytes: int) -> str:
    """Human size with c10's thresholds, so emulated and real OOM messages read alike."""
    if num_bytes <= 1024:
        return f"{num_bytes} bytes"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30)):
        if num_bytes <= scale * 1024:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes / (1 << 40):.2f} TiB"


def format_emulated_oom(requested_bytes: int, rank: int, capacity_bytes: int, in_use_bytes: int) -> str:
    """The message of membench's CPU-emulated OOM; parse_requested_bytes reads it back exactly."""
    if min(requested_bytes, capacity_bytes, in_use_bytes) < 0:
        raise ValueError("byte counts must be >= 0")
    return (
        f"membench emulated OOM on rank {rank}: Tried to allocate {format_size(requested_bytes)} "
        f"({requested_bytes} bytes); capacity {format_size(capacity_bytes)}, "
        f"in use {format_size(in_use_bytes)}"
    )


def format_simulated_oom(oom: Any, rank: int) -> str:
    """The message of an OOM on the simulated CUDA device (a `SimulatedOutOfMemory`), in CUDA's words plus
    the exact request, which parse_requested_bytes reads back."""
    return (
        f"CUDA out of memory on the simulated device of rank {rank}. Tried to allocate "
        f"{format_size(oom.requested_bytes)} ({oom.requested_bytes} bytes); "
        f"capacity {format_size(oom.capacity_bytes)}, "
        f"{format_size(oom.allocated_bytes)} allocated, {format_size(oom.reserved_bytes)} reserved in total by "
        f"PyTorch, {format_size(oom.inactive_split_bytes)} inactive in split blocks, "
        f"{oom.num_alloc_retries} allocation retries"
    )


def parse_requested_bytes(message: str) -> int | None:
    """Bytes an OOM tried to allocate, from a CUDA/HIP/MPS or membench message; None if absent.

    Human sizes are rounded to 2 decimals by PyTorch, so the result is within 0.5% of the truth.
    """
    exact = _EXACT.search(message)
    if exact:
        return int(exact.group(1))
    human = _HUMAN.search(message)
    if human:
        return int(round(float(human.group(1)) * _UNITS[human.group(2).lower()]))
    return None


def _first_line(message: str) -> str:
    lines = message.strip().splitlines()
    return lines[0][:MAX_MESSAGE_CHARS] if lines else ""


@dataclass
class OomEvent:
    rank: int
    step: int  # -1: failed before the first training step (e.g. while sharding or materialising)
    phase: str
    requested_bytes: int | None
    message: str
    stats: dict[str, int] = field(default_factory=dict)
    snapshot_path: str | None = None

    def __post_init__(self) -> None:
        # Full OOM texts run to kilobytes and tracebacks; results keep only the headline.
        self.message = _first_line(self.message)

    @classmethod
    def from_exception(
        cls,
        exc: BaseException,
        rank: int,
        step: int,
        phase: str,
        stats: Mapping[str, int] | None = None,
        snapshot_path: str | None = None,
    ) -> "OomEvent":
        # Parse before truncation: the size could sit past the first line in wrapped errors.
        text = str(exc)
        return cls(rank, step, phase, parse_requested_bytes(text), text, dict(stats or {}), snapshot_path)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "OomEvent":
        requested = data.get("requested_bytes")
        return cls(
            rank=int(data["rank"]),
            step=int(data.get("step", -1)),
            phase=str(data.get("phase", "")),
            requested_bytes=None if requested is None else int(requested),
            message=str(data.get("message", "")),
            stats={str(k): int(v) for k, v in (data.get("stats") or {}).items()},
            snapshot_path=data.get("snapshot_path"),
        )


# Memory failures that do not come from the caching allocator, so do not raise torch.OutOfMemoryError:
# NCCL's own buffers (DistBackendError "... Cuda failure 'out of memory'"), cuBLAS's workspace
# (CUBLAS_STATUS_ALLOC_FAILED), fbgemm's managed (UVM) tables (cudaMallocManaged: cudaErrorMemoryAllocation).
MEMORY_FAILURE_MARKERS = ("out of memory", "cuda_error_out_of_memory", "cudaerrormemoryallocation",
                          "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


def is_memory_failure(exc: BaseException) -> bool:
    """Did this exception come from running out of device memory, whatever raised it?"""
    if any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in MEMORY_FAILURE_MARKERS)
