"""Figure 7: plan mode at scale, the estimated per-rank utilization of virtual workloads across world sizes."""
from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Tuple

from bench.report.loading import Run, natural_key
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, OOM_FACE, Plotter, pct
from workloads.units import GIB

INTRO = ("Estimated per-rank utilization (planned peak / capacity) of the virtual workloads across "
         "world sizes, from plan-mode summaries. Dots: ranks; bar: min–max; diamond: the worst "
         "rank. Above the 100 % line a rank does not fit.")
TABLE_HEADERS = ("workload", "hardware", "world size", "verdict", "worst rank", "util min %", "util mean %",
                 "util max %", "max rank peak (bytes)", "max rank peak (GiB)", "capacity (bytes)",
                 "plan time s", "error")


def figure_plan(plot: Plotter, runs: List[Run]) -> Section:
    import numpy as np

    section = Section(7, "Plan mode at scale", INTRO)
    plans = [r for r in runs if r.s.mode == "plan"]
    if not plans:
        section.skipped = ("no plan-mode summary (mode \"plan\"); produce them with "
                           "`membench plan workload=tb_1 hardware=h100_80g world_size=64`")
        return section
    groups: Dict[Tuple[str, str], List[Run]] = {}
    for run in plans:
        groups.setdefault((run.s.workload, run.s.hardware), []).append(run)
    keys = sorted(groups, key=lambda k: (natural_key(k[0]), k[1]))
    ncols = min(len(keys), 3)
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plot.plt.subplots(nrows, ncols, figsize=(4.4 * ncols + 0.6, 4.0 * nrows + 0.8), squeeze=False)
    rows: List[List[Any]] = []
    rng = np.random.default_rng(0)  # fixed jitter: the same plans give the same figure
    unplaced_any = False
    for index, key in enumerate(keys):
        unplaced_any |= draw_group(axes[index // ncols, index % ncols], key, groups[key], rng, rows)
    for index in range(len(keys), nrows * ncols):
        axes[index // ncols, index % ncols].set_visible(False)
    fig.suptitle("Plan mode: estimated per-rank utilization vs world size", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    handles = legend_handles(unplaced_any)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, bbox_to_anchor=(0.5, 0.0))
    files = plot.save(fig, "fig7_plan_scale")
    section.figures.append(("plan mode at scale", files, md_table(TABLE_HEADERS, rows)))
    return section


def plan_facts(run: Run) -> Tuple[Dict[str, Any], str, str]:
    """The run's estimate, its verdict and its plan time as text."""
    est = run.s.estimate if isinstance(run.s.estimate, dict) else {}
    verdict = est.get("verdict") or ("fits" if run.s.status == "ok" else run.s.status)
    plan_time = f"{est.get('plan_time_s'):.3f}" if isinstance(est.get("plan_time_s"), (int, float)) else "—"
    return est, verdict, plan_time


def draw_group(ax, key: Tuple[str, str], runs: List[Run], rng, rows: List[List[Any]]) -> bool:
    """One workload on one hardware across world sizes; adds its table rows, returns whether some plan
    has no placement at all."""
    members = sorted(runs, key=lambda r: (r.s.world_size, natural_key(str(r.dir))))
    sizes = []
    for run in members:
        if run.s.world_size not in sizes:
            sizes.append(run.s.world_size)
    top = max([1.0] + [rank.utilization for run in members for rank in run.s.per_rank])
    low = min([1.0] + [rank.utilization for run in members for rank in run.s.per_rank if rank.utilization > 0])
    log = top / max(low, 1e-9) > 8 and top > 2.0
    unplaced = False
    for run in members:
        x = sizes.index(run.s.world_size)
        if not run.s.per_rank:
            # no placement at all (e.g. the tables exceed the total capacity): nothing per rank to draw
            unplaced = True
            rows.append(draw_unplaced(ax, x, top * 100 * (1.6 if log else 1.07), run))
        else:
            rows.append(draw_placed(ax, x, run, rng))
    style_group_axes(ax, key, sizes, log, low, top)
    return unplaced


def draw_unplaced(ax, x: int, y: float, run: Run) -> List[Any]:
    _, verdict, plan_time = plan_facts(run)
    ax.plot([x], [y], marker="X", ms=11, color=OOM_FACE, mec="black", mew=0.6, zorder=4)
    ax.annotate(f"{verdict.upper()}:\nno placement", (x, y), xytext=(0, -10), textcoords="offset points",
                ha="center", va="top", fontsize=8.5, fontweight="bold", zorder=5,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.9))
    return [run.s.workload, run.s.hardware, run.s.world_size, verdict, "—", "—", "—", "—", "—",
            "—", "—", plan_time, run.s.error or ""]


def draw_placed(ax, x: int, run: Run, rng) -> List[Any]:
    """Every rank (jittered dots), the min–max bar and the worst rank; returns the table row."""
    est, verdict, plan_time = plan_facts(run)
    fits = verdict == "fits"
    color = OKABE_ITO[0] if fits else OKABE_ITO[5]
    utils = [rank.utilization for rank in run.s.per_rank]
    jitter = rng.uniform(-0.18, 0.18, len(utils))
    ax.scatter(x + jitter, [u * 100 for u in utils], s=9, color=color, alpha=0.45, lw=0, zorder=3,
               rasterized=len(utils) > 256)  # thousands of ranks: keep the SVG small
    ax.vlines(x, min(utils) * 100, max(utils) * 100, color=color, lw=2.0, zorder=2)
    worst = est.get("worst_rank")
    worst_rank = next((r for r in run.s.per_rank if r.rank == worst), None) or \
        max(run.s.per_rank, key=lambda r: r.utilization)
    ax.plot([x], [worst_rank.utilization * 100], marker="D", ms=8, color=color, mec="black", mew=0.6,
            zorder=4)
    ax.annotate(f"{verdict.upper() if not fits else 'fits'}\n{pct(worst_rank.utilization, 1)} %",
                (x, worst_rank.utilization * 100), xytext=(0, 8), textcoords="offset points",
                ha="center", va="bottom", fontsize=8.5, color="black",
                fontweight="bold" if not fits else "normal")
    peak = max(r.peak_bytes for r in run.s.per_rank)
    return [run.s.workload, run.s.hardware, run.s.world_size, verdict, worst_rank.rank,
            pct(min(utils)), pct(statistics.fmean(utils)), pct(max(utils)), peak,
            f"{peak / GIB:.3f}", worst_rank.capacity_bytes, plan_time, run.s.error or ""]


def style_group_axes(ax, key: Tuple[str, str], sizes: List[int], log: bool, low: float, top: float) -> None:
    ax.axhline(100, color="#000000", ls="--", lw=1.1)
    if log:
        ax.set_yscale("log")
        ax.set_ylim(low * 100 / 1.6, top * 100 * 2.6)
        ax.set_ylabel("estimated utilization (%, log scale)")
    else:
        ax.set_ylim(0, max(118, top * 100 * 1.22))
        ax.set_ylabel("estimated utilization (%)")
    ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
    ax.set_xlim(-0.6, len(sizes) - 0.4)
    ax.set_xlabel("world size (ranks)")
    ax.set_title(f"{key[0]} on {key[1]}", fontsize=10.5, loc="left")
    ax.grid(axis="x", alpha=0.0)


def legend_handles(unplaced_any: bool) -> list:
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", color=OKABE_ITO[0], label="ranks (fits)"),
               Line2D([], [], ls="", marker="o", color=OKABE_ITO[5], label="ranks (does not fit)"),
               Line2D([], [], ls="", marker="D", color="#777777", mec="black", label="worst rank"),
               Line2D([], [], ls="--", color="#000000", lw=1.1, label="capacity (100 %)")]
    if unplaced_any:
        handles.append(Line2D([], [], ls="", marker="X", color=OOM_FACE, mec="black", label="no placement possible"))
    return handles
