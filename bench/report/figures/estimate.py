"""Figure 6: estimated (membench's estimator, torchrec's planner) vs measured peak per rank."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench.report.figures.estimate_scale import draw_scale
from bench.report.figures.estimate_terms import draw_terms
from bench.report.loading import Run
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, Plotter, Unit, pick_unit

INTRO = ("Per rank of each finished measured run: the estimated peak (membench's estimator and "
         "torchrec's planner, from `estimate` in summary.json) against the measured one. "
         "Shaded: within ±10 % and ±25 % of y = x. Error % as stored in the summary "
         "(estimate − measured) / measured. Then membench's prediction against the measurement category by "
         "category (predicted − measured bytes: mean and range over the ranks), where the term that is off "
         "shows; and, for a workload measured at two or more world sizes (an emulation ladder), the error of "
         "its worst rank against N.")
# (point key, legend name, marker, colour) of each estimator
SERIES = (("membench", "membench estimate", "o", OKABE_ITO[0]), ("torchrec", "torchrec planner", "^", OKABE_ITO[1]))
Point = Dict[str, Any]


def estimate_points(runs: List[Run]) -> List[Point]:
    points = []
    for run in runs:
        est = run.s.estimate
        if run.s.mode == "plan" or not isinstance(est, dict):
            continue
        ours = est.get("per_rank_peak") or []
        theirs = est.get("torchrec_per_rank_peak") or []
        if not ours and not theirs:
            continue
        for rank in run.measured_ranks():
            def pick(values: Any, r: int = rank.rank) -> Any:
                return values[r] if isinstance(values, list) and r < len(values) else None

            point = {"run": run, "rank": rank.rank, "measured": rank.peak_bytes,
                     "membench": pick(ours), "membench_err": pick(est.get("error_pct")),
                     "torchrec": pick(theirs), "torchrec_err": pick(est.get("torchrec_error_pct"))}
            if point["membench"] is not None or point["torchrec"] is not None:
                points.append(point)
    return points


def fmt_err(value: Any) -> str:
    return "—" if value is None else f"{float(value):+.2f}"


def figure_estimate(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(6, "Estimated vs measured peak", INTRO)
    points = estimate_points(runs)
    if not points:
        section.skipped = ("no measured run carries an estimate (`estimate.per_rank_peak` in summary.json is "
                           "empty or null); runs record one once the estimator is enabled for training runs")
        return section
    all_values = [p["measured"] for p in points] + [p[k] for p in points for k, *_ in SERIES if p[k] is not None]
    unit = pick_unit(all_values)
    files, summary_rows = draw(plot, points, all_values, unit)
    section.figures.append(("estimate vs measured", files, table(points, unit, summary_rows)))
    terms = draw_terms(plot, runs)
    if terms is not None:
        section.figures.append(terms)
    scale = draw_scale(plot, points)
    if scale is not None:
        section.figures.append(scale)
    return section


def draw(plot: Plotter, points: List[Point], all_values: List[float], unit: Unit) -> Tuple[List[Path], list]:
    """The scatter; returns its files and the error summary row of each estimator drawn."""
    low, high = min(all_values), max(all_values)
    log = high / max(low, 1) > 20
    fig, ax = plot.plt.subplots(figsize=(7.2, 6.4))
    lo, hi = (low / 1.4, high * 1.4) if log else (0, high * 1.12)
    draw_reference(ax, lo, hi, log, unit)
    summary_rows = []
    for series in SERIES:
        row = draw_series(ax, points, series, unit)
        if row is not None:
            summary_rows.append(row)
    if log:
        set_log_scale(ax)
    style_axes(ax, lo, hi, log, unit, points)
    return plot.save(fig, "fig6_estimate_vs_measured"), summary_rows


def draw_reference(ax, lo: float, hi: float, log: bool, unit: Unit) -> None:
    """y = x and the ±10 % / ±25 % bands around it."""
    import numpy as np

    grid = np.geomspace(max(lo, 1), hi, 200) if log else np.linspace(lo, hi, 200)
    g = grid / unit.scale
    ax.fill_between(g, g * 0.75, g * 1.25, color="#999999", alpha=0.15, lw=0, label="±25 %")
    ax.fill_between(g, g * 0.9, g * 1.1, color="#999999", alpha=0.3, lw=0, label="±10 %")
    ax.plot(g, g, color="#000000", lw=1.0, ls="--", label="y = x")


def draw_series(ax, points: List[Point], series: Tuple[str, str, str, str], unit: Unit) -> Optional[List[Any]]:
    """One estimator's points, ×n where n ranks coincide; returns its error summary row, if it has errors."""
    key, name, marker, color = series
    chosen = [p for p in points if p[key] is not None]
    if not chosen:
        return None
    ax.scatter([unit(p["measured"]) for p in chosen], [unit(p[key]) for p in chosen], marker=marker, s=42,
               color=color, edgecolor="black", linewidth=0.5, label=f"{name} (n={len(chosen)})", zorder=4,
               alpha=0.9)
    counts: Dict[Tuple[int, int], int] = {}
    for p in chosen:
        counts[(p["measured"], p[key])] = counts.get((p["measured"], p[key]), 0) + 1
    for (measured, estimated), count in sorted(counts.items()):
        if count > 1:
            ax.annotate(f"×{count}", (unit(measured), unit(estimated)), xytext=(7, -3),
                        textcoords="offset points", fontsize=8, color=color if key == "membench" else "#8A5A00")
    errors = [abs(float(p[f"{key}_err"])) for p in chosen if p[f"{key}_err"] is not None]
    if not errors:
        return None
    return [name, len(chosen), f"{statistics.fmean(errors):.2f}", f"{max(errors):.2f}",
            sum(1 for e in errors if e <= 10)]


def set_log_scale(ax) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator

    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def style_axes(ax, lo: float, hi: float, log: bool, unit: Unit, points: List[Point]) -> None:
    ax.set_xlim(lo / unit.scale, hi / unit.scale)
    ax.set_ylim(lo / unit.scale, hi / unit.scale)
    ax.set_aspect("equal", adjustable="box")
    scale_note = ", log scale" if log else ""
    ax.set_xlabel(f"measured peak ({unit.name}{scale_note})")
    ax.set_ylabel(f"estimated peak ({unit.name}{scale_note})")
    ax.set_title("Estimated vs measured peak per rank", loc="left")
    if any(v > 1 for v in (sum(1 for q in points if (q["measured"], q["membench"]) == (p["measured"], p["membench"]))
                           for p in points)):
        ax.text(0.98, 0.02, "×n: n ranks at the same point", transform=ax.transAxes, ha="right", va="bottom",
                fontsize=8, color="#555555")
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)


def table(points: List[Point], unit: Unit, summary_rows: List[List[Any]]) -> str:
    rows = [[p["run"].label, p["rank"], unit.fmt(p["measured"]), p["measured"],
             p["membench"] if p["membench"] is not None else "—", fmt_err(p["membench_err"]),
             p["torchrec"] if p["torchrec"] is not None else "—", fmt_err(p["torchrec_err"])] for p in points]
    text = md_table(["run", "rank", f"measured ({unit.name})", "measured (bytes)", "membench estimate (bytes)",
                     "membench error %", "torchrec estimate (bytes)", "torchrec error %"], rows)
    if summary_rows:
        text = md_table(["estimator", "points", "mean abs error %", "max abs error %", "within ±10 %"],
                        summary_rows) + "\n\n" + text
    return text
