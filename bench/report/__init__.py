"""`membench report`: figures and a markdown report from run results (matplotlib, Agg backend).

    membench report <paths...> [--out DIR] [--format png,svg]
    python -m bench.report <paths...>          # the same

A path may be a run directory, a sweep directory or any results root: every `summary.json` below it is
read (with `bench.results.store.load_summary`; a corrupt one is skipped with a warning). The report directory
gets one PNG/SVG per figure and `report.md`, which embeds the figures, each followed by a table of the
numbers behind it (taken from the summaries unchanged; memory in the figure's unit with 3 decimals and
in raw bytes):

1. memory timeline per rank of a few representative runs (phases shaded, peak marked, capacity);
2. breakdown at peak per run and rank (bench.results.schema.CATEGORIES), absolute and as a share of the peak;
3. utilization CDF over runs x ranks, with the under-utilized share (< 50 % of capacity);
4. imbalance: per-rank peaks of every run, runs sorted by imbalance (max / mean rank peak);
5. OOM frontier of each sweep over two (or more) overrides: busiest-rank utilization, OOM cells marked;
6. estimated vs measured peak per rank (runs whose summary carries `estimate.per_rank_peak`), by category,
   and against the world size for a workload measured at two or more (an emulation ladder);
7. plan mode at scale: estimated per-rank utilization across world sizes (summaries with mode "plan").

A figure without data is skipped with a line in report.md that says why. Exit status: 0, or 2 when no
summary could be read (one line on stderr).
"""
from bench.report.app import build_parser, main
from bench.report.frame import load_frame, load_timelines
from bench.report.loading import load_runs

__all__ = ["build_parser", "load_frame", "load_runs", "load_timelines", "main"]
