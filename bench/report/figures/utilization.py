"""Figure 3: the distribution (CDF) of peak / capacity over every rank of every finished measured run."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import List, Sequence, Tuple

from bench.report.loading import Run, measured_ok_runs
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, Plotter, pct

UNDER_UTILIZED = 0.5  # the paper's threshold: a rank using less than half its memory is under-utilized
INTRO = ("Peak memory / capacity of every rank of every finished measured run (one point per "
         f"run x rank). Under-utilized: below {UNDER_UTILIZED * 100:.0f} % of capacity.")


def ecdf(values: Sequence[float]) -> Tuple[List[float], List[float]]:
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def figure_utilization(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(3, "Utilization distribution", INTRO)
    chosen = measured_ok_runs(runs)
    if not chosen:
        section.skipped = "no finished measured run (status ok)"
        return section
    utils = [rank.utilization for run in chosen for rank in run.measured_ranks()]
    under = sum(1 for u in utils if u < UNDER_UTILIZED)
    share = under / len(utils)
    files = draw(plot, utils, under, len(chosen))
    section.figures.append(("utilization CDF", files, tables(chosen, utils, under)))
    section.intro += (f" **{under} of {len(utils)} rank-runs ({share * 100:.1f} %) are under-utilized.**")
    skipped = [r for r in runs if r.s.mode != "plan" and r not in chosen]
    if skipped:
        section.notes.append(f"{len(skipped)} run(s) not finished (status oom / failed / invalid / timeout) are "
                             f"not in the distribution")
    return section


def draw(plot: Plotter, utils: List[float], under: int, run_count: int) -> List[Path]:
    share = under / len(utils)
    xs, ys = ecdf([u * 100 for u in utils])
    fig, ax = plot.plt.subplots(figsize=(8.5, 4.8))
    ax.axvspan(0, UNDER_UTILIZED * 100, color=OKABE_ITO[4], alpha=0.12, lw=0)
    ax.step([0] + xs, [0] + ys, where="post", color=OKABE_ITO[0], lw=2.2)
    ax.plot(xs, ys, ls="", marker="o", ms=3.5, color=OKABE_ITO[0])
    ax.axvline(UNDER_UTILIZED * 100, color="#000000", ls="--", lw=1.1)
    ax.axhline(share, color="#555555", ls=":", lw=1.0)
    top = max(100.0, max(xs) * 1.05)
    ax.set_xlim(0, top)
    ax.set_ylim(0, 1.02)
    ax.text(UNDER_UTILIZED * 100 + top * 0.01, 0.04,
            f"{under} of {len(utils)} rank-runs ({share * 100:.1f} %)\nuse < {UNDER_UTILIZED * 100:.0f} % of capacity",
            fontsize=9.5, va="bottom", ha="left", bbox=dict(boxstyle="round,pad=0.3", fc="white", ec="#888888"))
    ax.set_xlabel("utilization: peak / capacity (%)")
    ax.set_ylabel("fraction of rank-runs ≤ x")
    ax.set_title(f"Memory utilization CDF ({run_count} runs, {len(utils)} ranks)", loc="left")
    return plot.save(fig, "fig3_utilization_cdf")


def tables(chosen: List[Run], utils: List[float], under: int) -> str:
    """The distribution's quantiles, then every rank-run."""
    share = under / len(utils)
    quantiles = statistics.quantiles(utils, n=4, method="inclusive") if len(utils) > 1 else [utils[0]] * 3
    stats = md_table(["rank-runs", "min %", "p25 %", "median %", "p75 %", "max %", f"< {UNDER_UTILIZED * 100:.0f} %"],
                     [[len(utils), pct(min(utils)), pct(quantiles[0]), pct(quantiles[1]), pct(quantiles[2]),
                       pct(max(utils)), f"{under} ({share * 100:.1f} %)"]])
    per_run = md_table(["run", "rank", "utilization %", "peak (bytes)", "capacity (bytes)"],
                       [[run.label, rank.rank, pct(rank.utilization), rank.peak_bytes, rank.capacity_bytes]
                        for run in chosen for rank in run.measured_ranks()])
    return stats + "\n\n" + per_run
