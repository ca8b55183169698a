"""The caching allocator model against the real one: an allocation trace (the mallocs and frees of a few
training steps of the recorder checks' model, recorded on the meta device, so it costs no GPU time and is
the same on any host) replayed through torch.cuda on the GPU and through the model; their peak reserved and
peak inactive-split bytes must agree within REPLAY_TOLERANCE. Simulated, the "real" side is the simulated
device running the same steps on CPU, whose kernels allocate a little differently from meta's (a few KiB of
scratch here): the same tolerance holds."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from bench.accounting.caching_allocator import AllocatorSettings
from bench.accounting.caching_allocator.replay import AllocationStream, ReplayPeaks, replay
from bench.gpucheck.log import CheckLog
from workloads.units import MIB, UNBOUNDED_BYTES

REPLAY_TOLERANCE = 0.02  # of the real peak reserved (the goal for the model)
TRACE_STEPS = 3


def record_trace(width: int, batch: int, steps: int = TRACE_STEPS) -> AllocationStream:
    """The allocations of `steps` training steps of the check model, on meta."""
    from bench.accounting.live_tensors import LiveTensorTracker
    from bench.gpucheck.recorder_checks import make_model, train

    meta = torch.device("meta")
    stream = AllocationStream()
    tracker = LiveTensorTracker(meta, UNBOUNDED_BYTES, rank=0, allocator=stream)
    with tracker:
        model = make_model(meta, width)
        optimizer = torch.optim.Adam(model.parameters())
        train(model, optimizer, None, meta, steps, batch, width)
    return stream


def replay_on_cuda(stream: AllocationStream, device: torch.device) -> ReplayPeaks:
    """The trace through torch.cuda's caching allocator, from an emptied cache (peaks over the replay)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    allocated_before = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    retries_before = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    live = {}
    for key, nbytes in stream.events:
        if nbytes is None:
            del live[key]
        else:
            live[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    stats = torch.cuda.memory_stats(device)
    live.clear()
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return ReplayPeaks(stats["allocated_bytes.all.peak"] - allocated_before,
                       stats["reserved_bytes.all.peak"] - reserved_before,
                       stats["inactive_split_bytes.all.peak"], stats["num_alloc_retries"] - retries_before)


def replay_on_simulated_device(width: int, batch: int, steps: int) -> ReplayPeaks:
    """The same steps run on CPU through the simulated device's recorder: the model fed live."""
    from bench.gpucheck.recorder_checks import SIMULATED_BYTES, Target, make_model, train

    recorder = Target(torch.device("cpu"), SIMULATED_BYTES, simulated=True).recorder(None, 0, None)
    try:
        model = make_model(torch.device("cpu"), width)
        optimizer = torch.optim.Adam(model.parameters())
        train(model, optimizer, None, torch.device("cpu"), steps, batch, width)
        return ReplayPeaks.from_stats(recorder.model.memory_stats())
    finally:
        recorder.close()


def _describe(peaks: ReplayPeaks) -> str:
    return (f"reserved {peaks.peak_reserved_bytes / MIB:.1f} MiB, inactive split "
            f"{peaks.peak_inactive_split_bytes / MIB:.1f} MiB, allocated {peaks.peak_allocated_bytes / MIB:.1f} MiB")


def allocator_replay(target, out_dir: Path, width: int, batch: int, log: CheckLog) -> None:
    from bench.accounting.allocator_config import allocator_conf_text

    stream = record_trace(width, batch)
    (out_dir / "allocation_trace.json").write_text(json.dumps(stream.to_json()))
    settings = AllocatorSettings.parse(allocator_conf_text())  # the environment's, as torch reads it
    modelled = replay(stream.events, settings)
    if target.simulated:
        real, source = replay_on_simulated_device(width, batch, TRACE_STEPS), "simulated device"
    else:
        real, source = replay_on_cuda(stream, target.device), "torch.cuda"
    budget = REPLAY_TOLERANCE * max(real.peak_reserved_bytes, 1)
    agree = (abs(modelled.peak_reserved_bytes - real.peak_reserved_bytes) <= budget
             and abs(modelled.peak_inactive_split_bytes - real.peak_inactive_split_bytes) <= budget)
    log.check("allocator model vs replay", agree,
              f"{len(stream.events)} events; {source}: {_describe(real)}; model: {_describe(modelled)}")
