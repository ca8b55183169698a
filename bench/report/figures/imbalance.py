"""Figure 4: the peak of every rank per run, runs sorted by imbalance (max / mean rank peak)."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, List

from bench.report.loading import Run, measured_ok_runs, natural_key
from bench.report.markdown import Section, md_table
from bench.report.style import BALANCED, OKABE_ITO, Plotter, Unit, pick_unit

INTRO = ("Peak of every rank, per run; runs sorted by imbalance (max rank peak / mean rank peak, "
         "1.0 = balanced). Left: absolute peaks; right: each rank's peak / the run's mean.")
DRAWN_WHEN_FEW = 12  # up to this many runs every one is drawn; beyond, balanced ones only fill up to it


def figure_imbalance(plot: Plotter, runs: List[Run], max_runs: int = 30) -> Section:
    section = Section(4, "Imbalance across ranks", INTRO)
    chosen = [r for r in measured_ok_runs(runs) if len(r.measured_ranks()) >= 1]
    if not chosen:
        section.skipped = "no finished measured run (status ok)"
        return section
    chosen.sort(key=lambda r: (-r.s.job.imbalance, natural_key(str(r.dir))))
    rows = [table_row(run) for run in chosen]
    drawn = drawn_runs(chosen, max_runs, section.notes)
    files = draw(plot, drawn, len(chosen))
    table = md_table(["run", "ranks", "imbalance", "max rank", "max peak (bytes)", "min rank", "min peak (bytes)",
                      "mean peak (bytes)", "peaks by rank (bytes)"], rows)
    section.figures.append(("imbalance", files, table))
    return section


def table_row(run: Run) -> List[Any]:
    ranks = sorted(run.measured_ranks(), key=lambda x: -x.peak_bytes)
    mean = statistics.fmean(x.peak_bytes for x in ranks)
    return [run.label, len(ranks), f"{run.s.job.imbalance:.4f}", f"r{ranks[0].rank}", ranks[0].peak_bytes,
            f"r{ranks[-1].rank}", ranks[-1].peak_bytes, f"{mean:.1f}",
            ", ".join(str(x.peak_bytes) for x in sorted(ranks, key=lambda x: x.rank))]


def drawn_runs(chosen: List[Run], max_runs: int, notes: List[str]) -> List[Run]:
    """Every imbalanced run, and of the balanced ones (< BALANCED) only a few: the table has them all."""
    drawn = [r for r in chosen if r.s.job.imbalance >= BALANCED]
    balanced = [r for r in chosen if r.s.job.imbalance < BALANCED]
    keep = balanced if len(chosen) <= DRAWN_WHEN_FEW else balanced[:max(2, DRAWN_WHEN_FEW - len(drawn))]
    drawn += keep
    if len(balanced) > len(keep):
        notes.append(f"{len(balanced) - len(keep)} more balanced runs (imbalance < {BALANCED}) are in the "
                     f"table but not drawn")
    if len(drawn) > max_runs:
        notes.append(f"{len(drawn)} runs to draw; the {max_runs} most imbalanced shown")
        drawn = drawn[:max_runs]
    return drawn


def draw(plot: Plotter, drawn: List[Run], total: int) -> List[Path]:
    unit = pick_unit(x.peak_bytes for r in drawn for x in r.measured_ranks())
    height = max(3.0, 0.42 * len(drawn) + 1.6)
    fig, (ax_abs, ax_rel) = plot.plt.subplots(1, 2, figsize=(12, height), sharey=True,
                                              gridspec_kw={"width_ratios": [1.2, 1]})
    rel_top = 1.0
    for row, run in enumerate(drawn):
        rel_top = max(rel_top, draw_run(ax_abs, ax_rel, len(drawn) - 1 - row, run, unit))
    if len(drawn) < total:
        ax_abs.set_title(f"{len(drawn)} of {total} runs drawn (all imbalanced ones); all are in the table",
                         fontsize=9, loc="left")
    style_axes(ax_abs, ax_rel, drawn, unit, rel_top)
    fig.suptitle("Per-rank peaks, runs sorted by imbalance", x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.06 if len(drawn) > 3 else 0.1, 1, 0.97))
    fig.legend(handles=legend_handles(), loc="lower center", ncol=3, frameon=False, bbox_to_anchor=(0.5, 0.0))
    return plot.save(fig, "fig4_imbalance")


def draw_run(ax_abs, ax_rel, y: int, run: Run, unit: Unit) -> float:
    """One run's row in both panels; returns its imbalance (the largest peak / mean)."""
    ranks = sorted(run.measured_ranks(), key=lambda x: -x.peak_bytes)
    peaks = [x.peak_bytes for x in ranks]
    mean = statistics.fmean(peaks)
    rel = [p / mean if mean else 0 for p in peaks]
    for ax, values in ((ax_abs, [unit(p) for p in peaks]), (ax_rel, rel)):
        ax.hlines(y, min(values), max(values), color="#999999", lw=1.5, zorder=2)
        ax.plot(values[1:], [y] * (len(values) - 1), ls="", marker="o", ms=6, color=OKABE_ITO[0],
                alpha=0.8, zorder=3)
        ax.plot(values[:1], [y], ls="", marker="D", ms=7, color=OKABE_ITO[5], zorder=4)
    ax_abs.plot([unit(mean)], [y], marker="|", ms=14, mew=2, color="#000000", zorder=5)
    ax_rel.annotate(f"{run.s.job.imbalance:.3f}", (max(rel), y), xytext=(6, 0), textcoords="offset points",
                    va="center", fontsize=9)
    return max(rel)


def style_axes(ax_abs, ax_rel, drawn: List[Run], unit: Unit, rel_top: float) -> None:
    ax_rel.axvline(1.0, color="#000000", ls="--", lw=1.0)
    ax_abs.set_yticks(range(len(drawn))[::-1], [r.label for r in drawn])
    ax_abs.set_xlabel(f"rank peak ({unit.name})")
    ax_rel.set_xlabel("rank peak / mean rank peak (imbalance = the largest)")
    ax_rel.set_xlim(min(0.8, ax_rel.get_xlim()[0]), rel_top + (rel_top - 0.8) * 0.25 + 0.05)
    _, right = ax_abs.get_xlim()
    ax_abs.set_xlim(0, right * 1.05)
    for ax in (ax_abs, ax_rel):
        ax.set_ylim(-0.7, len(drawn) - 0.3)
        ax.grid(axis="y", alpha=0.0)


def legend_handles() -> list:
    from matplotlib.lines import Line2D

    return [Line2D([], [], ls="", marker="D", ms=7, color=OKABE_ITO[5], label="rank with the highest peak"),
            Line2D([], [], ls="", marker="o", ms=6, color=OKABE_ITO[0], label="other ranks"),
            Line2D([], [], ls="", marker="|", ms=12, mew=2, color="#000000", label="mean rank peak")]
