"""No rank outlives its run: the launcher ends ranks itself instead of trusting torchrun's agent to.

A fake agent starts two fake ranks the way torchrun does (each in a session of its own, command line
`... bench.run.worker --run-dir <dir>`, pid in `.progress_rank<R>`) and then loses the race of issue 12: it
dies on SIGTERM without ending its ranks, or exits on its own and leaves them running. The ranks ignore
SIGTERM, as a rank blocked inside a collective does. No torch is imported: these run in a second.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from bench.run.launch import run_agents
from bench.run.reaper import WORKER_MODULE, rank_processes

FAKE_RANK = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # stuck in a collective: only SIGKILL ends it
    run_dir, rank = sys.argv[4], sys.argv[5]
    with open(os.path.join(run_dir, f".progress_rank{rank}"), "w") as handle:
        handle.write(f"{os.getpid()}\\n")
    time.sleep(600)
""")
FAKE_AGENT = textwrap.dedent("""
    import subprocess, sys, time
    run_dir, mode = sys.argv[1], sys.argv[2]
    ranks = [subprocess.Popen([sys.executable, "-c", sys.argv[3], "-m", sys.argv[4], "--run-dir", run_dir,
                               str(rank)], start_new_session=True) for rank in (0, 1)]
    print("agent started ranks", [r.pid for r in ranks], flush=True)
    while not all(__import__("os").path.exists(f"{run_dir}/.progress_rank{r}") for r in (0, 1)):
        time.sleep(0.05)
    if mode == "exit":
        sys.exit(0)  # the agent is gone, its ranks are not
    time.sleep(600)  # default SIGTERM handling: dies at once, without ending its ranks
""")


def fake_agent(run_dir: Path, mode: str):
    return [sys.executable, "-c", FAKE_AGENT, str(run_dir), mode, FAKE_RANK, WORKER_MODULE]


def rank_pids(run_dir: Path):
    return [int(p.read_text()) for p in sorted(run_dir.glob(".progress_rank*"))]


def still_running(pids):
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def test_stalled_run_whose_agent_dies_first_leaves_no_rank(tmp_path):
    started = time.monotonic()
    outcome = run_agents([fake_agent(tmp_path, "hang")], {}, tmp_path / "launcher.log", tmp_path, timeout_s=60,
                         watchdog_s=1.5, echo=False, kill_grace_s=0.5)
    assert outcome.stalled and not outcome.timed_out
    pids = rank_pids(tmp_path)
    assert len(pids) == 2
    assert still_running(pids) == [] and rank_processes(tmp_path) == []
    assert time.monotonic() - started < 30
    assert "could not end" not in (tmp_path / "launcher.log").read_text()


def test_wall_clock_timeout_leaves_no_rank(tmp_path):
    outcome = run_agents([fake_agent(tmp_path, "hang")], {}, tmp_path / "launcher.log", tmp_path, timeout_s=2,
                         watchdog_s=60, echo=False, kill_grace_s=0.5)
    assert outcome.timed_out
    assert still_running(rank_pids(tmp_path)) == []


def test_ranks_that_outlive_their_agent_are_ended_and_named(tmp_path):
    outcome = run_agents([fake_agent(tmp_path, "exit")], {}, tmp_path / "launcher.log", tmp_path, timeout_s=60,
                         watchdog_s=60, echo=False, kill_grace_s=0.5)
    assert outcome.returncode == 0
    pids = rank_pids(tmp_path)
    assert still_running(pids) == []
    log = (tmp_path / "launcher.log").read_text()
    assert f"rank process(es) {sorted(pids)} outlived torchrun: ended" in log


def test_rank_processes_ignores_other_runs_and_dead_pid_files(tmp_path):
    mine, other = tmp_path / "mine", tmp_path / "other"
    mine.mkdir()
    other.mkdir()
    (mine / ".progress_rank0").write_text("999999999\n")  # a pid that does not exist
    proc = subprocess.Popen([sys.executable, "-c", FAKE_RANK, "-m", WORKER_MODULE, "--run-dir", str(other), "0"],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (other / ".progress_rank0").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert rank_processes(mine) == []
        assert [p.pid for p in rank_processes(other)] == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
