"""The caching allocator model against the real one: an allocation trace (the mallocs and frees of a few
training steps of the recorder checks' model, recorded on the meta device, so it costs no GPU time and is
the same on any host, then a seeded stream of varied sizes with interleaved frees) replayed through
torch.cuda on the GPU and through the model; their peak reserved and peak inactive-split bytes must agree
within REPLAY_TOLERANCE. The model's trace alone has three sizes (4 B, 16 KiB, 64 MiB): no request of
1-10 MiB (20 MiB segments), no 2 MiB rounding, no split of a cached block; any model keeping 64 MiB blocks
whole passed it. The varied stream needs each of those rules. Simulated, the "real" side is the simulated
device running the same steps and the same stream on CPU, whose kernels allocate a little differently from
meta's (a few KiB of scratch here): the same tolerance holds."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Dict, Hashable, List, Tuple

import torch

from bench.accounting.caching_allocator import AllocatorSettings
from bench.accounting.caching_allocator.replay import AllocationStream, Event, ReplayPeaks, replay
from bench.gpucheck.log import CheckLog
from bench.gpucheck.verdicts import replay_agrees
from workloads.units import MIB, UNBOUNDED_BYTES

REPLAY_TOLERANCE = 0.02  # of the real peak reserved (the goal for the model)
TRACE_STEPS = 3
VARIED_SEED, VARIED_REQUESTS = 20261206, 160


def varied_events(seed: int = VARIED_SEED, requests: int = VARIED_REQUESTS) -> List[Event]:
    """Mallocs of 0.3-40 MiB and of a few KiB (odd sizes: 512 B and 2 MiB rounding), about a third of the
    live ones freed in between, so that cached blocks are split, merged and reused; all freed at the end."""
    rng = random.Random(seed)
    events: List[Event] = []
    live: List[Tuple[str, int]] = []
    for index in range(requests):
        if live and rng.random() < 0.35:
            events.append((live.pop(rng.randrange(len(live))), None))
        if rng.random() < 0.2:
            nbytes = rng.randint(1, 900) * 1024 + rng.randint(1, 511)
        else:
            nbytes = int(rng.uniform(0.3, 40.0) * MIB) + rng.randint(1, 511)
        key = ("varied", index)
        events.append((key, nbytes))
        live.append(key)
    events.extend((key, None) for key in live)
    return events


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
    # the model and its optimizer state stay alive under the varied stream, as on the real side
    stream.events.extend(varied_events())
    return stream


def allocate_events(events: List[Event], device: torch.device, keep: bool = False) -> Dict[Hashable, torch.Tensor]:
    """Each malloc as a uint8 tensor of its size, each free as dropping it; what is still live (when `keep`)."""
    live: Dict[Hashable, torch.Tensor] = {}
    for key, nbytes in events:
        if nbytes is None:
            del live[key]
        else:
            live[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if not keep:
        live.clear()
    return live


def replay_on_cuda(stream: AllocationStream, device: torch.device) -> ReplayPeaks:
    """The trace through torch.cuda's caching allocator, from an emptied cache (peaks over the replay)."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    allocated_before = torch.cuda.memory_allocated(device)
    reserved_before = torch.cuda.memory_reserved(device)
    torch.cuda.reset_peak_memory_stats(device)
    retries_before = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    live = allocate_events(stream.events, device, keep=True)
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
        allocate_events(varied_events(), torch.device("cpu"))
        return ReplayPeaks.from_stats(recorder.model.memory_stats())
    finally:
        recorder.close()


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
    log.verdict("allocator model vs replay", replay_agrees(real, modelled, REPLAY_TOLERANCE, len(stream.events), source))
