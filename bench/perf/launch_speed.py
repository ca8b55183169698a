"""What does forking the ranks from their agent (launcher.fork_ranks, bench.run.agent) save a run?

Run as ``python -m bench.perf.launch_speed [--repeats N] [ARGS...]``: `membench run ARGS` (default: the tiny
torchrec workload and the native one, on CPU, 2 ranks) with `launcher.fork_ranks=true` and `=false`
alternately, N times each, and prints per setting the median wall time of the whole command and the median
CPU time of everything it started (the `membench` process, the agent, the ranks: the children's rusage),
with the ratio false / true. The memory numbers are the same either way (tests/test_e2e.py).
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
             "native tiny": ["hardware=cpu", "workload=tiny", "model=native"]}


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


def measure(args: Sequence[str], repeats: int, results_dir: Path) -> Dict[bool, List[Tuple[float, float]]]:
    times: Dict[bool, List[Tuple[float, float]]] = {True: [], False: []}
    for _ in range(repeats):
        for fork in (True, False):  # alternated, so that a change in the machine's load hits both alike
            times[fork].append(timed_run([*args, f"launcher.fork_ranks={str(fork).lower()}"], results_dir))
    return times


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("args", nargs="*", help="membench run overrides (default: tiny torchrec and native, CPU)")
    opts = parser.parse_args(argv)
    workloads = {" ".join(opts.args): opts.args} if opts.args else WORKLOADS
    rows = []
    with tempfile.TemporaryDirectory(prefix="membench-launch-speed-") as results_dir:
        for name, args in workloads.items():
            times = measure(args, opts.repeats, Path(results_dir))
            wall = {fork: statistics.median(t[0] for t in times[fork]) for fork in times}
            cpu = {fork: statistics.median(t[1] for t in times[fork]) for fork in times}
            rows.append([name, f"{wall[True]:.2f}", f"{wall[False]:.2f}", f"{wall[False] / wall[True]:.2f}x",
                         f"{cpu[True]:.2f}", f"{cpu[False]:.2f}", f"{cpu[False] / cpu[True]:.2f}x"])
    print_table(f"membench run, ranks forked vs fresh interpreters (median of {opts.repeats})",
                ["workload", "wall s forked", "wall s fresh", "wall ratio", "CPU s forked", "CPU s fresh",
                 "CPU ratio"], rows, left={"workload"})


if __name__ == "__main__":
    main()
