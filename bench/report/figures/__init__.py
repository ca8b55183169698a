"""The report's figures in report order. Each builder draws its figure files and returns the section of
report.md that embeds them, or says why it was skipped."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, List, Sequence, Tuple

from bench.report.figures.allocator import figure_allocator
from bench.report.figures.breakdown import figure_breakdown
from bench.report.figures.cache_ratio import figure_cache_ratio
from bench.report.figures.estimate import figure_estimate
from bench.report.figures.frontier import figure_frontier
from bench.report.figures.imbalance import figure_imbalance
from bench.report.figures.pipelines import figure_pipelines
from bench.report.figures.plan import figure_plan
from bench.report.figures.planners import figure_planners
from bench.report.figures.timeline import figure_timeline
from bench.report.figures.utilization import figure_utilization
from bench.report.loading import Run, Sweep
from bench.report.markdown import Section
from bench.report.style import Plotter

# (plotter, runs, sweeps, the report's input paths: figures of files other than runs read them there)
Builder = Callable[[Plotter, List[Run], List[Sweep], Sequence[Path]], Section]

FIGURES: Tuple[Tuple[str, Builder], ...] = (
    ("memory timelines", lambda plot, runs, sweeps, paths: figure_timeline(plot, runs)),
    ("breakdown at peak", lambda plot, runs, sweeps, paths: figure_breakdown(plot, runs)),
    ("utilization CDF", lambda plot, runs, sweeps, paths: figure_utilization(plot, runs)),
    ("imbalance", lambda plot, runs, sweeps, paths: figure_imbalance(plot, runs)),
    ("OOM frontier", lambda plot, runs, sweeps, paths: figure_frontier(plot, runs, sweeps)),
    ("estimated vs measured", lambda plot, runs, sweeps, paths: figure_estimate(plot, runs)),
    ("plan mode at scale", lambda plot, runs, sweeps, paths: figure_plan(plot, runs)),
    ("allocated vs reserved", lambda plot, runs, sweeps, paths: figure_allocator(plot, runs)),
    ("train pipelines", lambda plot, runs, sweeps, paths: figure_pipelines(plot, runs)),
    ("torchrec planner memory models", lambda plot, runs, sweeps, paths: figure_planners(plot, runs)),
    ("UVM cache ratio", lambda plot, runs, sweeps, paths: figure_cache_ratio(plot, paths)),
)
