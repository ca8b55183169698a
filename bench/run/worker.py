"""Per-rank entry point, started by torchrun: init process group, build + shard, train, record.

Exit codes: 0 ok, 3 out of memory (results and partial timeline written first), 1 anything else
(torchelastic's `record` writes the error file torchrun reports as the root cause).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Tuple

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from bench.results.schema import DEVICE_CUDA, EXIT_FAILED, EXIT_OK, EXIT_OOM
from bench.run.memory.factory import make_recorder
from bench.run.memory.recorder import StepTimeRecorder
from bench.accounting.oom import OomEvent, is_memory_failure
from bench.run.backends import make_backend
from bench.planning.torchrec_adapter import quiet_libraries
from bench.results.store import heartbeat, progress_file, timeline_file, write_rank_result
from bench.run.launchspec import LaunchSpec, load_run_config, rank_cuda_index
from workloads.pipelines import pipeline_kind
from bench.run.pipelines import PipelinedTraining, after_step
from workloads.data import SyntheticBatches, draws_on_device
from workloads.spec import build_spec


def log(speaks: bool, message: str) -> None:
    if speaks:
        print(f"[membench] {message}", flush=True)


def train(cfg, launch: LaunchSpec, run_dir: Path, rank: int, device: torch.device, recorder) -> None:
    spec = build_spec(cfg.workload)
    backend = make_backend(cfg.model.backend)
    t0 = time.perf_counter()
    with recorder.phase(-1, "build"):
        backend.build(cfg, spec, launch, device, rank, recorder)
    recorder.attribute(backend.ownership())
    speaks = rank == launch.measured_ranks[0]  # rank 0, or the one emulated: writes the plan, says the steps
    if speaks:
        (run_dir / "sharding_plan.json").write_text(json.dumps(backend.plan_rows, indent=2) + "\n")
    log(speaks, f"built {len(spec.tables)} tables ({backend.name} backend) in {time.perf_counter() - t0:.1f} s; "
              f"training {cfg.workload.warmup_steps} warm-up + {cfg.workload.steps} steps")
    batches = make_batches(cfg.workload.generator, spec, rank, launch.world_size, device)
    if launch.emulated_rank is not None:
        from bench.run.peer_batches import answer_peers

        answer_peers(cfg, launch, backend, batches)
    total_steps = cfg.workload.warmup_steps + cfg.workload.steps
    kind = pipeline_kind(cfg.pipeline.name)
    if kind.torchrec_class is None:
        train_plain(backend, batches, recorder, total_steps, lambda message: log(speaks, message))
    else:
        log(speaks, f"through torchrec's {kind.torchrec_class}; in flight: {kind.holds}")
        PipelinedTraining(kind, backend, batches, recorder, lambda message: log(speaks, message)).run(total_steps)
    recorder.finish_steps()


def make_batches(generator: str, spec, rank: int, world_size: int, device: torch.device):
    """The rank's input stream (workload.generator)."""
    if draws_on_device(generator, device.type, spec):
        from workloads.device_data import DeviceSyntheticBatches

        return DeviceSyntheticBatches(spec, rank, world_size, device)
    return SyntheticBatches(spec, rank, world_size)


def train_plain(backend, batches, recorder, total_steps: int, log) -> None:
    """membench's own loop (pipeline=plain): each step makes its batch, then trains it."""
    for step in range(total_steps):
        with recorder.phase(step, "input"):
            batch = backend.prepare(batches.batch(step))
        with recorder.phase(step, "forward"):
            loss = backend.loss(batch)
        with recorder.phase(step, "backward"):
            loss.backward()
        with recorder.phase(step, "optimizer"):
            for category, optimizer in backend.optimizers:
                with recorder.category(category):
                    optimizer.step()
            after_step(backend, recorder, step, log)
            for _, optimizer in backend.optimizers:
                optimizer.zero_grad()
        del batch, loss
        log(f"step {step + 1}/{total_steps} done")


def hang_once(recorder, resume) -> None:
    """Fault drill (MEMBENCH_FAULT_HANG_RANK=<rank>): stop making progress, as a stuck rank would, until a
    signal ends the wait; the failure path then runs normally (it must not hang again)."""
    recorder.heartbeat = resume
    while True:
        time.sleep(3600)


class Terminated(BaseException):
    """SIGTERM from torchrun (a peer rank failed) or from the launcher's watchdog."""


def raise_terminated(signum, frame) -> None:
    raise Terminated(f"terminated by signal {signal.Signals(signum).name} (a peer rank failed or the run "
                     f"was stopped)")


def write_result(run_dir: Path, recorder, status: str, oom: OomEvent | None = None,
                 error: str | None = None) -> None:
    recorder.stop()
    result = recorder.result(status)
    result.oom = oom.to_dict() if oom else None
    result.error = error
    write_rank_result(run_dir, result)


def record_failure(run_dir: Path, recorder, rank: int, exc: BaseException) -> int:
    """A rank that raised: its result first (OOM, with where and how much, or failed), then what can take
    long (the allocator snapshot, in `close`); returns the exit code. Memory failures outside the caching
    allocator (NCCL, cuBLAS, UVM) count as OOM too. A peer's failure reaches this rank twice, as a broken
    collective and as torchrun's SIGTERM: the second must not cut the result's writing short, so SIGTERM is
    ignored from here on (the rank exits right after; the launcher's reaper still has SIGKILL)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    recorder.stop()
    recorder.record_failure_row()
    if is_memory_failure(exc):
        oom = OomEvent.from_exception(exc, rank, recorder.step, recorder.phase_name, recorder.failure_stats())
        print(f"[membench] rank {rank} out of memory at step {recorder.step} ({recorder.phase_name}): "
              f"{oom.message}", file=sys.stderr, flush=True)
        write_result(run_dir, recorder, "oom", oom=oom)
        code = EXIT_OOM
    else:
        write_result(run_dir, recorder, "failed", error=f"{type(exc).__name__}: {exc}".splitlines()[0][:500])
        code = EXIT_FAILED
    recorder.heartbeat()  # the result is safe: the watchdog may wait for the snapshot
    recorder.close()
    return code


def finish(run_dir: Path, recorder, synchronize) -> None:
    """A rank that trained every step: its result, then the peers (`synchronize`), then the snapshot (a slow
    dump before the barrier would keep the peers waiting in it)."""
    write_result(run_dir, recorder, "ok")
    synchronize()
    recorder.close()


def rank_recorder(cfg, launch: LaunchSpec, rank: int, device: torch.device, run_dir: Path):
    """This rank's memory recorder, heartbeat wired (and, in the fault drill, made to stall once)."""
    timeline = timeline_file(run_dir, rank) if cfg.record.timeline else None
    recorder = make_recorder(cfg, launch, rank, device, timeline, run_dir)
    recorder.heartbeat = lambda: heartbeat(run_dir, rank)
    if os.environ.get("MEMBENCH_FAULT_HANG_RANK") == str(rank):  # fault drill: this rank stops making progress
        resume = recorder.heartbeat
        recorder.heartbeat = lambda: hang_once(recorder, resume)
    return recorder


def process_rank(launch: LaunchSpec) -> Tuple[int, int]:
    """(global rank, local rank) this process trains: torchrun's, or the emulated one (emulate.*)."""
    if launch.emulated_rank is not None:
        return launch.emulated_rank, 0
    return int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])


def init_group(launch: LaunchSpec) -> None:
    """The default process group: torchrun's rendezvous, or a group whose peers this process answers for."""
    if launch.emulated_rank is not None:
        from bench.run.emulated_group import init_emulated_group

        init_emulated_group(launch.emulated_rank, launch.world_size)
    else:
        dist.init_process_group(backend=launch.dist_backend, timeout=timedelta(seconds=launch.collective_timeout_s))


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="membench rank worker (started by torchrun)")
    parser.add_argument("--run-dir", required=True, type=Path)
    return parser.parse_args(argv)


@record
def main(argv=None) -> int:
    args = parse_args(argv)
    quiet_libraries()
    signal.signal(signal.SIGTERM, raise_terminated)
    cfg, launch = load_run_config(args.run_dir)
    rank, local_rank = process_rank(launch)
    # the progress file also names this rank's pid, for operators (and the fault drills)
    progress_file(args.run_dir, rank).write_text(f"{os.getpid()}\n")
    if launch.device_type == DEVICE_CUDA:
        # GROUP_RANK: the node (agent) index torchrun gives the rank
        device = torch.device("cuda", rank_cuda_index(launch, local_rank, int(os.environ.get("GROUP_RANK", "0"))))
        torch.cuda.set_device(device)
        if cfg.hardware.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(cfg.hardware.memory_fraction, device)
    else:
        device = torch.device("cpu")
    torch.manual_seed(cfg.workload.seed)
    init_group(launch)
    recorder = None
    try:
        recorder = rank_recorder(cfg, launch, rank, device, args.run_dir)
        recorder.start()
        train(cfg, launch, args.run_dir, rank, device, recorder)
    except BaseException as exc:
        if recorder is None:  # the recorder could not start: its failure is still this rank's result (N9)
            recorder = StepTimeRecorder(rank, device, launch.capacity_bytes, None, cfg.workload.warmup_steps)
            recorder.heartbeat = lambda: heartbeat(args.run_dir, rank)
        code = record_failure(args.run_dir, recorder, rank, exc)
        if code == EXIT_OOM or isinstance(exc, Terminated):
            # os._exit: the peers are blocked in a collective; a normal teardown could hang on them
            sys.stdout.flush()
            os._exit(code)
        raise  # torchelastic's @record turns this into the root-cause error file
    finish(args.run_dir, recorder, dist.barrier)
    dist.destroy_process_group()
    # Everything is written and the group is gone: skip the interpreter's teardown of torch (about half a
    # second per rank, on every run)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)

if __name__ == "__main__":
    sys.exit(main())
