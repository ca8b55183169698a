"""Figure 10: torchrec's planner under each memory model (`membench planner-check`): per model what became of
its plans at a tight capacity (ran, OOM, failed otherwise, refused), and per workload the capacity left unused
at the highest rank under one model against the other."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from bench.harness.planner_comparison import (RANK_GROUPS, RESULT_FILE, WorkloadComparison, load_comparison,
                                              summarize)
from bench.report.loading import Run, natural_key
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, OOM_FACE, Plotter

INTRO = ("torchrec's EmbeddingShardingPlanner with its own memory model and with membench's "
         "(`membench planner-check`, docs/torchrec-planner.md): every plan the planner did not refuse ran at a "
         "capacity drawn tight around what the workload needs. Left: what became of each model's plans. "
         "Right: per workload where both plans ran, the capacity left unused at the highest measured rank; "
         "points below the diagonal leave less unused than torchrec's default.")
EXAMPLE = "`membench planner-check` (writes planner_comparison.json beside its runs)"
VERDICTS = (("ok", "ran", OKABE_ITO[2]), ("oom", "OOM", OOM_FACE), ("failed", "failed otherwise", "#999999"),
            ("refused", "refused", OKABE_ITO[4]))


def comparison_files(runs: List[Run]) -> List[Path]:
    """The planner_comparison.json beside the loaded runs (planner-check writes its runs next to it)."""
    candidates = {run.dir.parent / RESULT_FILE for run in runs}
    return sorted((path for path in candidates if path.is_file()), key=lambda p: natural_key(str(p)))


def loaded(files: List[Path], notes: List[str]) -> List[Tuple[Path, List[WorkloadComparison]]]:
    out = []
    for path in files:
        try:
            out.append((path, load_comparison(path)))
        except (OSError, ValueError, KeyError, TypeError) as err:
            notes.append(f"{path}: unreadable comparison ({err.__class__.__name__}); skipped")
    return out


def figure_planners(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(10, "torchrec's planner: memory models", INTRO)
    comparisons = loaded(comparison_files(runs), section.notes)
    if not comparisons:
        section.skipped = f"no planner comparison among the runs (make one with {EXAMPLE})"
        return section
    for path, workloads in comparisons:
        models = sorted({name for c in workloads for name in c.outcomes}, key=model_order)
        files = draw(plot, workloads, models, f"fig10_planners_{len(section.figures) + 1}")
        section.figures.append((f"{path.parent.name}: {len(workloads)} workloads", files, table(workloads)))
    return section


def model_order(name: str) -> Tuple[int, str]:
    return (0 if name == "torchrec" else 1, name)


def table(workloads: List[WorkloadComparison]) -> str:
    rows = []
    for label, per_model in summarize(workloads).items():
        for model, s in per_model.items():
            rows.append([label, model, s["workloads"], s["ok"], s["oom"], s["failed"], s["refused"],
                         s["refused_although_fits"], percent(s["unused_median"]), percent(s["unused_mean"])])
    return md_table(["ranks", "memory model", "workloads", "ran ok", "OOM", "failed otherwise", "refused",
                     "refused, a plan fits", "unused at highest rank (median)", "(mean)"], rows)


def percent(fraction) -> str:
    return "" if fraction is None else f"{100 * fraction:.1f} %"


def verdict_counts(workloads: List[WorkloadComparison], model: str) -> Dict[str, int]:
    counts = {key: 0 for key, _, _ in VERDICTS}
    for comparison in workloads:
        verdict = comparison.outcomes[model].verdict
        counts[verdict if verdict in counts else "failed"] += 1
    return counts


def draw(plot: Plotter, workloads: List[WorkloadComparison], models: List[str], stem: str) -> List[Path]:
    fig, (left, right) = plot.plt.subplots(1, 2, figsize=(12.5, 4.6), gridspec_kw={"width_ratios": [1.3, 1]})
    draw_verdicts(left, workloads, models)
    draw_unused(right, workloads, models)
    fig.suptitle("torchrec's planner under each memory model, every plan run at a tight capacity", x=0.01,
                 ha="left")
    fig.tight_layout()
    return plot.save(fig, stem)


def draw_verdicts(ax, workloads: List[WorkloadComparison], models: List[str]) -> None:
    bars = [(f"{model}\n({label})", [c for c in workloads if c.emulated == emulated], model)
            for label, emulated in RANK_GROUPS for model in models
            if any(c.emulated == emulated for c in workloads)]
    for row, (name, chosen, model) in enumerate(bars):
        start = 0
        for key, label, color in VERDICTS:
            count = verdict_counts(chosen, model)[key]
            ax.barh(row, count, left=start, color=color, edgecolor="white", label=label if row == 0 else None)
            if count:
                ax.text(start + count / 2, row, str(count), ha="center", va="center", fontsize=9)
            start += count
    ax.set_yticks(range(len(bars)), [name for name, _, _ in bars])
    ax.invert_yaxis()
    ax.set_xlabel("workloads")
    ax.set_title("what became of the plans", loc="left")
    ax.legend(loc="lower right", frameon=False, fontsize=8)


def draw_unused(ax, workloads: List[WorkloadComparison], models: List[str]) -> None:
    base, others = models[0], models[1:]
    top = 0.0
    for number, other in enumerate(others):
        for label, emulated in RANK_GROUPS:
            points = [(100 * c.outcomes[base].unused_bytes / c.capacity_bytes,
                       100 * c.outcomes[other].unused_bytes / c.capacity_bytes) for c in workloads
                      if c.emulated == emulated and c.outcomes[base].unused_bytes is not None
                      and c.outcomes[other].unused_bytes is not None]
            if points:
                ax.scatter(*zip(*points), s=28, marker="o" if not emulated else "s",
                           color=OKABE_ITO[number], label=f"{other} ({label})", zorder=3)
                top = max(top, *(max(p) for p in points))
    top = top * 1.08 or 1.0
    ax.plot([0, top], [0, top], color="#777777", lw=0.8, ls="--", zorder=1)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel(f"unused at highest rank, {base}'s plan (% of capacity)")
    ax.set_ylabel("the other model's plan (%)")
    ax.set_title("capacity left unused, workloads both ran", loc="left")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", frameon=False, fontsize=8)

