"""Validate the CUDA recording backend on a real GPU with stock PyTorch (no torchrec or fbgemm).

    python -m bench.apps.gpu_check            # on a machine with a CUDA GPU
    python -m bench.apps.gpu_check --dry-run  # anywhere: same checks, CUDA/NVML calls replaced by fakes

A small MLP trains for a few steps through `CudaRecorder`, then a forced OOM is provoked with
`torch.cuda.set_per_process_memory_fraction`. One line per check; exit status 1 if any check fails.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn

from bench.run.memory.cuda import CudaRecorder
from bench.run.memory.cuda_stats import CudaAllocatorStats
from bench.run.memory.nvml import NvmlSample
from bench.accounting.oom import OomEvent
from workloads.units import MIB

Check = Tuple[str, bool, str]


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


# -- dry run: the same flow with CPU stand-ins for every CUDA/NVML call --------------------------
class DryRunCuda:
    """Fake allocator/NVML/snapshot functions driven by an exact CPU live-tensor count."""

    def __init__(self, capacity_bytes: int):
        from bench.accounting.live_tensors import LiveTensorTracker

        self.tracker = LiveTensorTracker(torch.device("cpu"), capacity_bytes, rank=0)
        self.ooms = 0

    def read_stats(self, device) -> CudaAllocatorStats:
        allocated, peak = self.tracker.live_bytes, self.tracker.phase_peak_bytes
        rounded = lambda n: -(-n // (2 * MIB)) * 2 * MIB  # the caching allocator's 2 MiB segments
        return CudaAllocatorStats(allocated_bytes=allocated, peak_allocated_bytes=peak,
                                  reserved_bytes=rounded(allocated), peak_reserved_bytes=rounded(peak),
                                  num_ooms=self.ooms)

    def reset_peaks(self, device) -> None:
        self.tracker.reset_phase_peak()

    def sampler(self) -> "DryRunSampler":
        return DryRunSampler(self)

    # snapshots
    def start_history(self, max_entries: int) -> None:
        pass

    def stop_history(self) -> None:
        pass

    def dump_snapshot(self, path) -> str:
        Path(path).write_bytes(b"dry-run snapshot")
        return str(path)


class DryRunSampler:
    CONTEXT_BYTES = 500 * MIB  # what a CUDA context costs, roughly

    def __init__(self, fake: DryRunCuda):
        self.fake = fake

    def start(self):
        return self

    def stop(self) -> None:
        pass

    def sample_now(self) -> NvmlSample:
        reserved = self.fake.read_stats(None).reserved_bytes
        return NvmlSample(time.monotonic(), reserved + self.CONTEXT_BYTES, 80 << 30, None, None)


@dataclass
class Target:
    """Where the checks run: the device, the recorder's CUDA/NVML hooks (fakes in a dry run), capacity."""
    device: torch.device
    hooks: dict
    capacity_bytes: int
    fake: Optional[DryRunCuda] = None


def _target(dry_run: bool, check: Callable[[str, bool, str], None]) -> Optional[Target]:
    if dry_run:
        fake = DryRunCuda(capacity_bytes=8 << 30)
        fake.tracker.__enter__()
        hooks = dict(read_stats=fake.read_stats, reset_peaks=fake.reset_peaks, sampler=fake.sampler(),
                     snapshots=fake)
        return Target(torch.device("cpu"), hooks, 8 << 30, fake)
    if not torch.cuda.is_available():
        check("cuda available", False, "torch sees no CUDA device; use --dry-run on CPU machines")
        return None
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    check("cuda available", True, f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}")
    return Target(device, {}, torch.cuda.get_device_properties(device).total_memory)


def _recording_checks(target: Target, out_dir: Path, steps: int, width: int, batch: int,
                      check: Callable[[str, bool, str], None]):
    """A short training run through the recorder; (model, optimizer, seconds per recorded step)."""
    model = make_model(target.device, width)
    optimizer = torch.optim.Adam(model.parameters())
    recorder = CudaRecorder(0, target.device, target.capacity_bytes, out_dir / "timeline_rank0.csv", warmup_steps=1,
                            snapshot_dir=out_dir, **target.hooks)
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
    check("allocator peaks", result.peak_allocated_bytes > 0 and result.peak_reserved_bytes >= result.peak_allocated_bytes,
          f"peak allocated {result.peak_allocated_bytes / MIB:.1f} MiB, reserved {result.peak_reserved_bytes / MIB:.1f} MiB")
    device_used = result.peak_device_used_bytes
    check("nvml device used >= reserved", device_used is not None and device_used >= result.peak_reserved_bytes,
          f"device used {device_used and device_used / MIB:.1f} MiB")
    check("breakdown sums to peak", sum(result.breakdown.values()) == result.peak_bytes,
          f"peak {result.peak_bytes / MIB:.1f} MiB = " + ", ".join(
              f"{k} {v / MIB:.1f}" for k, v in result.breakdown.items() if v))
    snapshots = [Path(p) for p in recorder.snapshot_paths]
    check("memory_viz snapshot", bool(snapshots) and all(p.exists() and p.stat().st_size > 0 for p in snapshots),
          ", ".join(f"{p.name} {p.stat().st_size} B" for p in snapshots if p.exists()))
    return model, optimizer, recorded_s


def _forced_oom(target: Target, out_dir: Path) -> Optional[OomEvent]:
    """Allocate 1 GiB more than is left; the OOM event the recorder makes of it (None if none came)."""
    oom_recorder = CudaRecorder(0, target.device, target.capacity_bytes, None, warmup_steps=0, snapshot_dir=out_dir,
                                **target.hooks)
    fake, dry_run = target.fake, target.fake is not None
    try:
        if dry_run:
            fake.tracker.capacity_bytes = fake.tracker.live_bytes + 64 * MIB
        else:
            torch.cuda.empty_cache()
            used = torch.cuda.memory_reserved(target.device)
            torch.cuda.set_per_process_memory_fraction(min(1.0, (used + 256 * MIB) / target.capacity_bytes),
                                                       target.device)
        with oom_recorder.phase(0, "forward"):
            torch.empty(1 << 30, dtype=torch.uint8, device=target.device)  # 1 GiB > what is left
    except torch.OutOfMemoryError as exc:
        if dry_run:
            fake.ooms += 1
        return OomEvent.from_exception(exc, 0, oom_recorder.step, oom_recorder.phase_name,
                                       oom_recorder.failure_stats())
    finally:
        if not dry_run:
            torch.cuda.set_per_process_memory_fraction(1.0, target.device)
        oom_recorder.close()
        if dry_run:
            fake.tracker.__exit__(None, None, None)
    return None


def run_checks(dry_run: bool, out_dir: Path, steps: int, width: int, batch: int) -> List[Check]:
    checks: List[Check] = []

    def check(name: str, ok: bool, detail: str) -> None:
        checks.append((name, bool(ok), detail))
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)

    target = _target(dry_run, check)
    if target is None:
        return checks
    # 1. recording a short training run
    model, optimizer, recorded_s = _recording_checks(target, out_dir, steps, width, batch, check)
    # 2. recorder overhead: the same steps without a recorder (a GPU measurement: the dry run's CPU
    # stand-in says nothing about it, and a timing limit on a shared CPU machine would only be noise)
    plain_s = train(model, optimizer, None, target.device, steps, batch, width)
    ratio = recorded_s / plain_s if plain_s else float("inf")
    detail = f"step {recorded_s * 1e3:.2f} ms recorded vs {plain_s * 1e3:.2f} ms plain: ratio {ratio:.3f}"
    if dry_run:
        print(f"SKIP recorder overhead: dry run, not a CUDA timing ({detail})", flush=True)
    else:
        check("recorder overhead", ratio < 1.10, detail)
    # 3. a forced OOM is captured with its step, phase and requested bytes
    event = _forced_oom(target, out_dir)
    check("forced OOM recorded", event is not None and event.phase == "forward" and event.step == 0
          and event.requested_bytes == 1 << 30 and event.stats.get("num_ooms", 0) >= 1,
          f"{event.message[:120] if event else 'no OutOfMemoryError raised'}")
    check("OOM snapshot", (out_dir / "oom_rank0.pickle").exists(), str(out_dir / "oom_rank0.pickle"))
    native_workload_checks(dry_run, out_dir, check)
    return checks


def membench_run(out_dir: Path, *overrides: str) -> Tuple[Optional[dict], str]:
    """`membench run` as a user would start it; (summary or None, last output lines)."""
    import subprocess

    runs = out_dir / "runs"
    before = set(runs.rglob("summary.json")) if runs.exists() else set()
    proc = subprocess.run([sys.executable, "-m", "bench", "run", f"results_dir={runs}", *overrides],
                          capture_output=True, text=True, timeout=240)
    new = sorted(set(runs.rglob("summary.json")) - before) if runs.exists() else []
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
    return (json.loads(new[0].read_text()) if new else None), " | ".join(tail)


def native_workload_checks(dry_run: bool, out_dir: Path, check: Callable[[str, bool, str], None]) -> None:
    """The tiny workload end to end on the plain-PyTorch backend (no torchrec needed), then a forced OOM."""
    try:
        import hydra  # noqa: F401  (the CLI needs hydra-core and omegaconf)
    except ImportError:
        check("native workload", False, "hydra-core is not installed; install membench's pure-Python deps")
        return
    ranks = 2 if dry_run else max(1, min(2, torch.cuda.device_count()))
    hardware = ["hardware=cpu"] if dry_run else ["hardware=auto", f"hardware.ranks_per_node={ranks}",
                                                 "record.snapshot=true"]
    common = ["model=native", "workload=tiny", "workload.steps=3", *hardware]
    summary, tail = membench_run(out_dir, *common)
    ok = summary is not None and summary["status"] == "ok" and summary["model_backend"] == "native"
    ranks_ok = ok and all(r["peak_bytes"] > 0 and sum(r["breakdown"].values()) == r["peak_bytes"]
                          for r in summary["per_rank"])
    check(f"native workload on {ranks} rank(s)", ranks_ok,
          f"status {summary and summary['status']}, peaks " +
          (", ".join(f"{r['peak_bytes'] / MIB:.1f} MiB" for r in summary["per_rank"]) if summary else tail))
    if not dry_run and ok:
        run_dir = out_dir / "runs"
        used_ok = all((r["peak_device_used_bytes"] or 0) >= (r["peak_reserved_bytes"] or 0) for r in summary["per_rank"])
        check("native: NVML device used >= reserved", used_ok, "per rank")
        check("native: memory_viz snapshots", bool(list(run_dir.rglob("snapshot_rank*.pickle"))), str(run_dir))
    if dry_run:
        forced = ["hardware.capacity_gib=0.005"]
    else:  # an allocator cap of 8 MiB: far below what the tiny workload needs
        fraction = 8 * MIB / torch.cuda.get_device_properties(0).total_memory
        forced = [f"hardware.memory_fraction={fraction:.8f}"]
    summary, tail = membench_run(out_dir, *common, *forced)
    oom = summary and next((r["oom"] for r in summary["per_rank"] if r.get("oom")), None)
    check("native: forced OOM recorded", bool(summary and summary["status"] == "oom" and oom and oom["phase"]),
          f"status {summary and summary['status']}: rank {oom and oom['rank']} step {oom and oom['step']} "
          f"{oom and oom['phase']}" if summary else tail)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="run on CPU with fakes for CUDA and NVML")
    parser.add_argument("--out", type=Path, default=None, help="where to keep timeline, result and snapshots")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4096)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="membench-gpu-check-") as tmp:
        out_dir = args.out or Path(tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        checks = run_checks(args.dry_run, out_dir, args.steps, args.width, args.batch)
    failed = [name for name, ok, _ in checks if not ok]
    print(f"gpu check{' (dry run)' if args.dry_run else ''}: {len(checks) - len(failed)} passed, "
          f"{len(failed)} failed" + (f" ({', '.join(failed)})" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
