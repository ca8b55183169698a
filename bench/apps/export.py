"""`membench export RESULTS... --out FILE`: every run under RESULTS as one table, for notebooks.

One row per run and rank: the resolved config flattened into columns (workload.batch_size, sharding,
hardware, model, allocator.*, ...), status, peak / allocated / reserved / device-used bytes, every
breakdown category, utilization, headroom, the prediction and its error, step-time p50, library
versions, run id and sweep id (bench/report/frame.py lists every column). With --timelines, the ranks'
memory timelines as a long table instead (run_id, rank, time_s, step, phase, bytes...).

The format follows the file name: .csv, .jsonl, or .parquet (needs pyarrow). The same table in Python:

    from bench.report.frame import load_frame
    runs = load_frame("results/runs/sweep-<id>")

A file that cannot be read is named in a warning and skipped. Exit status: 0 written, 2 nothing to
export (no readable summary.json) or bad arguments.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from bench.report.frame import load_frame, load_timelines, require_parquet_engine, table_format, write_table
from bench.report.messages import ReportError, WarningLog
from bench.results.schema import EXIT_INVALID, EXIT_OK

PROG = "membench export"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  membench export results/runs/sweep-20261203-113304-11044e --out sweep.csv\n"
               "  membench export results/runs --out runs.parquet\n"
               "  membench export results/runs/sweep-<id> --timelines --out timelines.jsonl")
    parser.add_argument("results", nargs="+", type=Path,
                        help="run directories, sweep directories or results roots (searched for summary.json)")
    parser.add_argument("--out", "-o", type=Path, required=True,
                        help="the table to write: FILE.csv, FILE.jsonl or FILE.parquet")
    parser.add_argument("--timelines", action="store_true",
                        help="export the per-rank memory timelines (one row per rank and phase) instead")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    log = WarningLog(PROG)
    try:
        if table_format(args.out) == "parquet":
            require_parquet_engine()  # before reading every run, not after
        frame = load_timelines(args.results, log) if args.timelines else load_frame(args.results, log)
        write_table(frame, args.out)
    except ReportError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    what = "timeline rows" if args.timelines else "rows (run x rank)"
    runs = frame["run_id"].nunique()
    warned = f", {plural(len(log.items), 'warning')} above" if log.items else ""
    print(f"{PROG}: {len(frame)} {what} of {plural(runs, 'run')}, {len(frame.columns)} columns -> {args.out}{warned}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
