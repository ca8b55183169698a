"""CUDA allocator statistics and snapshot wrappers (bench.run.memory.cuda_stats, .snapshot), exercised on
CPU with fakes in place of torch.cuda."""
from __future__ import annotations

import json
import os
import pickle
from typing import Any

import pytest

from bench.run.memory import cuda_stats, snapshot
from bench.run.memory.cuda_stats import CudaAllocatorStats, parse_memory_stats

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
