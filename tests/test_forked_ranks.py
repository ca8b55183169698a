"""Ranks forked from their torchrun agent (bench.run.agent --fork-ranks, bench.run.forked_rank): CPU and
simulated-GPU runs fork, CUDA runs and launcher.fork_ranks=false start a fresh interpreter per rank; a
forked rank that fails says how it ended, so the launcher names the rank and the signal as torchrun's own
summary would. (That forked and fresh ranks account the same bytes: tests/test_e2e.py, and the regression
entries, whose baselines were recorded from fresh interpreters, at rtol 0.)"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO_ROOT


def _launch(device: str):
    from bench.run.config import RunConfig
    from bench.run.launchspec import resolve_launch

    cfg = RunConfig()
    if device == "cuda":
        cfg.hardware.name, cfg.hardware.device, cfg.hardware.ranks_per_node, cfg.hardware.capacity_gib = (
            "h100_80g", "cuda", 2, 80.0)
        return resolve_launch(cfg, 2, 80 << 30)
    return resolve_launch(cfg, 0)


@pytest.mark.parametrize("device, fork_ranks, forks", [("cpu", True, True), ("cpu", False, False),
                                                       ("cuda", True, False)])
def test_the_agent_forks_ranks_off_cuda_unless_told_not_to(device, fork_ranks, forks):
    from bench.run.agent import FORK_RANKS_FLAG
    from bench.run.launch import AGENT_MODULE, torchrun_commands

    (command,) = torchrun_commands(_launch(device), Path("/tmp/run"), "id", fork_ranks)
    assert command[1:3] == ["-m", AGENT_MODULE]
    assert (FORK_RANKS_FLAG in command) == forks
    assert command[-4:] == ["-m", "bench.run.worker", "--run-dir", "/tmp/run"]  # what the reaper matches


def test_the_forking_agent_refuses_any_other_program_in_one_line():
    from bench.run.agent import main

    with pytest.raises(SystemExit, match=r"forks only `-m bench.run.worker`, not 'train.py'"):
        main(["--standalone", "--nproc-per-node=1", "train.py"])


def test_a_forked_ranks_own_exit_line_names_it_where_torchrun_names_another():
    from bench.run.forked_rank import EXIT_LINE
    from bench.run.launch import rank_exit_codes

    log = ["[node 1] " + EXIT_LINE.format(rank=3, code=-9, pid=12),
           EXIT_LINE.format(rank=0, code=1, pid=11),
           "  rank      : 0 (local_rank: 0)", "  exitcode  : 1 (pid: 11)"]
    assert rank_exit_codes(log) == {3: -9, 0: 1}


# Each case forks a supervised rank (forked_rank) whose worker.main is replaced: it ends as the case says.
SUPERVISOR = textwrap.dedent("""
    import os, signal, sys, time
    from bench.run import worker
    from bench.run.forked_rank import forked_rank

    def case(name, main):
        pid = os.fork()
        if pid == 0:
            worker.main = main
            os.environ["RANK"] = "3"
            code = forked_rank("--run-dir", "unused")
            os._exit(100 + code)  # returned: the rank succeeded
        if name == "forwards SIGTERM":
            time.sleep(1.0)
            os.kill(pid, signal.SIGTERM)  # to the supervisor, as torchrun's agent ends its workers
        _, status = os.waitpid(pid, 0)
        print(name, "->", os.waitstatus_to_exitcode(status), flush=True)

    def ok(argv):
        os._exit(0)
    def killed(argv):
        os.kill(os.getpid(), signal.SIGKILL)
    def raises(argv):
        raise RuntimeError("boom")
    def oom(argv):
        os._exit(3)
    def waits(argv):
        time.sleep(30)

    for name, main in [("ok", ok), ("killed", killed), ("raises", raises), ("oom", oom),
                       ("forwards SIGTERM", waits)]:
        case(name, main)
""")


def test_the_supervisor_ends_as_its_rank_ended_and_says_how():
    proc = subprocess.run([sys.executable, "-c", SUPERVISOR], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stderr
    results = dict(line.split(" -> ") for line in proc.stdout.splitlines() if " -> " in line)
    assert results == {"ok": "100", "killed": str(-signal.SIGKILL), "raises": "1", "oom": "3",
                       "forwards SIGTERM": str(-signal.SIGTERM)}
    exit_lines = [line.split(" (pid")[0] for line in proc.stdout.splitlines() if line.startswith("[membench]")]
    assert exit_lines == ["[membench] rank 3 exitcode -9", "[membench] rank 3 exitcode 1",
                          "[membench] rank 3 exitcode 3", "[membench] rank 3 exitcode -15"]
    assert "RuntimeError: boom" in proc.stderr
