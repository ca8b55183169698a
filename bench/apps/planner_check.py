"""`membench planner-check`: torchrec's planner with its own memory model and with membench's, on random
workloads at a tight capacity, every plan run for real.

    membench planner-check                       # 30 random CPU workloads + 3 at an emulated world size of 64
    membench planner-check --count 10 --emulated 0 --seed 1
    membench planner-check --measured            # and torchrec's model with a measured reservation

For each workload the capacity per rank is drawn around what the workload needs (bench/harness/
planner_comparison.py says how); each memory model plans at it (torchrec's EmbeddingShardingPlanner, its
perf model unchanged) and each plan it does not refuse runs with `membench run` (CPU ranks, where an
allocation past the capacity is a real OOM; with --emulated, the rank predicted highest of an N-rank job,
emulated in one process). Prints, per memory model, the plans that OOM, the plans refused although the other
model's plan ran at that capacity, and the capacity left unused at the highest rank; writes every workload
and the table to <results dir>/planners-<time>/planner_comparison.json (`membench report` on that directory
draws it). With --measured, a third arm: torchrec's own model with the storage reservation `membench
reservation` writes from a run of the workload at its own capacity (docs/torchrec-planner.md, "Measured
terms"). About 15 s per workload on 2 cores (25 s with --measured).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import List, Optional

from rich.table import Table

from bench.apps.console import make_console
from bench.results.store import atomic_write_json

PROG = "membench planner-check"


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=30, help="random CPU workloads (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="the seed the workloads and capacities are drawn from")
    parser.add_argument("--emulated", type=int, default=3, metavar="N",
                        help="of those workloads, the first N again at --world-size ranks, emulated (default 3)")
    parser.add_argument("--world-size", type=int, default=64, help="the emulated world size (default 64)")
    parser.add_argument("--measured", action="store_true",
                        help="also plan with torchrec's model and a reservation measured at the workload's own "
                             "capacity")
    parser.add_argument("--results-dir", type=Path, default=Path("results/runs"))
    return parser


def check_args(args) -> Optional[str]:
    if args.count < 1:
        return f"--count {args.count}: give the number of workloads, >= 1"
    if not 0 <= args.emulated <= args.count:
        return f"--emulated {args.emulated}: give 0 to --count ({args.count}) workloads"
    if args.world_size < 2:
        return f"--world-size {args.world_size}: an emulated job has at least 2 ranks"
    return None


def print_table(summary: dict, console) -> None:
    for label, per_model in summary.items():
        table = Table(title=f"torchrec's planner, {label} ranks: memory model vs what ran", title_justify="left")
        for column in ("memory model", "workloads", "ran ok", "OOM", "failed", "refused", "refused, a plan fits",
                       "unused at highest rank (median)", "(mean)"):
            table.add_column(column, justify="left" if column == "memory model" else "right")
        for model, row in per_model.items():
            table.add_row(model, *(str(row[k]) for k in ("workloads", "ok", "oom", "failed", "refused",
                                                    "refused_although_fits")),
                          *("-" if row[k] is None else f"{100 * row[k]:.1f} %" for k in ("unused_median", "unused_mean")))
        console.print(table)


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    problem = check_args(args)
    if problem:
        print(f"{PROG}: {problem}", file=sys.stderr)
        return 2
    from bench.harness.planner_comparison import RESULT_FILE, compare_workload, to_json
    from bench.harness.random_workloads import random_workloads

    out_dir = args.results_dir / f"planners-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    workloads = random_workloads(args.count, args.seed, backends=("torchrec",))
    jobs = [(i, o, None) for i, o in enumerate(workloads, 1)]
    jobs += [(i, o, args.world_size) for i, o in enumerate(workloads[:args.emulated], 1)]
    comparisons = []
    for number, (index, overrides, world_size) in enumerate(jobs, 1):
        at = f" at {world_size} emulated ranks" if world_size else ""
        print(f"[planner-check] {number}/{len(jobs)}: workload {index}{at}: {' '.join(overrides[2:])}", flush=True)
        comparison = compare_workload(index, overrides, args.seed, out_dir, world_size, args.measured)
        comparisons.append(comparison)
        print("[planner-check]   " + ", ".join(f"{m}: {o.verdict}" for m, o in comparison.outcomes.items())
              + f" ({comparison.wall_s:.0f} s)", flush=True)
        atomic_write_json(out_dir / RESULT_FILE, to_json(args.seed, comparisons))  # a kill keeps what ran
    console = make_console()
    print_table(to_json(args.seed, comparisons)["summary"], console)
    console.print(f"wrote {out_dir / RESULT_FILE}")
    return 0
