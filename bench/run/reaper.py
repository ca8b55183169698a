"""Find and end every rank process of a run, so that no rank outlives it.

torchrun starts each fresh-interpreter rank (CUDA, launcher.fork_ranks=false) in its own session
(`start_new_session=True`), so signalling the agent's process group does not reach it, and a rank whose
agent was killed first keeps running (on a GPU: keeping its CUDA context and memory, falsifying every later
run). A rank is recognized by its command line, which names the worker and the run directory: a fresh one's
is `-m bench.run.worker --run-dir <run_dir>`, a forked one's (bench.run.agent --fork-ranks) is its agent's,
which ends the same way (the process title of an agent forked from membench, bench.run.forked_agent); its
pid is also in its progress file `.progress_rank<R>`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterable, List

import psutil

WORKER_MODULE = "bench.run.worker"  # what torchrun starts per rank: `python -m bench.run.worker`
KILL_GRACE_S = 5.0  # SIGTERM -> SIGKILL: lets a rank write its partial results
GONE_TIMEOUT_S = 10.0  # after SIGKILL, how long to wait for the kernel to reap before reporting survivors
POLL_S = 0.05


RANK_COMMAND_TAIL = f" -m {WORKER_MODULE} --run-dir "  # how a rank's command line ends, before its run dir


def _is_rank_of(cmdline: List[str], run_dir: Path) -> bool:
    if WORKER_MODULE in cmdline and "--run-dir" in cmdline:
        index = cmdline.index("--run-dir")
        if index + 1 < len(cmdline) and Path(cmdline[index + 1]).resolve() == run_dir:
            return True
    # a forked agent's command line is its process title (bench.run.forked_agent), which psutil splits at
    # every space, a run directory's own included: read as one string, the run directory last
    joined = " ".join(cmdline).rstrip()
    return RANK_COMMAND_TAIL in joined and Path(joined.rsplit(RANK_COMMAND_TAIL, 1)[1]).resolve() == run_dir


def rank_processes(run_dir: Path) -> List[psutil.Process]:
    """Live rank processes of the run in `run_dir` on this machine (pid files first, then the process table,
    which also finds a rank killed before it wrote its pid)."""
    run_dir = Path(run_dir).resolve()
    found = {}
    candidates: List[psutil.Process] = []
    for path in run_dir.glob(".progress_rank*"):
        try:
            candidates.append(psutil.Process(int(path.read_text().split()[0])))
        except (ValueError, IndexError, OSError, psutil.Error):
            continue
    candidates.extend(psutil.process_iter())
    for proc in candidates:
        try:
            if proc.pid not in found and _running(proc) and _is_rank_of(proc.cmdline(), run_dir):
                found[proc.pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def signal_process_tree(pid: int, sig: int) -> None:
    """Signal a process's own process group when it leads one (a torchrun agent or rank), else the process."""
    try:
        pgid = os.getpgid(pid)
        if pgid == pid and pgid != os.getpgrp():
            os.killpg(pgid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a dead rank waiting for its agent to collect it counts as gone)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(agents: List[subprocess.Popen], ranks: List[psutil.Process], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # poll() also collects an exited agent, so its exit code is kept for the run's status
        if all(agent.poll() is not None for agent in agents) and not any(_running(r) for r in ranks):
            return
        time.sleep(POLL_S)


def end_processes(agents: Iterable[subprocess.Popen], ranks: Iterable[psutil.Process],
                  grace_s: float = KILL_GRACE_S) -> List[int]:
    """SIGTERM the agents' process groups and the ranks' sessions together, wait up to `grace_s`, SIGKILL
    what is left, wait until it is gone; returns the pids still running (none, unless the kernel could not
    reap them within GONE_TIMEOUT_S)."""
    agents, ranks = list(agents), list(ranks)
    for sig, timeout_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, GONE_TIMEOUT_S)):
        targets = [a.pid for a in agents if a.poll() is None] + [r.pid for r in ranks if _running(r)]
        if not targets:
            break
        for pid in targets:
            signal_process_tree(pid, sig)
        _wait_gone(agents, ranks, timeout_s)
    return sorted([a.pid for a in agents if a.poll() is None] + [r.pid for r in ranks if _running(r)])


def end_run(agents: Iterable[subprocess.Popen], run_dir: Path, grace_s: float = KILL_GRACE_S) -> List[int]:
    """End the run's torchrun agents and every rank of it at once (an agent would otherwise race the
    launcher to end its ranks, and lose when the launcher kills it first); returns the pids still running
    afterwards (should be none)."""
    survivors = end_processes(agents, rank_processes(run_dir), grace_s)
    # a rank that was still starting may only now show up in the process table
    survivors += end_processes([], rank_processes(run_dir), grace_s)
    return sorted(set(survivors))


def wait_for_no_ranks(run_dir: Path, timeout_s: float) -> List[psutil.Process]:
    """Ranks still running after `timeout_s` (a normal exit leaves a moment for the ranks to finish)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ranks = rank_processes(run_dir)
        if not ranks or time.monotonic() >= deadline:
            return ranks
        time.sleep(POLL_S)
