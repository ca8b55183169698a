"""The CUDA recorder on a small model: allocator peaks, NVML, breakdown, memory_viz snapshot, its overhead,
and a forced OOM (`torch.cuda.set_per_process_memory_fraction`). Simulated (`--simulate`), the same code
runs on CPU with the recorder of a simulated device (bench.run.memory.simulated): the caching allocator
model in place of torch.cuda and NVML."""
from __future__ import annotations

import csv
import json
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from torch import nn

from bench.accounting.oom import OomEvent
from bench.gpucheck.log import CheckLog
from bench.gpucheck.verdicts import (breakdown_adds_up, nvml_covers_reserved, oom_recorded, overhead_within,
                                     peak_phase_holds_the_maximum, snapshot_is_readable)
from bench.run.memory.cuda import CudaRecorder
from workloads.units import MIB


def make_model(device: torch.device, width: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, 1)).to(device)


def train(model, optimizer, recorder, device, steps: int, batch: int, width: int) -> float:
    """Seconds per step, through the recorder's phases when one is given."""
    def phase(step, name):
        return recorder.phase(step, name) if recorder else _null()
    timings = []
    for step in range(steps):
        started = time.perf_counter()
        with phase(step, "input"):
            x = torch.randn(batch, width, device=device)
        with phase(step, "forward"):
            loss = model(x).square().mean()
        with phase(step, "backward"):
            loss.backward()
        with phase(step, "optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        timings.append(time.perf_counter() - started)
    timings.sort()
    return timings[len(timings) // 2]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# the simulated device of --simulate: an 80 GiB GPU, 1 GiB of it outside the allocator
SIMULATED_BYTES, SIMULATED_RESERVE_BYTES = 80 << 30, 1 << 30


@dataclass
class Target:
    """Where the checks run: a CUDA device, or (simulated) the CPU with the caching allocator model."""
    device: torch.device
    capacity_bytes: int
    simulated: bool = False

    def recorder(self, timeline_path: Optional[Path], warmup_steps: int, snapshot_dir: Path,
                 device_free_bytes: Optional[int] = None) -> CudaRecorder:
        """A started CUDA recorder; `device_free_bytes` caps what the (simulated) allocator may take."""
        if not self.simulated:
            return CudaRecorder(0, self.device, self.capacity_bytes, timeline_path, warmup_steps,
                                snapshot_dir=snapshot_dir)
        from bench.accounting.caching_allocator import AllocatorSettings
        from bench.run.memory.simulated import SimulatedCudaRecorder

        free = device_free_bytes or self.capacity_bytes - SIMULATED_RESERVE_BYTES
        recorder = SimulatedCudaRecorder(0, self.capacity_bytes, self.capacity_bytes, free, None,
                                         AllocatorSettings(), timeline_path, warmup_steps, snapshot_dir=snapshot_dir)
        recorder.start()
        return recorder


def target_for(simulate: bool, log: CheckLog) -> Optional[Target]:
    if simulate:
        return Target(torch.device("cpu"), SIMULATED_BYTES, simulated=True)
    if not torch.cuda.is_available():
        log.check("cuda available", False, "torch sees no CUDA device; use --simulate on CPU machines")
        return None
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    log.check("cuda available", True, f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
                                      f"CUDA {torch.version.cuda}")
    return Target(device, torch.cuda.get_device_properties(device).total_memory)


def read_timeline(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def read_snapshot(paths: List[str]) -> Optional[dict]:
    """The run's snapshot (this process just wrote it), None when there is none."""
    existing = [Path(p) for p in paths if Path(p).exists() and Path(p).stat().st_size > 0]
    if not existing:
        return None
    with open(existing[0], "rb") as handle:
        return pickle.load(handle)


def _recording_checks(target: Target, out_dir: Path, steps: int, width: int, batch: int, log: CheckLog):
    """A short training run through the recorder; (model, optimizer)."""
    model = make_model(target.device, width)
    optimizer = torch.optim.Adam(model.parameters())
    warmup_steps = 1
    recorder = target.recorder(out_dir / "timeline_rank0.csv", warmup_steps, out_dir)
    with recorder.phase(-1, "build"):
        pass
    recorder.attribute({"dense_params": list(model.parameters())})
    train(model, optimizer, recorder, target.device, steps, batch, width)
    recorder.attribute({"dense_params": list(model.parameters()),
                        "dense_optimizer": [t for s in optimizer.state.values() for t in s.values()
                                            if isinstance(t, torch.Tensor)]})
    result = recorder.result("ok")
    raw_used = recorder.sampler.sample_now().used_bytes if recorder.sampler is not None else None
    reserved_now = recorder.allocator_stats().reserved_bytes
    recorder.close()
    (out_dir / "rank0.json").write_text(json.dumps(asdict(result), indent=2))
    log.check("allocator peaks", result.peak_allocated_bytes > 0 and result.peak_reserved_bytes >= result.peak_allocated_bytes,
              f"peak allocated {result.peak_allocated_bytes / MIB:.1f} MiB, reserved {result.peak_reserved_bytes / MIB:.1f} MiB")
    log.verdict("nvml device used >= reserved", nvml_covers_reserved(raw_used, reserved_now))
    log.verdict("breakdown sums to peak", breakdown_adds_up(result.peak_bytes, result.breakdown))
    log.verdict("peak phase holds the highest allocated", peak_phase_holds_the_maximum(
        (result.peak_step, result.peak_phase), result.peak_allocated_bytes,
        read_timeline(out_dir / "timeline_rank0.csv"), warmup_steps))
    log.verdict("memory_viz snapshot", snapshot_is_readable(read_snapshot(recorder.snapshot_paths),
                                                            need_frames=not target.simulated))
    return model, optimizer


# the forced OOM: a request far over what the capped allocator has left
FORCED_OOM_BYTES = 1 << 30
OOM_HEADROOM_BYTES = 256 * MIB


def _forced_oom(target: Target, out_dir: Path) -> Optional[OomEvent]:
    """Allocate FORCED_OOM_BYTES with OOM_HEADROOM_BYTES left; the OOM event the recorder makes of it
    (None if none came)."""
    if target.simulated:
        oom_recorder = target.recorder(None, 0, out_dir, device_free_bytes=OOM_HEADROOM_BYTES)
    else:
        oom_recorder = target.recorder(None, 0, out_dir)
        torch.cuda.empty_cache()
        used = torch.cuda.memory_reserved(target.device)
        torch.cuda.set_per_process_memory_fraction(min(1.0, (used + OOM_HEADROOM_BYTES) / target.capacity_bytes),
                                                   target.device)
    try:
        with oom_recorder.phase(0, "forward"):
            torch.empty(FORCED_OOM_BYTES, dtype=torch.uint8, device=target.device)
    except torch.OutOfMemoryError as exc:
        return OomEvent.from_exception(exc, 0, oom_recorder.step, oom_recorder.phase_name,
                                       oom_recorder.failure_stats())
    finally:
        if not target.simulated:
            torch.cuda.set_per_process_memory_fraction(1.0, target.device)
        oom_recorder.close()
    return None


OVERHEAD_BLOCKS = 3


def timed_blocks(target: Target, model, optimizer, steps: int, batch: int, width: int,
                 blocks: int = OVERHEAD_BLOCKS) -> Tuple[List[float], List[float]]:
    """Seconds per step of recorded and plain blocks, interleaved (recorded, plain, recorded, ...)."""
    recorded, plain = [], []
    for _ in range(blocks):
        recorder = target.recorder(None, 0, None)
        try:
            recorded.append(train(model, optimizer, recorder, target.device, steps, batch, width))
        finally:
            recorder.close()
        plain.append(train(model, optimizer, None, target.device, steps, batch, width))
    return recorded, plain


def recorder_checks(target: Target, out_dir: Path, steps: int, width: int, batch: int, log: CheckLog) -> None:
    model, optimizer = _recording_checks(target, out_dir, steps, width, batch, log)
    if target.simulated:
        # the simulated device on CPU says nothing about a GPU's timing, and a timing limit on a shared CPU
        # machine would only be noise
        log.skip("recorder overhead", "simulated, not a CUDA timing")
    else:
        log.verdict("recorder overhead", overhead_within(*timed_blocks(target, model, optimizer, steps, batch, width)))
    event = _forced_oom(target, out_dir)
    log.verdict("forced OOM recorded", oom_recorded(event, FORCED_OOM_BYTES))
    log.check("OOM snapshot", (out_dir / "oom_rank0.pickle").exists(), str(out_dir / "oom_rank0.pickle"))
    del model, optimizer
    if not target.simulated:
        # the `membench run` stages share this GPU: what this process keeps cached would be in their
        # device-wide NVML readings wherever NVML cannot report per process (audit N7)
        torch.cuda.synchronize(target.device)
        torch.cuda.empty_cache()
