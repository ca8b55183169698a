"""One report: load the results, draw every figure into the report directory, write report.md."""
from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from bench.report.emulated_jobs import merge_emulated_ranks
from bench.report.figures import FIGURES
from bench.report.figures.cache_ratio import provision_files
from bench.report.loading import load_runs
from bench.report.markdown import Section, render_markdown
from bench.report.messages import PROG, NoResults, ReportError, WarningLog, info
from bench.report.style import FORMATS, Plotter
from bench.results.store import atomic_write_text


def clean_old_figures(out: Path) -> None:
    """A figure this report skips must not survive from an earlier report in the same directory."""
    for path in out.glob("fig[0-9]*_*"):
        if path.is_file() and path.suffix[1:] in FORMATS:
            path.unlink()


def write_report(paths: Sequence[Path], out: Path, formats: Sequence[str], log: WarningLog) -> List[Section]:
    """Writes the figures and report.md under out; raises ReportError when there is nothing to report or
    out cannot be created."""
    try:
        runs, sweeps = load_runs(paths, skip=out.resolve(), log=log)
    except NoResults:
        if not provision_files(paths):  # provision reports alone make a report of their figure
            raise
        runs, sweeps = [], []
    runs = merge_emulated_ranks(runs)  # a sweep over emulate.rank: the job it measured, rank by rank
    info(f"{len(runs)} runs loaded ({len(sweeps)} sweeps) from {', '.join(map(str, paths))}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ReportError(f"{PROG}: cannot create {out} ({err.strerror or err})") from None
    clean_old_figures(out)
    plot = Plotter(out, formats)
    sections = []
    for number, (name, build) in enumerate(FIGURES, start=1):
        info(f"figure {number}/{len(FIGURES)}: {name}")
        section = build(plot, runs, sweeps, paths)
        if section.skipped:
            info(f"  skipped: {section.skipped}")
        sections.append(section)
    atomic_write_text(out / "report.md", render_markdown(out, paths, runs, sections, log.items))
    return sections
