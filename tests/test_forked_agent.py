"""A torchrun agent forked from the launching process (bench.run.forked_agent) is what `subprocess.Popen` of its
command would start: its own session, the run's environment, stdin from /dev/null, stdout and stderr in one
pipe (logging's handlers made before the fork included), a fresh interpreter's signal handlers, the command
line as its title (which bench.run.reaper matches, a run directory with spaces in it too), and the exit
status an interpreter gives. Here the agent's main is replaced by what each case needs; that forked agents
run the real one to the same bytes as fresh ones: tests/test_e2e.py and every regression entry at rtol 0."""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import psutil
import pytest

from bench.run.config import RunConfig
from bench.run.launchspec import resolve_launch, write_run_config


def _command(run_dir):
    from bench.run.agent import FORK_RANKS_FLAG

    return [sys.executable, "-m", "bench.run.agent", FORK_RANKS_FLAG, "--nproc-per-node=1", "--standalone",
            "-m", "bench.run.worker", "--run-dir", str(run_dir)]


@pytest.fixture()
def run_dir(tmp_path):
    run_dir = tmp_path / "a run dir"  # spaces: the title is split at each by psutil
    cfg = RunConfig()
    write_run_config(run_dir, cfg, resolve_launch(cfg, 0))
    return run_dir


def _fork(run_dir, agent_main, env=None):
    from bench.run.forked_agent import start_forked_agent

    agent = start_forked_agent(_command(run_dir), env or {"MEMBENCH_CASE": "1", "PATH": os.environ["PATH"]},
                               agent_main)
    output = agent.stdout.read()
    return agent.wait(timeout=60), output


def test_the_forked_agent_is_the_process_its_command_would_start(run_dir):
    before_fork = logging.getLogger("membench.test.before_fork")
    before_fork.addHandler(logging.StreamHandler(sys.stderr))  # bound to this process's (captured) stderr

    root, launcher_handler = logging.getLogger(), logging.StreamHandler(sys.stderr)
    root.addHandler(launcher_handler)  # the launcher's root logger at INFO, as Hydra configures it

    def agent_main(args):
        before_fork.warning("logged through a handler made before the fork")
        logging.getLogger("some.library").info("an INFO line of a library")
        print(json.dumps({
            "root": [len(logging.getLogger().handlers), logging.getLogger().level],
            "args": args, "argv": sys.argv[1:], "leads_session": os.getsid(0) == os.getpid() == os.getpgrp(),
            "env": dict(os.environ), "stdin_is_null": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
            "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            "sigterm": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
            "title": " ".join(psutil.Process().cmdline())}))

    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a launcher's own handler is not inherited
    level = root.level
    root.setLevel(logging.INFO)
    try:
        code, output = _fork(run_dir, agent_main)
    finally:
        signal.signal(signal.SIGTERM, previous)
        root.setLevel(level)
        root.removeHandler(launcher_handler)
    state = json.loads(next(line for line in output.splitlines() if line.startswith("{")))
    command = _command(run_dir)
    assert code == 0
    assert state["args"] == command[4:] and state["argv"] == command[3:]
    assert state["leads_session"] and state["stdin_is_null"] and state["sigint"] and state["sigterm"]
    assert state["env"] == {"MEMBENCH_CASE": "1", "PATH": os.environ["PATH"]}
    assert state["title"] == " ".join(command)
    assert "logged through a handler made before the fork" in output
    assert state["root"] == [0, logging.WARNING] and "an INFO line of a library" not in output


def _exits(code):
    def agent_main(args):
        raise SystemExit(code)
    return agent_main


def _raises(args):
    raise RuntimeError("boom in the agent")


def _interrupted(args):
    raise KeyboardInterrupt


def _killed(args):
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("agent_main, status, says", [
    (_exits(None), 0, ""), (_exits(3), 3, ""), (_exits("one line"), 1, "one line"),
    (_raises, 1, "RuntimeError: boom in the agent"), (_interrupted, -signal.SIGINT, ""),
    (_killed, -signal.SIGKILL, "")])
def test_the_forked_agent_ends_with_the_status_an_interpreter_gives(run_dir, agent_main, status, says):
    code, output = _fork(run_dir, agent_main)
    assert code == status and says in output, output


def test_the_reaper_finds_a_rank_by_its_forked_agent_s_title(run_dir):
    from bench.run.forked_agent import start_forked_agent
    from bench.run.reaper import end_run, rank_processes

    def waits(args):
        print("waiting", flush=True)
        time.sleep(60)

    agent = start_forked_agent(_command(run_dir), {"PATH": os.environ["PATH"]}, waits)
    assert agent.stdout.readline() == "waiting\n"
    assert [proc.pid for proc in rank_processes(run_dir)] == [agent.pid]
    assert rank_processes(run_dir.parent) == []  # another directory's name is a prefix of its: not a rank
    assert end_run([agent], run_dir, grace_s=2) == []
    assert agent.returncode == -signal.SIGTERM and rank_processes(run_dir) == []


def test_a_rank_forked_after_this_process_ran_parallel_ops_runs_its_own(run_dir):
    """GNU OpenMP's pool does not survive a fork: without ending it first, the child's first parallel op
    waits forever for its parent's threads."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.ones(1 << 22).add_(1)  # a parallel region: this process now has a pool

        def parallel_op(args):
            torch.set_num_threads(2)
            print("sum", int(torch.ones(1 << 22).add_(1).sum()), flush=True)

        from bench.run.forked_agent import start_forked_agent

        agent = start_forked_agent(_command(run_dir), {"PATH": os.environ["PATH"], "OMP_NUM_THREADS": "2"},
                                   parallel_op)
        try:
            assert agent.wait(timeout=30) == 0
        finally:
            if agent.poll() is None:
                os.kill(agent.pid, signal.SIGKILL)
                agent.wait(timeout=10)
        assert f"sum {2 << 22}" in agent.stdout.read()
        torch.ones(1 << 22).add_(1)  # and this process makes itself a new pool
    finally:
        torch.set_num_threads(threads)


def test_a_run_forks_its_agent_before_it_starts_any_thread_of_its_own(tmp_path, monkeypatch):
    """A thread running at the fork may hold a lock (stdout's, a file's) that the forked agent then never sees
    released; the step watcher (a run that echoes) is the launcher's one thread, and it starts after the fork."""
    import threading

    from bench.run import launch
    from bench.run.execute import compose_run_config, execute_run
    from bench.run.step_progress import WATCHER_THREAD

    threads_at_fork = []
    real_fork = launch.start_forked_agent

    def recording_fork(command, env):
        threads_at_fork.append(sorted(thread.name for thread in threading.enumerate()))
        return real_fork(command, env)

    monkeypatch.setattr(launch, "start_forked_agent", recording_fork)
    cfg = compose_run_config(["workload=tiny", "model=native", "workload.steps=1", "workload.warmup_steps=0", "hardware.ranks_per_node=1"])
    summary = execute_run(cfg, tmp_path / "run", "run", sweep_id=None, echo=True)
    assert summary.status == "ok" and len(threads_at_fork) == 1
    assert WATCHER_THREAD not in threads_at_fork[0], threads_at_fork
