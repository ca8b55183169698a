"""What each gpu_check check decides, from what it measured: pure functions, so that tests can plant the fault
a check exists to catch and see it FAIL (tests/test_gpu_check_faults.py), and PASS without it.

A check whose input is derived from what it checks cannot fail; each one here reads a source that the fault
changes: NVML's raw sample (not the recorder's reading, which is floored at reserved), the breakdown's
`other` (not only the sum, which `complete_breakdown` makes exact), the timeline's per-phase allocator
peaks (not the recorder's own choice of phase), the snapshot's trace entries (not that a file exists).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from workloads.units import MIB

# the recorder's cost per step on a GPU, as the median of interleaved recorded / plain blocks
OVERHEAD_LIMIT = 1.10


@dataclass(frozen=True)
class Verdict:
    ok: bool
    detail: str


def nvml_covers_reserved(raw_used_bytes: Optional[int], reserved_bytes: int) -> Verdict:
    """A raw NVML reading of this process's memory holds at least what the caching allocator has reserved
    (cudaMalloc'd segments are the process's device memory, with the CUDA context on top)."""
    if raw_used_bytes is None:
        return Verdict(False, "no NVML reading")
    return Verdict(raw_used_bytes >= reserved_bytes, f"NVML raw reading {raw_used_bytes / MIB:.1f} MiB, "
                                                     f"reserved now {reserved_bytes / MIB:.1f} MiB")


def breakdown_adds_up(peak_bytes: int, breakdown: Dict[str, int]) -> Verdict:
    """The categories sum to the peak and none is negative (a negative `other` means a category counted
    memory that was not there: freed gradients counted at a forward peak, static bytes over allocated)."""
    negative = {k: v for k, v in breakdown.items() if v < 0}
    total = sum(breakdown.values())
    detail = f"peak {peak_bytes / MIB:.1f} MiB = " + ", ".join(f"{k} {v / MIB:.1f}" for k, v in breakdown.items() if v)
    if negative:
        detail += "; negative: " + ", ".join(f"{k} {v:,} B" for k, v in negative.items())
    return Verdict(total == peak_bytes and not negative, detail)


def peak_phase_holds_the_maximum(peak: Tuple[int, str], peak_allocated_bytes: int,
                                 rows: Sequence[Dict[str, Any]], warmup_steps: int) -> Verdict:
    """The phase the recorder calls the peak is the measured phase whose allocator peak is the highest, and
    the result's peak allocated is that phase's (the first GPU audit's third defect: a flat NVML reading
    once let the first phase win)."""
    measured = [row for row in rows if int(row["step"]) >= warmup_steps and row["phase_peak_bytes"] not in ("", None)]
    if not measured:
        return Verdict(False, "no measured timeline rows")
    top = max(int(row["phase_peak_bytes"]) for row in measured)
    at_peak = [int(row["phase_peak_bytes"]) for row in measured if (int(row["step"]), row["phase"]) == tuple(peak)]
    ok = bool(at_peak) and at_peak[0] == top == peak_allocated_bytes
    return Verdict(ok, f"peak at step {peak[0]} {peak[1]}: its allocator peak "
                       f"{at_peak[0] / MIB if at_peak else float('nan'):.2f} MiB, highest measured phase "
                       f"{top / MIB:.2f} MiB, result's peak allocated {peak_allocated_bytes / MIB:.2f} MiB")


def snapshot_is_readable(snapshot: Optional[dict], need_frames: bool) -> Verdict:
    """A memory_viz snapshot with segments and an allocation trace; on a GPU, with the Python frames of the
    allocations (stacks="python"), which is what makes it worth opening."""
    if not isinstance(snapshot, dict):
        return Verdict(False, "no snapshot")
    traces = [entry for trace in snapshot.get("device_traces") or [] for entry in trace]
    allocs = [entry for entry in traces if entry.get("action") == "alloc"]
    framed = [entry for entry in allocs if entry.get("frames")]
    ok = bool(snapshot.get("segments")) and bool(allocs) and (framed or not need_frames)
    return Verdict(bool(ok), f"{len(snapshot.get('segments') or [])} segments, {len(allocs)} allocations traced, "
                             f"{len(framed)} with frames")


def oom_recorded(event, requested_bytes: int) -> Verdict:
    """The forced OOM came, in the phase and step it was raised in, with the request's size."""
    if event is None:
        return Verdict(False, "no OutOfMemoryError raised")
    ok = (event.phase == "forward" and event.step == 0 and event.requested_bytes == requested_bytes
          and event.stats.get("num_ooms", 0) >= 1)
    return Verdict(ok, f"step {event.step} {event.phase}, requested {event.requested_bytes:,} B: "
                       f"{event.message[:100]}")


def replay_agrees(real, modelled, tolerance: float, events: int, source: str) -> Verdict:
    """The model's peak reserved and inactive-split against the real allocator's, within `tolerance` of the
    real peak reserved."""
    budget = tolerance * max(real.peak_reserved_bytes, 1)
    ok = (abs(modelled.peak_reserved_bytes - real.peak_reserved_bytes) <= budget
          and abs(modelled.peak_inactive_split_bytes - real.peak_inactive_split_bytes) <= budget)

    def said(peaks) -> str:
        return (f"reserved {peaks.peak_reserved_bytes / MIB:.1f} MiB, inactive split "
                f"{peaks.peak_inactive_split_bytes / MIB:.1f} MiB, allocated {peaks.peak_allocated_bytes / MIB:.1f} MiB")
    return Verdict(ok, f"{events} events; {source}: {said(real)}; model: {said(modelled)}")


def overhead_within(recorded_s: List[float], plain_s: List[float], limit: float = OVERHEAD_LIMIT) -> Verdict:
    """Median recorded step over median plain step, from interleaved blocks (recorded, plain, recorded, ...)
    so that clocks warming up or a neighbour's load fall on both."""
    if not recorded_s or not plain_s:
        return Verdict(False, "no timings")
    recorded, plain = statistics.median(recorded_s), statistics.median(plain_s)
    ratio = recorded / plain if plain else float("inf")
    return Verdict(ratio < limit, f"step {recorded * 1e3:.2f} ms recorded vs {plain * 1e3:.2f} ms plain "
                                  f"({len(recorded_s)} + {len(plain_s)} interleaved blocks): ratio {ratio:.3f}, "
                                  f"limit {limit}")


def sequence_matches(expected: Dict[str, int], measured: Dict[str, int], source: str) -> Verdict:
    """Every hand-derived statistic of an allocator sequence, exactly (bytes and counts: no tolerance)."""
    wrong = {key: (value, measured.get(key)) for key, value in expected.items() if measured.get(key) != value}
    if not wrong:
        return Verdict(True, f"{source} gives all {len(expected)} statistics exactly")
    return Verdict(False, f"{source} differs: " + ", ".join(
        f"{key} {'missing' if got is None else format(got, ',')} (hand-derived {want:,})"
        for key, (want, got) in wrong.items()))
