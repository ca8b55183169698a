"""Launch one run under torchrun as a subprocess and turn what the ranks left behind into a summary.

The torchrun command is an argument list (never a shell string), runs in its own process group so a
timeout can kill every rank, and its output is streamed to the console and to `launcher.log`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import List, Optional

from bench.exit_codes import STATUS_EXIT_CODE
from bench.results import (ResultsError, RankResult, RunSummary, job_stats, load_rank_result, rank_file,
                           write_summary)
from bench.runspec import LaunchSpec, config_hash, write_run_config
from bench.config import RunConfig
from bench.predict import score, try_predict_run
from bench.versions import environment_versions

KILL_GRACE_S = 5.0


@dataclass
class ProcessOutcome:
    returncode: Optional[int]
    timed_out: bool
    wall_s: float
    log_tail: List[str]


def torchrun_command(launch: LaunchSpec, run_dir: Path) -> List[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--standalone",  # single node: c10d rendezvous on a free local port
        f"--nproc-per-node={launch.ranks_per_node}",
        "--max-restarts=0",
        "-m", "bench.worker", "--run-dir", str(run_dir),
    ]


def worker_env(launch: LaunchSpec) -> dict:
    env = dict(os.environ)
    # Share the cores between ranks instead of torchrun's blanket 1 thread (and its banner).
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // launch.ranks_per_node)))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = env.get("PYTHONWARNINGS", "ignore::FutureWarning")
    return env


def run_process(cmd: List[str], env: dict, log_path: Path, timeout_s: float, echo: bool = True,
                tail_lines: int = 40) -> ProcessOutcome:
    """Run `cmd` in a new session, tee its output, kill the whole group on timeout or Ctrl-C."""
    started = time.monotonic()
    tail: List[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                bufsize=1, start_new_session=True)

        def pump() -> None:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))
                del tail[:-tail_lines]
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
        except KeyboardInterrupt:
            kill_group(proc)
            raise
        reader.join(timeout=KILL_GRACE_S)
    return ProcessOutcome(proc.returncode, timed_out, time.monotonic() - started, tail)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group (torchrun forwards it to the ranks), then SIGKILL whatever is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # ranks can outlive torchrun itself
    except ProcessLookupError:
        pass
    proc.wait()


def collect_ranks(run_dir: Path, world_size: int) -> tuple[List[RankResult], List[str]]:
    ranks, problems = [], []
    for rank in range(world_size):
        path = rank_file(run_dir, rank)
        if not path.exists():
            problems.append(f"rank {rank} wrote no result")
            continue
        try:
            ranks.append(load_rank_result(path))
        except ResultsError as err:
            problems.append(str(err))
    return ranks, problems


def run_status(outcome: ProcessOutcome, ranks: List[RankResult], world_size: int) -> str:
    if any(r.status == "oom" for r in ranks):
        return "oom"
    if outcome.timed_out:
        return "timeout"
    if outcome.returncode == 0 and len(ranks) == world_size and all(r.status == "ok" for r in ranks):
        return "ok"
    return "failed"


def failure_reason(status: str, outcome: ProcessOutcome, ranks: List[RankResult], problems: List[str],
                   timeout_s: float) -> Optional[str]:
    if status == "ok":
        return None
    if status == "timeout":
        return f"no result within timeout_s={timeout_s:g} s; killed the torchrun process group"
    if status == "oom":
        first = next(r for r in ranks if r.status == "oom")
        oom = first.oom or {}
        return f"rank {first.rank} out of memory at step {oom.get('step')} ({oom.get('phase')}): {oom.get('message')}"
    for rank in ranks:
        if rank.error:
            return f"rank {rank.rank}: {rank.error}"
    errors = [line for line in outcome.log_tail if "Error" in line or "error" in line]
    detail = errors[-1].strip() if errors else (problems[0] if problems else "see launcher.log")
    return f"torchrun exited with {outcome.returncode}: {detail}"[:500]


def launch_run(cfg: RunConfig, launch: LaunchSpec, run_dir: Path, run_id: str, *,
               sweep_id: Optional[str] = None, echo: bool = True) -> RunSummary:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_config(run_dir, cfg, launch)
    estimate = try_predict_run(cfg, launch)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    outcome = run_process(torchrun_command(launch, run_dir), worker_env(launch), run_dir / "launcher.log",
                          cfg.timeout_s, echo=echo)
    ranks, problems = collect_ranks(run_dir, launch.world_size)
    status = run_status(outcome, ranks, launch.world_size)
    summary = RunSummary(
        run_id=run_id,
        status=status,
        mode=cfg.mode,
        workload=cfg.workload.name,
        hardware=cfg.hardware.name,
        world_size=launch.world_size,
        device_type=launch.device_type,
        device_name=device_name(launch),
        model_backend=cfg.model.backend,
        config_hash=config_hash(cfg),
        versions=environment_versions(),
        started_at=started_at,
        wall_s=round(outcome.wall_s, 3),
        exit_code=STATUS_EXIT_CODE[status],
        error=failure_reason(status, outcome, ranks, problems, cfg.timeout_s),
        oom_ranks=sorted(r.rank for r in ranks if r.status == "oom"),
        per_rank=sorted(ranks, key=lambda r: r.rank),
        job=job_stats(ranks, cfg.workload.batch_size, cfg.workload.warmup_steps),
        sharding_plan=read_plan(run_dir),
        estimate=score(estimate, ranks),
        sweep_id=sweep_id,
    )
    write_summary(run_dir, summary)
    return summary


def read_plan(run_dir: Path) -> list:
    import json

    path = run_dir / "sharding_plan.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def device_name(launch: LaunchSpec) -> str:
    if launch.device_type == "cuda":
        import torch

        return torch.cuda.get_device_name(0)
    import platform

    return f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


