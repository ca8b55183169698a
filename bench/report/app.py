"""`membench report` on the command line: arguments in, exit status out."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

from bench.report.messages import PROG, ReportError, WarningLog
from bench.report.pipeline import write_report
from bench.report.style import FORMATS

EXIT_NO_RESULTS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Figures and a markdown report (report.md) from membench results.",
        epilog="examples:\n  membench report results/runs/sweep-20261202-150211-e51851\n"
               "  membench report results/runs --out report --format png\n\n"
               "exit status: 0 report written, 2 no readable summary.json (or bad arguments)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path,
                        help="run directories, sweep directories or results roots (searched for summary.json)")
    parser.add_argument("--out", type=Path, default=None,
                        help="report directory (default: <path>/report for one path, ./report for several)")
    parser.add_argument("--format", default="png,svg",
                        help=f"comma-separated figure formats among {', '.join(FORMATS)} (default png,svg)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    formats = [f.strip().lower().lstrip(".") for f in args.format.split(",") if f.strip()]
    if not formats or any(f not in FORMATS for f in formats):
        print(f"{PROG}: --format {args.format!r}: use a comma-separated list of {', '.join(FORMATS)}",
              file=sys.stderr)
        return EXIT_NO_RESULTS
    out = args.out if args.out is not None else (args.paths[0] / "report" if len(args.paths) == 1
                                                 and args.paths[0].is_dir() else Path("report"))
    try:
        sections = write_report(args.paths, out, formats, WarningLog())
    except ReportError as err:
        print(str(err), file=sys.stderr)
        return EXIT_NO_RESULTS
    made = sum(len(files) for s in sections for _, files, _ in s.figures)
    print(f"report: {out / 'report.md'} ({made} figure files, "
          f"{sum(1 for s in sections if s.skipped)} of {len(sections)} figures skipped)")
    return 0
