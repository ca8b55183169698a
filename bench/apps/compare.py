"""`membench compare RUN_A RUN_B`: the regression table for any two runs, or two sweeps point by point.

A sweep over emulate.rank (`membench run -m emulate.world_size=4 emulate.rank=0,1,2,3`) is the job it
emulates: one run whose ranks are the points'. An emulated run (or such a sweep) of some ranks of an
N-rank job against a run of all N is compared on the ranks it measured.

Run A stands where a baseline would: per rank its peak, the change in bytes and %, the breakdown category
that moved most, failing metrics (status, OOM site, peak growth, utilization drop, imbalance growth,
prediction error growth) and the library versions that differ. Exit 0 when B is within --rtol of A, 1
when it is not, 2 on bad input (a path that is not a run or a sweep, an unreadable summary).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from bench.harness.baseline import METRICS, compare_records, format_comparison, run_record
from bench.results.schema import EXIT_FAILED, EXIT_INVALID, EXIT_OK, RunSummary, job_stats
from bench.results.store import ResultsError, is_sweep_dir, load_summary, read_sweep_index

PROG = "membench compare"


class CompareInputError(ValueError):
    """An input that is not a run or a sweep: one line naming the path and the fix."""


@dataclass
class Point:
    label: str  # "" for a single run, the point's directory name in a sweep
    overrides: Tuple[str, ...]
    summary_dir: Path
    job: Optional[RunSummary] = None  # a sweep over emulate.rank, read as its job

    def summary(self) -> RunSummary:
        return self.job if self.job is not None else load_summary(self.summary_dir)


def points_of(path: Path) -> Tuple[str, List[Point]]:
    """('run', [the run]) or ('sweep', [its points in order])."""
    path = Path(path)
    if path.is_file() and path.name == "summary.json":
        path = path.parent
    if not path.exists():
        raise CompareInputError(f"{path}: no such run or sweep directory")
    if is_sweep_dir(path):
        job = emulated_job(path)
        if job is not None:
            return "run", [Point("", (), path, job)]
        index = read_sweep_index(path)
        return "sweep", [Point(str(run["dir"]), tuple(run.get("overrides") or ()), path / str(run["dir"]))
                         for run in index["runs"]]
    if (path / "summary.json").is_file():
        return "run", [Point("", (), path)]
    raise CompareInputError(f"{path}: neither a run directory (summary.json) nor a sweep directory (sweep.json); "
                            f"pass results/runs/<run id> or results/runs/sweep-<id>")


def emulated_job(sweep_dir: Path) -> Optional[RunSummary]:
    """The job a sweep over emulate.rank measured, rank by rank; None for any other sweep."""
    from bench.report.emulated_jobs import EmulatedJob, merge_emulated_ranks
    from bench.report.loading import load_runs
    from bench.report.messages import NoResults, WarningLog

    try:
        runs, _ = load_runs([sweep_dir], skip=None, log=WarningLog(prog=PROG))
    except NoResults:
        return None
    merged = merge_emulated_ranks(runs)
    return merged[0].summary if len(merged) == 1 and isinstance(merged[0], EmulatedJob) else None


def on_common_ranks(summary_a: RunSummary, summary_b: RunSummary) -> Tuple[RunSummary, RunSummary, Optional[str]]:
    """Both runs on the ranks they share when one emulated some ranks of the other's job; else unchanged."""
    ranks_a, ranks_b = ({rank.rank for rank in s.per_rank} for s in (summary_a, summary_b))
    if ranks_a == ranks_b or summary_a.world_size != summary_b.world_size:
        return summary_a, summary_b, None
    if ranks_b < ranks_a:
        emulated, ranks = summary_b, ranks_b
    elif ranks_a < ranks_b:
        emulated, ranks = summary_a, ranks_a
    else:
        return summary_a, summary_b, None
    if not emulated.emulated:
        return summary_a, summary_b, None
    note = (f"compared on rank(s) {', '.join(map(str, sorted(ranks)))} of {summary_a.world_size}: "
            f"{emulated.run_id} emulates only these")
    return only_ranks(summary_a, ranks), only_ranks(summary_b, ranks), note


def only_ranks(summary: RunSummary, ranks: set) -> RunSummary:
    """`summary` with only these ranks: their results, their imbalance, their prediction errors."""
    per_rank = [rank for rank in summary.per_rank if rank.rank in ranks]
    estimate = summary.estimate
    if isinstance(estimate, dict) and isinstance(estimate.get("error_pct"), list):
        errors = [error if index in ranks else None for index, error in enumerate(estimate["error_pct"])]
        estimate = {**estimate, "error_pct": errors}
    # batch size and warm-up only set the throughput fields, which compare does not read
    return dataclasses.replace(summary, per_rank=per_rank, job=job_stats(per_rank, 0, 0), estimate=estimate)


def pair_points(points_a: List[Point], points_b: List[Point]) -> Tuple[List[Tuple[Point, Optional[Point]]], str]:
    """Match sweep points by their overrides when both sweeps have the same ones, else by position."""
    by_overrides = {point.overrides: point for point in points_b}
    if len(by_overrides) == len(points_b) and {p.overrides for p in points_a} == set(by_overrides):
        return [(point, by_overrides[point.overrides]) for point in points_a], "overrides"
    by_label = {point.label: point for point in points_b}
    pairs = [(point, by_label.get(point.label)) for point in points_a]
    return pairs, "position"


def compare_paths(path_a: Path, path_b: Path, rtol: float, out=None) -> int:
    out = out or sys.stdout
    kind_a, points_a = points_of(path_a)
    kind_b, points_b = points_of(path_b)
    if kind_a != kind_b:
        raise CompareInputError(f"cannot compare a {kind_a} ({path_a}) with a {kind_b} ({path_b}); pass two runs or "
                                f"two sweeps")
    pairs, matched_by = pair_points(points_a, points_b) if kind_a == "sweep" else ([(points_a[0], points_b[0])], "")
    if kind_a == "sweep":
        print(f"sweep A {path_a} ({len(points_a)} points) vs sweep B {path_b} ({len(points_b)} points), points "
              f"matched by {matched_by}", file=out)
    tolerances = {metric: rtol for metric in METRICS}
    differing = 0
    unmatched_b = {point.label for point in points_b} - {b.label for _, b in pairs if b is not None}
    for point_a, point_b in pairs:
        summary_a = point_a.summary()
        # the table's entry column: the workload, and the point's directory in a sweep
        label = f"{summary_a.workload}[{point_a.label}]" if point_a.label else summary_a.workload
        if point_b is None:
            differing += 1
            print(f"\n{label}: point {point_a.label} {' '.join(point_a.overrides)} has no counterpart in B", file=out)
            continue
        summary_a, summary_b, scope = on_common_ranks(summary_a, point_b.summary())
        result = compare_records(label, run_record(summary_a), summary_b, tolerances)
        if scope:
            result.notes.insert(0, f"{label}: {scope}")
        heading = f"{label}: {summary_a.run_id} -> {summary_b.run_id}"
        if point_a.overrides:
            heading += f" ({' '.join(point_a.overrides)})"
        print(f"\n{heading}: {'same' if result.ok else 'DIFFERENT'} within rtol {rtol:g}", file=out)
        print(format_comparison(result), file=out)
        if summary_a.config_hash != summary_b.config_hash:
            result.notes.append(f"{label}: the resolved configs differ ({summary_a.config_hash} -> "
                                f"{summary_b.config_hash}); see each run's config.yaml")
        for note in result.notes:
            print(f"note: {note}", file=out)
        differing += 0 if result.ok else 1
    for label in sorted(unmatched_b):
        differing += 1
        print(f"\npoint {label} of B has no counterpart in A", file=out)
    total = len(pairs) + len(unmatched_b)
    if differing:
        print(f"\n{differing} of {total} compared differ beyond rtol {rtol:g}", file=out)
    else:
        print(f"\n{total} compared: all within rtol {rtol:g}", file=out)
    return EXIT_FAILED if differing else EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  membench compare results/runs/20261203-101500-ab12cd results/runs/20261203-104210-9f0e1a\n"
               "  membench compare results/runs/sweep-A results/runs/sweep-B --rtol 0.01\n"
               "  membench compare results/runs/<4-rank run> results/runs/sweep-<emulate.rank=0,1,2,3>")
    parser.add_argument("run_a", type=Path, help="run or sweep directory (the reference)")
    parser.add_argument("run_b", type=Path, help="run or sweep directory to compare with it")
    parser.add_argument("--rtol", type=float, default=0.0,
                        help="relative tolerance for peak, utilization and imbalance (default 0: CPU accounting is "
                             "exact; 0.05 = 5%%)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rtol < 0:
        print(f"{PROG}: --rtol={args.rtol}: use a relative tolerance >= 0 (0.05 = 5%)", file=sys.stderr)
        return EXIT_INVALID
    try:
        return compare_paths(args.run_a, args.run_b, args.rtol)
    except (CompareInputError, ResultsError) as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
