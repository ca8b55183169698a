"""The CUDA recorder on a small model: allocator peaks, NVML, breakdown, memory_viz snapshot, its overhead,
and a forced OOM (`torch.cuda.set_per_process_memory_fraction`). Simulated (`--simulate`), the same code
runs on CPU with the recorder of a simulated device (bench.run.memory.simulated): the caching allocator
model in place of torch.cuda and NVML."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch
from torch import nn

from bench.accounting.oom import OomEvent
from bench.gpucheck.log import CheckLog
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


def _recording_checks(target: Target, out_dir: Path, steps: int, width: int, batch: int, log: CheckLog):
    """A short training run through the recorder; (model, optimizer, seconds per recorded step)."""
    model = make_model(target.device, width)
    optimizer = torch.optim.Adam(model.parameters())
    recorder = target.recorder(out_dir / "timeline_rank0.csv", 1, out_dir)
    with recorder.phase(-1, "build"):
        pass
    recorder.attribute({"dense_params": list(model.parameters())})
    recorded_s = train(model, optimizer, recorder, target.device, steps, batch, width)
    recorder.attribute({"dense_params": list(model.parameters()),
                        "dense_optimizer": [t for s in optimizer.state.values() for t in s.values()
                                            if isinstance(t, torch.Tensor)]})
    result = recorder.result("ok")
    recorder.close()
    (out_dir / "rank0.json").write_text(json.dumps(asdict(result), indent=2))
    log.check("allocator peaks", result.peak_allocated_bytes > 0 and result.peak_reserved_bytes >= result.peak_allocated_bytes,
          f"peak allocated {result.peak_allocated_bytes / MIB:.1f} MiB, reserved {result.peak_reserved_bytes / MIB:.1f} MiB")
    device_used = result.peak_device_used_bytes
    log.check("nvml device used >= reserved", device_used is not None and device_used >= result.peak_reserved_bytes,
          f"device used {device_used and device_used / MIB:.1f} MiB")
    log.check("breakdown sums to peak", sum(result.breakdown.values()) == result.peak_bytes,
          f"peak {result.peak_bytes / MIB:.1f} MiB = " + ", ".join(
              f"{k} {v / MIB:.1f}" for k, v in result.breakdown.items() if v))
    snapshots = [Path(p) for p in recorder.snapshot_paths]
    log.check("memory_viz snapshot", bool(snapshots) and all(p.exists() and p.stat().st_size > 0 for p in snapshots),
          ", ".join(f"{p.name} {p.stat().st_size} B" for p in snapshots if p.exists()))
    return model, optimizer, recorded_s


def _forced_oom(target: Target, out_dir: Path) -> Optional[OomEvent]:
    """Allocate 1 GiB more than is left; the OOM event the recorder makes of it (None if none came)."""
    if target.simulated:
        oom_recorder = target.recorder(None, 0, out_dir, device_free_bytes=256 * MIB)
    else:
        oom_recorder = target.recorder(None, 0, out_dir)
        torch.cuda.empty_cache()
        used = torch.cuda.memory_reserved(target.device)
        torch.cuda.set_per_process_memory_fraction(min(1.0, (used + 256 * MIB) / target.capacity_bytes), target.device)
    try:
        with oom_recorder.phase(0, "forward"):
            torch.empty(1 << 30, dtype=torch.uint8, device=target.device)  # 1 GiB > what is left
    except torch.OutOfMemoryError as exc:
        return OomEvent.from_exception(exc, 0, oom_recorder.step, oom_recorder.phase_name,
                                       oom_recorder.failure_stats())
    finally:
        if not target.simulated:
            torch.cuda.set_per_process_memory_fraction(1.0, target.device)
        oom_recorder.close()
    return None


def recorder_checks(target: Target, out_dir: Path, steps: int, width: int, batch: int, log: CheckLog) -> None:
    model, optimizer, recorded_s = _recording_checks(target, out_dir, steps, width, batch, log)
    # the recorder's overhead: the same steps without it (a GPU measurement: the simulated device on CPU says
    # nothing about it, and a timing limit on a shared CPU machine would only be noise)
    plain_s = train(model, optimizer, None, target.device, steps, batch, width)
    ratio = recorded_s / plain_s if plain_s else float("inf")
    detail = f"step {recorded_s * 1e3:.2f} ms recorded vs {plain_s * 1e3:.2f} ms plain: ratio {ratio:.3f}"
    if target.simulated:
        log.skip("recorder overhead", f"simulated, not a CUDA timing ({detail})")
    else:
        log.check("recorder overhead", ratio < 1.10, detail)
    event = _forced_oom(target, out_dir)
    log.check("forced OOM recorded", event is not None and event.phase == "forward" and event.step == 0
              and event.requested_bytes == 1 << 30 and event.stats.get("num_ooms", 0) >= 1,
              f"{event.message[:120] if event else 'no OutOfMemoryError raised'}")
    log.check("OOM snapshot", (out_dir / "oom_rank0.pickle").exists(), str(out_dir / "oom_rank0.pickle"))
