"""What does forking save a run: the ranks from their agent (launcher.fork_ranks, bench.run.agent), and the
agent from membench (launcher.fork_agent, bench.run.forked_agent)?

Run as ``python -m bench.perf.launch_speed [--repeats N] [ARGS...]``: `membench run ARGS` (default: the tiny
torchrec workload and the native one, on CPU, 2 ranks, and a 4-point sweep of tiny) under each setting of
SETTINGS in turn, N times each, and prints per setting the median wall time of the whole command and the
median CPU time of everything it started (the `membench` process, the agent, the ranks: the children's
rusage), with the ratios of fresh interpreters (the first setting) to it. The memory numbers are the same
under every setting (tests/test_e2e.py).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from bench.perf.table import print_table

WORKLOADS = {"torchrec tiny": ["hardware=cpu", "workload=tiny"],
             "native tiny": ["hardware=cpu", "workload=tiny", "model=native"],
             "tiny, 4-point sweep": ["-m", "hardware=cpu", "workload=tiny", "workload.seed=1,2,3,4"]}
SETTINGS = {"fresh interpreters": ["launcher.fork_ranks=false"],
            "ranks forked": ["launcher.fork_ranks=true", "launcher.fork_agent=false"],
            "agent and ranks forked": ["launcher.fork_ranks=true", "launcher.fork_agent=true"]}


def timed_run(args: Sequence[str], results_dir: Path) -> Tuple[float, float]:
    """(wall s, CPU s of the command and all it started) of one `membench run`."""
    before = os.times()
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench", "run", *args, f"results_dir={results_dir}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"launch_speed: `membench run {' '.join(args)}` exited with {proc.returncode}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def measure(args: Sequence[str], repeats: int, results_dir: Path) -> Dict[str, List[Tuple[float, float]]]:
    times: Dict[str, List[Tuple[float, float]]] = {name: [] for name in SETTINGS}
    for _ in range(repeats):
        for name, overrides in SETTINGS.items():  # in turn, so that a change in load hits every setting alike
            times[name].append(timed_run([*args, *overrides], results_dir))
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("args", nargs="*", help="membench run overrides (default: tiny torchrec and native, CPU)")
    opts = parser.parse_args(argv)
    workloads = {" ".join(opts.args): opts.args} if opts.args else WORKLOADS
    rows = []
    with tempfile.TemporaryDirectory(prefix="membench-launch-speed-") as results_dir:
        for workload, args in workloads.items():
            times = measure(args, opts.repeats, Path(results_dir))
            wall = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
            cpu = {name: statistics.median(t[1] for t in runs) for name, runs in times.items()}
            fresh = next(iter(SETTINGS))
            rows += [[workload, name, f"{wall[name]:.2f}", f"{cpu[name]:.2f}", f"{wall[fresh] / wall[name]:.2f}x",
                      f"{cpu[fresh] / cpu[name]:.2f}x"] for name in SETTINGS]
    print_table(f"membench run: what forking saves (median of {opts.repeats})",
                ["workload", "setting", "wall s", "CPU s", "wall: fresh / this", "CPU: fresh / this"], rows,
                left={"workload", "setting"})


if __name__ == "__main__":
    main()
