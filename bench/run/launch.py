"""Launch one run under torchrun as a subprocess and turn what the ranks left behind into a summary.

The torchrun command is an argument list (never a shell string) and runs in its own session; its output
is streamed to the console and to `launcher.log`. Whatever ends a run (success, a failed rank, the
watchdog, timeout_s, Ctrl-C), the launcher ends and then verifies every rank process of it (run.reaper):
torchrun starts each rank in a session of its own, out of reach of a signal to the agent's group.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from bench.planning.predict import score, try_predict_run
from bench.results.schema import (DEVICE_CUDA, DEVICE_CUDA_SIMULATED, RankResult, RunSummary, Status,
                                  has_cuda_allocator, job_stats)
from bench.results.store import ResultsError, load_rank_result, rank_file, write_summary
from bench.run.agent import FORK_RANKS_FLAG
from bench.run.config import RunConfig
from bench.run.emulation import check_rank_fits_host, emulation_record, with_rank, with_rank_config
from bench.run.forked_agent import start_forked_agent
from bench.run.launchspec import LaunchSpec, write_run_config
from bench.run.reaper import KILL_GRACE_S, WORKER_MODULE, end_processes, end_run, wait_for_no_ranks
from bench.run.step_progress import StepWatcher
from bench.run.summary import now_iso, summary_for

AGENT_MODULE = "bench.run.agent"  # torchrun's agent (torch.distributed.run), ending quickly

# One agent failed and another is still running after this long: stop waiting for it
LAGGING_AGENT_S = 6 * KILL_GRACE_S
# After the agents exit, how long their ranks get to finish exiting before they count as left behind
LEFTOVER_WAIT_S = 2.0


@dataclass
class ProcessOutcome:
    returncodes: List[Optional[int]]
    timed_out: bool  # the wall-clock limit (timeout_s) ran out
    stalled: bool  # the watchdog saw no progress for watchdog_s
    wall_s: float
    log_tail: List[str]

    @property
    def returncode(self) -> Optional[int]:
        """0 when every agent succeeded, else the first failing agent's code."""
        return next((code for code in self.returncodes if code != 0), 0)


def torchrun_commands(launch: LaunchSpec, run_dir: Path, run_id: str, fork_ranks: bool = True) -> List[List[str]]:
    """One torchrun agent per node started on this machine (one, unless spawn_all_nodes). With `fork_ranks`
    (launcher.fork_ranks), off CUDA, the agent forks its ranks from itself after importing what they
    import (bench.run.agent)."""
    worker = ["-m", WORKER_MODULE, "--run-dir", str(run_dir)]
    fork = [FORK_RANKS_FLAG] if fork_ranks and launch.device_type != DEVICE_CUDA else []
    ranks_per_agent = 1 if launch.emulated_rank is not None else launch.ranks_per_node
    common = [sys.executable, "-m", AGENT_MODULE, *fork, f"--nproc-per-node={ranks_per_agent}",
              "--max-restarts=0"]
    if not launch.multi_node:
        return [[*common, "--standalone", *worker]]  # single node: rendezvous on a free local port
    rdzv_id = "membench-" + "".join(c if c.isalnum() else "-" for c in run_id)
    return [[*common, f"--nnodes={launch.nodes}", f"--node-rank={node}", "--rdzv-backend=c10d",
             f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--rdzv-id={rdzv_id}", *worker]
            for node in launch.local_node_ranks]


def worker_env(launch: LaunchSpec, cfg: Optional[RunConfig] = None) -> dict:
    env = dict(os.environ)
    # Share this machine's cores between the ranks it runs, instead of torchrun's blanket 1 thread.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // launch.local_processes)))
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = env.get("PYTHONWARNINGS", "ignore::FutureWarning")
    if cfg is not None and launch.device_type == DEVICE_CUDA:
        from bench.accounting.allocator_config import allocator_conf_text

        conf = allocator_conf_text(cfg.allocator, os.environ)
        if conf:  # the run's allocator.* settings reach the ranks' caching allocators this way
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            env.pop("PYTORCH_ALLOC_CONF", None)  # its options are in the one above
    return env


def latest_progress(run_dir: Path) -> float:
    """Wall-clock time of the most recent heartbeat any rank wrote (0 if none yet)."""
    times = [p.stat().st_mtime for p in Path(run_dir).glob(".progress_rank*")]
    return max(times, default=0.0)


def start_agent(command: List[str], env: dict, fork_agent: bool):
    """One agent in a session of its own, its stdout and stderr in one text pipe: forked from this process
    when it forks its ranks and `fork_agent` (bench.run.forked_agent) and OpenMP lets it, else a command."""
    forked = start_forked_agent(command, env) if fork_agent and FORK_RANKS_FLAG in command else None
    return forked or subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, bufsize=1, start_new_session=True)


def run_agents(cmds: List[List[str]], env: dict, log_path: Path, run_dir: Path, timeout_s: float, *,
               watchdog_s: float, echo: bool = True, tail_lines: int = 60, poll_s: float = 0.2,
               kill_grace_s: float = KILL_GRACE_S, fork_agent: bool = False,
               on_started: Callable[[], None] = lambda: None) -> ProcessOutcome:
    """Run the agents, each in its own session, tee their output, and end the agents and every rank on a
    wall-clock timeout, on a stall (no rank progress for watchdog_s), when one agent fails and the others
    do not follow within LAGGING_AGENT_S, or on Ctrl-C (then re-raise). However the agents end, no rank
    of the run is left running when this returns. `on_started` runs once every agent is started: a thread
    started before a forked agent may hold a lock at the fork that the agent then never sees released."""
    tail: List[str] = []
    lock = threading.Lock()
    with open(log_path, "w") as log:
        procs = [start_agent(cmd, env, fork_agent) for cmd in cmds]
        on_started()
        started_wall, started = time.time(), time.monotonic()

        def write(line: str) -> None:
            with lock:
                log.write(line)
                log.flush()
                tail.append(line.rstrip("\n"))
                del tail[:-tail_lines]
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

        def pump(proc: subprocess.Popen, prefix: str) -> None:
            for line in proc.stdout:
                write(prefix + line)

        readers = [threading.Thread(target=pump, args=(proc, f"[node {i}] " if len(procs) > 1 else ""),
                                    daemon=True) for i, proc in enumerate(procs)]
        for reader in readers:
            reader.start()
        timed_out = stalled = False
        first_failure: Optional[float] = None
        try:
            while any(proc.poll() is None for proc in procs):
                now = time.monotonic()
                if now - started > timeout_s:
                    timed_out = True
                elif time.time() - max(latest_progress(run_dir), started_wall) > watchdog_s:
                    stalled = True
                if first_failure is None and any(proc.poll() not in (None, 0) for proc in procs):
                    first_failure = now
                lagging = first_failure is not None and now - first_failure > LAGGING_AGENT_S
                if timed_out or stalled or lagging:
                    stop_run(procs, run_dir, write, kill_grace_s)
                    break
                time.sleep(poll_s)
        except KeyboardInterrupt:
            stop_run(procs, run_dir, write, kill_grace_s)
            raise
        reap_leftover_ranks(run_dir, write, kill_grace_s)
        for reader in readers:
            reader.join(timeout=KILL_GRACE_S)
    return ProcessOutcome([proc.returncode for proc in procs], timed_out, stalled, time.monotonic() - started, tail)


def stop_run(procs: List[subprocess.Popen], run_dir: Path, write: Callable[[str], None],
             grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the agents and the ranks together, SIGKILL what is left after the grace, then verify."""
    survivors = end_run(procs, run_dir, grace_s)
    if survivors:
        write(f"[membench] could not end process(es) {survivors} of this run\n")


def reap_leftover_ranks(run_dir: Path, write: Callable[[str], None], grace_s: float = KILL_GRACE_S) -> None:
    """Every agent has exited: a rank still running has outlived torchrun (its agent was killed before it
    could end it). End it, and say so."""
    leftovers = wait_for_no_ranks(run_dir, LEFTOVER_WAIT_S)
    if leftovers:
        survivors = end_processes([], leftovers, grace_s)
        write(f"[membench] rank process(es) {sorted(p.pid for p in leftovers)} outlived torchrun: ended"
              + (f"; could not end {survivors}" if survivors else "") + "\n")


# torchrun's failure summary: "rank      : 1 (local_rank: 1)" followed by "exitcode  : -9 (pid: 123)"
_FAILURE_RANK = re.compile(r"^\s*(?:\[node \d+\] )?\s*rank\s*:\s*(\d+)")
_FAILURE_EXIT = re.compile(r"^\s*(?:\[node \d+\] )?\s*exitcode\s*:\s*(-?\d+)")
# a forked rank's own line (bench.run.forked_rank.EXIT_LINE): torchrun names one failure per attempt there
_FORKED_EXIT = re.compile(r"^(?:\[node \d+\] )?\[membench\] rank (\d+) exitcode (-?\d+) ")


def rank_exit_codes(log_lines: List[str]) -> Dict[int, int]:
    """Exit codes per global rank: torchrun's failure summary's, overridden by a forked rank's own line."""
    codes, rank = {}, None
    for line in log_lines:
        match = _FORKED_EXIT.match(line)
        if match:
            codes[int(match.group(1))] = int(match.group(2))
            continue
        match = _FAILURE_RANK.match(line)
        if match:
            rank = int(match.group(1))
            continue
        match = _FAILURE_EXIT.match(line)
        if match and rank is not None:
            codes.setdefault(rank, int(match.group(1)))
            rank = None
    return codes


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def collect_ranks(run_dir: Path, launch: LaunchSpec, log_path: Path) -> Tuple[List[RankResult], List[str]]:
    """Every rank's result; a rank that wrote none (killed by a signal, crashed hard) gets a `failed`
    entry with what torchrun said about it."""
    ranks, problems = [], []
    exit_codes: Optional[Dict[int, int]] = None
    for rank in launch.measured_ranks:
        path = rank_file(run_dir, rank)
        if path.exists():
            try:
                ranks.append(load_rank_result(path))
                continue
            except ResultsError as err:
                problems.append(str(err))
        if exit_codes is None:
            exit_codes = rank_exit_codes(log_path.read_text(errors="replace").splitlines()) if log_path.exists() else {}
        how = describe_exit(exit_codes[rank]) if rank in exit_codes else "ended without writing a result"
        problems.append(f"rank {rank} {how}")
        ranks.append(RankResult(rank=rank, status="failed", device=launch.device_type,
                                capacity_bytes=launch.capacity_bytes, recorder="none",
                                error=f"rank {rank} {how}; no result written"))
    return ranks, problems


def run_status(outcome: ProcessOutcome, ranks: List[RankResult], expected_ranks: int) -> Status:
    if any(r.status == Status.OOM for r in ranks):
        return Status.OOM
    if outcome.timed_out or outcome.stalled:
        return Status.TIMEOUT
    if outcome.returncode == 0 and len(ranks) == expected_ranks and all(r.status == Status.OK for r in ranks):
        return Status.OK
    return Status.FAILED


def failure_reason(status: str, outcome: ProcessOutcome, ranks: List[RankResult], problems: List[str],
                   cfg: RunConfig) -> Optional[str]:
    if status == "ok":
        return None
    if status == "timeout":
        if outcome.stalled:
            return (f"no progress for launcher.watchdog_s={cfg.launcher.watchdog_s} s; ended the torchrun agents "
                    f"and every rank")
        return f"no result within timeout_s={cfg.timeout_s} s; ended the torchrun agents and every rank"
    if status == "oom":
        first = next(r for r in ranks if r.status == "oom")
        oom = first.oom or {}
        return f"rank {first.rank} out of memory at step {oom.get('step')} ({oom.get('phase')}): {oom.get('message')}"
    # a rank that died without a result is the root cause; the others were terminated after it
    for rank in ranks:
        if rank.error and rank.recorder == "none":
            return rank.error
    for rank in ranks:
        if rank.error and "terminated by signal" not in rank.error:
            return f"rank {rank.rank}: {rank.error}"
    for rank in ranks:
        if rank.error:
            return f"rank {rank.rank}: {rank.error}"
    errors = [line for line in outcome.log_tail if "Error" in line or "error" in line]
    detail = errors[-1].strip() if errors else (problems[0] if problems else "see launcher.log")
    return f"torchrun exited with {outcome.returncode}: {detail}"[:500]


def launch_run(cfg: RunConfig, launch: LaunchSpec, run_dir: Path, run_id: str, *,
               sweep_id: Optional[str] = None, echo: bool = True) -> RunSummary:
    run_dir.mkdir(parents=True, exist_ok=True)
    estimate = try_predict_run(cfg, launch)
    launch = with_rank(cfg, launch, estimate)  # ConfigError: refused before anything starts
    check_rank_fits_host(launch, estimate)
    cfg = with_rank_config(cfg, launch)
    write_run_config(run_dir, cfg, launch)
    started_at = now_iso()
    log_path = run_dir / "launcher.log"
    try:
        commands = torchrun_commands(launch, run_dir, run_id, cfg.launcher.fork_ranks)
        # a run longer than a few seconds: where every rank is (rank 0 alone prints its steps); made once the
        # emulated rank is known, which is the one rank watched
        with StepWatcher(run_dir, run_id, launch.world_size, cfg.workload.warmup_steps + cfg.workload.steps,
                         launch.local_processes, enabled=echo and cfg.record.timeline, ranks=launch.measured_ranks,
                         start_on_enter=False) as watcher:
            outcome = run_agents(commands, worker_env(launch, cfg), log_path, run_dir, cfg.timeout_s,
                                 watchdog_s=cfg.launcher.watchdog_s, echo=echo, fork_agent=cfg.launcher.fork_agent,
                                 on_started=watcher.start)
    except KeyboardInterrupt:
        write_interrupted(cfg, launch, run_dir, run_id, started_at, sweep_id)
        raise
    if launch.local_node_ranks[0] != 0:
        # another node's agent: node 0 collects every rank's result and writes the summary
        return summary_for(cfg, run_id=run_id, status=Status.OK if outcome.returncode == 0 else Status.FAILED,
                           world_size=launch.world_size, device_type=launch.device_type, started_at=started_at,
                           wall_s=round(outcome.wall_s, 3))
    ranks, problems = collect_ranks(run_dir, launch, log_path)
    status = run_status(outcome, ranks, len(launch.measured_ranks))
    summary = summary_for(
        cfg, run_id=run_id, status=status, world_size=launch.world_size, device_type=launch.device_type,
        device_name=device_name(launch, cfg), started_at=started_at, wall_s=round(outcome.wall_s, 3),
        error=failure_reason(status, outcome, ranks, problems, cfg), sweep_id=sweep_id,
        **cuda_environment(launch, cfg),
        oom_ranks=sorted(r.rank for r in ranks if r.status == "oom"),
        per_rank=sorted(ranks, key=lambda r: r.rank),
        job=job_stats(ranks, cfg.workload.batch_size, cfg.workload.warmup_steps),
        sharding_plan=read_plan(run_dir),
        estimate=score(estimate, ranks), emulated=emulation_record(cfg, launch))
    write_summary(run_dir, summary)
    return summary


def write_interrupted(cfg: RunConfig, launch: LaunchSpec, run_dir: Path, run_id: str, started_at: str,
                      sweep_id: Optional[str]) -> None:
    """Ctrl-C: the run is recorded as failed (with whatever the ranks wrote) before the interrupt goes on."""
    ranks = []
    for rank in launch.measured_ranks:
        try:
            ranks.append(load_rank_result(rank_file(run_dir, rank)))
        except ResultsError:
            continue
    write_summary(run_dir, summary_for(
        cfg, run_id=run_id, status=Status.FAILED, world_size=launch.world_size, device_type=launch.device_type,
        device_name=device_name(launch, cfg), started_at=started_at, sweep_id=sweep_id, per_rank=ranks,
        error="interrupted (Ctrl-C); the torchrun agents and every rank were ended"))


def cuda_environment(launch: LaunchSpec, cfg: RunConfig) -> dict:
    """What a CUDA run ran with, for its summary: the allocator configuration (real or modelled) and, on a
    real GPU, the CUDA / NCCL / driver versions."""
    if not has_cuda_allocator(launch.device_type):
        return {}
    from bench.accounting.allocator_config import allocator_config
    from bench.run.memory.cuda_env import cuda_versions

    versions = cuda_versions() if launch.device_type == DEVICE_CUDA else {}
    return {"allocator": allocator_config(settings=cfg.allocator), "extra_versions": versions}


def read_plan(run_dir: Path) -> list:
    import json

    path = run_dir / "sharding_plan.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def device_name(launch: LaunchSpec, cfg: RunConfig) -> str:
    import platform

    cpu = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    if launch.device_type == DEVICE_CUDA_SIMULATED:
        return f"{cfg.hardware.name} simulated on {cpu}"
    if launch.device_type == DEVICE_CUDA:
        from bench.run.memory.nvml import cuda_device_name

        return cuda_device_name(0) or cfg.hardware.name  # through NVML: no CUDA context in the launcher
    return cpu
