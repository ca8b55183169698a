"""Figure 2: what was live at each rank's peak, by category, absolute and as a share of the peak."""
from __future__ import annotations

from pathlib import Path
from typing import Any, List, Tuple

from bench.report.loading import Run, measured_ok_runs
from bench.report.markdown import Section, md_table
from bench.report.style import BALANCED, CATEGORY_COLORS, Plotter, Unit, pick_unit
from bench.results.schema import CATEGORIES

INTRO = ("What was live at each rank's peak, by category (bench.results.schema.CATEGORIES; they add up to "
         "the peak). Left: absolute; right: share of the peak. Runs that did not finish (OOM, "
         "failed) are listed under OOM and failed runs instead.")
ROW_IN, TOP_IN, BOTTOM_IN = 0.27, 1.25, 0.65  # inches: per bar row, above the bars (title, legend), below

Groups = List[Tuple[Run, List[Any]]]


def figure_breakdown(plot: Plotter, runs: List[Run], max_bars: int = 48) -> Section:
    section = Section(2, "Memory breakdown at peak", INTRO)
    chosen = measured_ok_runs(runs)
    if not chosen:
        section.skipped = "no finished measured run (status ok) to break down"
        return section
    table_bars = [(run, rank) for run in chosen for rank in run.measured_ranks()]
    groups = bar_groups(chosen, max_bars, section.notes)
    used = [c for c in CATEGORIES if any(rank.breakdown.get(c, 0) for _, rank in table_bars)]
    unused = [c for c in CATEGORIES if c not in used]
    unit = pick_unit(rank.peak_bytes for _, rank in table_bars)
    files = draw(plot, groups, used, unit)
    rows = [[run.label, rank.rank, unit.fmt(rank.peak_bytes), rank.peak_bytes,
             *[rank.breakdown.get(c, 0) for c in used]] for run, rank in table_bars]
    table = md_table(["run", "rank", f"peak ({unit.name})", "peak (bytes)", *[f"{c} (bytes)" for c in used]], rows)
    if unused:
        section.notes.append("zero in every bar, so not drawn: " + ", ".join(unused))
    section.figures.append(("breakdown at peak", files, table))
    return section


def bar_groups(chosen: List[Run], max_bars: int, notes: List[str]) -> Groups:
    """The ranks drawn per run; what was left out is said in notes."""
    # a balanced run (every rank within BALANCED of the mean peak) is drawn as one bar: its busiest rank
    groups: Groups = []
    merged = 0
    for run in chosen:
        ranks = run.measured_ranks()
        if len(ranks) > 1 and run.s.job.imbalance < BALANCED:
            groups.append((run, [max(ranks, key=lambda x: x.peak_bytes)]))
            merged += 1
        else:
            groups.append((run, ranks))
    if merged:
        notes.append(f"{merged} balanced run(s) (imbalance < {BALANCED}) drawn as one bar, their busiest "
                     f"rank; the table lists every rank")
    if sum(len(ranks) for _, ranks in groups) > max_bars:
        groups = [(run, [max(ranks, key=lambda x: x.peak_bytes)]) for run, ranks in groups][:max_bars]
        notes.append(f"{len(chosen)} runs: one bar per run (its rank with the highest peak)"
                     + (f"; the first {max_bars} shown" if len(chosen) > max_bars else ""))
    return groups


def draw(plot: Plotter, groups: Groups, used: List[str], unit: Unit) -> List[Path]:
    import numpy as np

    bars = [(run, rank) for run, ranks in groups for rank in ranks]
    # rows top to bottom: a header row per run (its label), then one bar per rank
    layout: List[Tuple[str, Any, Any]] = []
    for run, ranks in groups:
        layout.append(("header", run, None))
        layout += [("bar", run, rank) for rank in ranks]
    height = TOP_IN + BOTTOM_IN + ROW_IN * len(layout)
    fig, (ax_abs, ax_pct) = plot.plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                              gridspec_kw={"width_ratios": [1.3, 1]})
    fig.subplots_adjust(left=0.05, right=0.985, top=1 - TOP_IN / height, bottom=BOTTOM_IN / height, wspace=0.06)
    positions = {id(item): len(layout) - 1 - i for i, item in enumerate(layout)}
    y = np.array([positions[id(item)] for item in layout if item[0] == "bar"], dtype=float)
    top_abs = draw_bars(ax_abs, ax_pct, y, bars, used, unit)
    for item in layout:
        if item[0] == "header":
            draw_run_header(ax_abs, ax_pct, positions[id(item)], item[1].label)
    ax_abs.set_xlim(0, top_abs * 1.12 if top_abs > 0 else 1)
    ax_abs.set_yticks(y, tick_labels(bars))
    style_axes(ax_abs, ax_pct, unit, len(layout))
    fig.suptitle("Memory breakdown at peak, per run and rank", x=0.01, y=1 - 0.12 / height, ha="left", va="top")
    fig.legend(*ax_abs.get_legend_handles_labels(), loc="upper left", ncol=min(len(used), 6), frameon=False,
               bbox_to_anchor=(0.01, 1 - 0.45 / height), fontsize=9, handlelength=1.4, columnspacing=1.2)
    return plot.save(fig, "fig2_breakdown")


def draw_bars(ax_abs, ax_pct, y, bars: List[Tuple[Run, Any]], used: List[str], unit: Unit) -> float:
    """Stacked bars, one segment per category, and each bar's peak; returns the longest bar."""
    import numpy as np

    left_abs = np.zeros(len(bars))
    left_pct = np.zeros(len(bars))
    peaks = np.array([rank.peak_bytes or 1 for _, rank in bars], dtype=float)
    for category in used:
        values = np.array([rank.breakdown.get(category, 0) for _, rank in bars], dtype=float)
        kwargs = dict(color=CATEGORY_COLORS[category], edgecolor="white", linewidth=0.4, height=0.78)
        ax_abs.barh(y, values / unit.scale, left=left_abs, label=category, **kwargs)
        ax_pct.barh(y, values / peaks * 100, left=left_pct, **kwargs)
        left_abs += values / unit.scale
        left_pct += values / peaks * 100
    top_abs = max(left_abs) if len(left_abs) else 1
    for yy, (_, rank) in zip(y, bars):
        ax_abs.text(unit(rank.peak_bytes) + top_abs * 0.01, yy, unit.fmt(rank.peak_bytes), va="center", fontsize=8)
    return top_abs


def draw_run_header(ax_abs, ax_pct, row: float, label: str) -> None:
    ax_abs.annotate(label, (0, row - 0.05), xytext=(4, 0), textcoords="offset points", va="center",
                    ha="left", fontsize=9, fontweight="bold")
    for ax in (ax_abs, ax_pct):
        ax.axhline(row + 0.5, color="#BBBBBB", lw=0.6)


def tick_labels(bars: List[Tuple[Run, Any]]) -> List[str]:
    labels = []
    for run, rank in bars:
        count = len(run.measured_ranks())
        single = sum(1 for r, _ in bars if r is run) == 1
        labels.append(f"r{rank.rank}" if not single or count == 1 else f"all {count}\nranks")
    return labels


def style_axes(ax_abs, ax_pct, unit: Unit, rows: int) -> None:
    ax_abs.set_xlabel(f"memory at peak ({unit.name})")
    ax_pct.set_xlabel("share of the peak (%)")
    ax_pct.set_xlim(0, 100)
    for ax in (ax_abs, ax_pct):
        ax.grid(axis="y", alpha=0.0)
        ax.set_ylim(-0.6, rows - 0.4)
        ax.tick_params(axis="y", length=0)
    ax_abs.set_title("absolute", fontsize=10, loc="left")
    ax_pct.set_title("share of peak", fontsize=10, loc="left")
