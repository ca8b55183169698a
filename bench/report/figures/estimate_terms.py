"""Figure 6, second panel: membench's prediction against the measurement, category by category.

For every measured rank whose run carries `estimate.per_rank_breakdown`, predicted − measured bytes per
breakdown category; the bars show the mean and the whiskers the range over those ranks, so the term that
is off stands out (the categories are the CPU breakdown's; the predictor fills the same ones).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench.report.loading import Run
from bench.report.markdown import md_table
from bench.report.style import OKABE_ITO, Plotter, pick_unit
from bench.results.schema import CATEGORIES


def category_differences(runs: List[Run]) -> Dict[str, List[int]]:
    """Per category, predicted − measured bytes of every measured rank with a predicted breakdown."""
    differences: Dict[str, List[int]] = {}
    for run in runs:
        estimate = run.s.estimate
        if run.s.mode == "plan" or not isinstance(estimate, dict):
            continue
        predicted = estimate.get("per_rank_breakdown") or []
        for rank in run.measured_ranks():
            if rank.rank >= len(predicted) or not predicted[rank.rank]:
                continue
            for category in CATEGORIES:
                guess, measured = int(predicted[rank.rank].get(category, 0)), int(rank.breakdown.get(category, 0))
                if guess or measured:
                    differences.setdefault(category, []).append(guess - measured)
    return differences


def draw_terms(plot: Plotter, runs: List[Run]) -> Optional[Tuple[str, List[Path], str]]:
    """The panel (title, files, table), or None when no run has a predicted breakdown."""
    differences = category_differences(runs)
    if not differences:
        return None
    categories = [c for c in CATEGORIES if c in differences]
    unit = pick_unit([abs(v) for values in differences.values() for v in values] + [1])
    means = [sum(differences[c]) / len(differences[c]) for c in categories]
    lows = [mean - min(differences[c]) for mean, c in zip(means, categories)]
    highs = [max(differences[c]) - mean for mean, c in zip(means, categories)]
    fig, ax = plot.plt.subplots(figsize=(7.2, 0.45 * len(categories) + 1.4))
    positions = list(range(len(categories)))
    ax.barh(positions, [unit(m) for m in means], color=OKABE_ITO[0], edgecolor="black", linewidth=0.5,
            xerr=[[unit(v) for v in lows], [unit(v) for v in highs]], capsize=3)
    ax.axvline(0, color="#000000", lw=0.8)
    ax.set_yticks(positions, categories)
    ax.invert_yaxis()
    ax.set_xlabel(f"predicted − measured ({unit.name}); bar: mean, whiskers: range over ranks")
    ax.set_title("Where the prediction is off, by category", loc="left")
    files = plot.save(fig, "fig6b_estimate_by_category")
    rows = [[c, len(differences[c]), f"{sum(differences[c]) / len(differences[c]):+,.0f}",
             f"{min(differences[c]):+,}", f"{max(differences[c]):+,}"] for c in categories]
    text = md_table(["category", "ranks", "mean predicted − measured (bytes)", "min", "max"], rows)
    return "prediction vs measured by category", files, text
