"""OOM messages (bench.accounting.oom): the requested size read from real CUDA / HIP / MPS messages, the
emulated OOM's message, and OomEvent's round trip."""
from __future__ import annotations

import json

import pytest

from bench.accounting.oom import OomEvent, format_emulated_oom, parse_requested_bytes

GiB = 1 << 30
MiB = 1 << 20

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
