"""Benchmark: the exact CPU recorder's step time against the floor that any TorchDispatchMode pays.

    python -m bench.perf.dispatch_floor [--workload tiny] [--blocks 5] [--steps 30] [overrides...]

One process trains rank 0 of an emulated 2-rank job (no torchrun, no gloo: the launch noise of
bench.perf.recorder_overhead is gone) and times the same model's steps in alternating blocks: with no mode,
under a dispatch mode that only calls each op (the cost of Python seeing every op, which no Python-level
recorder avoids), and under membench's LiveTensorTracker. It prints the median step time of each and the
ratios: `tracker / none` is the recording overhead, `empty / none` the floor inside it, and `tracker / empty`
what the tracker's own bookkeeping adds.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.accounting.dispatch_mode import DispatchMode, TorchDispatchMode
from bench.accounting.live_tensors import LiveTensorTracker
from bench.run.backends import make_backend
from bench.run.emulated_group import init_emulated_group
from bench.run.execute import compose_run_config
from bench.run.launchspec import checked_run
from bench.run.memory.factory import make_recorder
from bench.run.worker import make_batches
from workloads.spec import build_spec


class CallOnly(DispatchMode):
    """Sees every op and only runs it: the floor of Python-level interception (as membench's modes pay it)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **kwargs) if kwargs else func(*args)


class CallOnlyWrapped(TorchDispatchMode):
    """CallOnly with torch's per-op Dynamo-disable wrapper left on (what membench's modes paid before): torch
    wraps the same function, found in this class's own namespace."""

    __torch_dispatch__ = CallOnly.__torch_dispatch__


def build_rank(overrides, run_dir: Path):
    """(backend, batches) of rank 0 of an emulated 2-rank job, built under the real recorder (as a run builds)."""
    cfg, launch = checked_run(compose_run_config([*overrides, "emulate.world_size=2", "emulate.rank=0"]), 0)
    torch.manual_seed(cfg.workload.seed)
    init_emulated_group(0, launch.world_size)
    device = torch.device("cpu")
    recorder = make_recorder(cfg, launch, 0, device, None, run_dir)
    recorder.heartbeat = lambda: None
    recorder.start()
    spec = build_spec(cfg.workload)
    backend = make_backend(cfg.model.backend)
    with recorder.phase(-1, "build"):
        backend.build(cfg, spec, launch, device, 0, recorder)
    recorder.tracker.__exit__(None, None, None)  # the blocks below choose their own mode
    return backend, make_batches(cfg.workload.generator, spec, 0, launch.world_size, device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny")
    parser.add_argument("--blocks", type=int, default=5, help="alternating blocks per mode")
    parser.add_argument("--steps", type=int, default=30, help="steps per block")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one core per mode's step: the other core's load does not leak into the ratio
    with tempfile.TemporaryDirectory(prefix="membench-floor-") as tmp:
        backend, batches = build_rank([f"workload={args.workload}", *args.overrides], Path(tmp))
    steps = iter(range(1 << 30))

    def step() -> None:
        loss = backend.loss(backend.prepare(batches.batch(next(steps))))
        loss.backward()
        for _, optimizer in backend.optimizers:
            optimizer.step()
            optimizer.zero_grad()

    modes = {"none": contextlib.nullcontext, "empty mode, torch's wrapper": CallOnlyWrapped, "empty mode": CallOnly,
             "tracker": lambda: LiveTensorTracker(torch.device("cpu"), 1 << 50, rank=0)}
    times = {name: [] for name in modes}
    for _ in range(3):
        step()  # warm-up
    for block in range(args.blocks):
        for name, make_mode in modes.items():
            block_times = []
            for _ in range(args.steps):
                started = time.perf_counter()
                with make_mode():
                    step()
                block_times.append(time.perf_counter() - started)
            times[name].append(statistics.median(block_times) * 1000)
        print(f"block {block + 1}/{args.blocks}: " + ", ".join(f"{n} {t[-1]:.2f} ms" for n, t in times.items()),
              flush=True)
    none, wrapped, empty, tracker = (statistics.median(times[name]) for name in modes)
    print(f"workload {args.workload}: step p50 none {none:.2f} ms, empty mode {empty:.2f} ms (with torch's wrapper "
          f"{wrapped:.2f} ms), tracker {tracker:.2f} ms -> tracker/none {tracker / none:.2f}x (floor empty/none "
          f"{empty / none:.2f}x, with torch's wrapper {wrapped / none:.2f}x; tracker/empty {tracker / empty:.2f}x)")


if __name__ == "__main__":
    main()
