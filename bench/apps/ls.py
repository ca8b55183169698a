"""`membench ls [RESULTS...]`: past runs and sweeps, newest first.

One row per run, and one per sweep (or regression-suite session) over its points: id, when it started,
workload, hardware, world size, status (a sweep's worst, with a count per status), the largest rank
peak and the highest rank utilization. Filters select runs (a sweep then stands for its points that
match): --status oom, --workload tiny, --hardware h100_80g, --mode plan; each takes a comma-separated list.

Exit status: 0 listed, 1 no run matches the filters, 2 no readable summary.json under RESULTS.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from rich.table import Table

from bench.apps.console import STATUS_STYLE, human_bytes, make_console
from bench.report.listing import ListingRow, RunFilter, listing_rows, started
from bench.report.loading import load_runs
from bench.report.messages import ReportError, WarningLog
from bench.results.schema import EXIT_FAILED, EXIT_INVALID, EXIT_OK

PROG = "membench ls"
DEFAULT_RESULTS = Path("results/runs")  # conf/config.yaml's results_dir


def joined(values, most: int = 2) -> str:
    values = [str(v) for v in values]
    if len(values) > most:
        return f"{', '.join(values[:most])} +{len(values) - most}"
    return ", ".join(values) or "-"


def world_sizes(row: ListingRow) -> str:
    """The world size(s); for emulated runs (emulate.*), which ranks of it ran."""
    sizes = row.world_sizes
    if not sizes:
        return "-"
    text = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    ranks = row.emulated_ranks
    if ranks:
        text += f" (rank {ranks[0]})" if len(ranks) == 1 else f" ({len(ranks)} ranks emulated)"
    return text


def when(row: ListingRow) -> str:
    moment = started(row.started_at)
    return "-" if moment.year == 1 else moment.strftime("%Y-%m-%d %H:%M")


def print_listing(rows: List[ListingRow]) -> None:
    console = make_console()
    table = Table(title=f"{len(rows)} runs and sweeps, newest first (times UTC)", title_justify="left")
    for column, justify in (("id", "left"), ("when", "left"), ("runs", "right"), ("workload", "left"),
                            ("hardware", "left"), ("world", "right"), ("status", "left"), ("max peak", "right"),
                            ("util %", "right")):
        table.add_column(column, justify=justify, overflow="fold")
    for row in rows:
        worst = row.status.split(" ")[0]
        style = STATUS_STYLE.get(worst, "")
        runs = str(row.runs) if row.runs == row.total_runs else f"{row.runs}/{row.total_runs}"
        util = "-" if row.max_utilization is None else f"{100 * row.max_utilization:.1f}"
        table.add_row(row.id, when(row), runs, joined(row.workloads), joined(row.hardware), world_sizes(row),
                      f"[{style}]{row.status}[/{style}]" if style else row.status, human_bytes(row.max_peak_bytes),
                      util)
    console.print(table)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  membench ls\n  membench ls --status oom,failed\n"
               "  membench ls results/runs/study-characterization --mode plan --limit 5")
    parser.add_argument("results", nargs="*", type=Path, default=[DEFAULT_RESULTS],
                        help=f"results roots, sweep or run directories (default {DEFAULT_RESULTS})")
    parser.add_argument("--status", action="append", default=[],
                        help="only runs that ended so: ok, oom, failed, timeout, invalid (comma-separated)")
    parser.add_argument("--workload", action="append", default=[], help="only these workloads (comma-separated)")
    parser.add_argument("--hardware", action="append", default=[], help="only these hardware profiles")
    parser.add_argument("--mode", action="append", default=[], help="only train or plan runs")
    parser.add_argument("--limit", "-n", type=int, default=None, help="the newest N rows only")
    parser.add_argument("--flat", action="store_true", help="every run on its own row, sweep points included")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.limit is not None and args.limit < 1:
        print(f"{PROG}: --limit {args.limit}: give a number of rows >= 1", file=sys.stderr)
        return EXIT_INVALID
    log = WarningLog(PROG)
    try:
        runs, _ = load_runs(args.results, skip=None, log=log, skip_bad_paths=True)
    except ReportError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    selection = RunFilter.of(args.status, args.workload, args.hardware, args.mode)
    rows = listing_rows(runs, selection, flat=args.flat)
    if not rows:
        where = ", ".join(map(str, args.results))
        print(f"{PROG}: no run matches {selection.describe()} among the {len(runs)} runs under {where}",
              file=sys.stderr)
        return EXIT_FAILED
    print_listing(rows[:args.limit] if args.limit else rows)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
