"""Figure 6, third panel: the prediction's error against the world size (the emulation ladder).

For every workload (and model backend) measured at two or more world sizes (real runs, or emulated ranks of N-rank jobs:
`membench run -m workload=tiny emulate.world_size=2,8,64,256,1024 emulate.rank=auto`), the error of each
estimator at each N: the measured rank whose |error| is largest (an emulated run measures one rank, the
one `emulate.rank` named). A flat line near 0 is a prediction that holds as the job grows.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench.report.loading import natural_key
from bench.report.markdown import md_table
from bench.report.style import OKABE_ITO, Plotter

# (point key, legend name, line style) of each estimator; the colour tells the job (workload, backend)
ESTIMATORS = (("membench", "membench", "-"), ("torchrec", "torchrec planner", "--"))
MARKERS = "osD^v<>p"


def worst_errors(points: List[Dict[str, Any]]) -> Dict[Tuple[str, str], Dict[int, Tuple[float, int, int]]]:
    """Per (job, estimator): world size -> (signed error % of the worst rank, that rank, ranks seen); a job is
    the workload and the model backend ("tiny, native")."""
    ladder: Dict[Tuple[str, str], Dict[int, Tuple[float, int, int]]] = {}
    for point in points:
        summary = point["run"].s
        for key, *_ in ESTIMATORS:
            error = point[f"{key}_err"]
            if error is None:
                continue
            by_size = ladder.setdefault((f"{summary.workload}, {summary.model_backend}", key), {})
            worst, rank, seen = by_size.get(summary.world_size, (0.0, point["rank"], 0))
            if seen == 0 or abs(float(error)) > abs(worst):
                worst, rank = float(error), point["rank"]
            by_size[summary.world_size] = (worst, rank, seen + 1)
    return {key: sizes for key, sizes in ladder.items() if len(sizes) >= 2}


def draw_scale(plot: Plotter, points: List[Dict[str, Any]]) -> Optional[Tuple[str, List[Path], str]]:
    """The panel (title, files, table), or None when no workload was measured at two world sizes."""
    ladder = worst_errors(points)
    if not ladder:
        return None
    jobs = sorted({job for job, _ in ladder}, key=natural_key)
    # one axes per estimator: torchrec's planner is tens of % off where membench's is tenths
    fig, axes = plot.plt.subplots(1, len(ESTIMATORS), figsize=(11.0, 4.4))
    rows: List[List[Any]] = []
    sizes_seen = sorted({n for by_size in ladder.values() for n in by_size})
    for ax, (key, name, style) in zip(axes, ESTIMATORS):
        for index, job in enumerate(jobs):
            sizes = ladder.get((job, key))
            if not sizes:
                continue
            ns = sorted(sizes)
            ax.plot(ns, [sizes[n][0] for n in ns], ls=style, marker=MARKERS[index % len(MARKERS)],
                    color=OKABE_ITO[index % len(OKABE_ITO)], markeredgecolor="black", markeredgewidth=0.5,
                    label=job)
            rows.extend([job, name, n, sizes[n][1], sizes[n][2], f"{sizes[n][0]:+.2f}"] for n in ns)
        ax.axhline(0, color="#000000", lw=0.8)
        ax.axhspan(-1, 1, color="#999999", alpha=0.25, lw=0, label="±1 %")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes_seen, [str(n) for n in sizes_seen])
        ax.set_xlabel("world size N (log scale)")
        ax.set_title(name, loc="left")
        ax.legend(loc="best", frameon=False, fontsize="small")
    axes[0].set_ylabel("(estimate − measured) / measured, % (worst rank)")
    fig.suptitle("Prediction error against the world size", x=0.01, ha="left")
    files = plot.save(fig, "fig6c_estimate_vs_world_size")
    text = md_table(["workload, backend", "estimator", "world size", "worst rank", "ranks measured", "error %"], rows)
    return "prediction error against the world size", files, text
