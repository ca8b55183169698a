"""Figure 9: train pipelines side by side, in the structure of torchrec's HBM audit (pull request #4067): per
pipeline the peak (allocated, and reserved where a caching allocator counts), what it holds in flight, and its
difference against `base` in units of one batch's KJT (its ids and lengths).

Runs are compared when their configs differ in the pipeline only.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from bench.report.loading import Run, measured_ok_runs
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, Plotter, pick_unit
from bench.results.schema import IN_FLIGHT
from workloads.pipelines import PIPELINES

INTRO = ("The batches a train pipeline holds beyond the one it trains (`pipeline=`; breakdown category "
         "`inputs_in_flight`), in the structure of torchrec's own HBM audit of its pipelines: each pipeline's "
         "peak on its busiest rank, and the difference against `base` in units of one batch's KJT (the rank's "
         "ids and lengths at the mean pooling). Runs are grouped when their configs differ only in the pipeline. "
         "On CPU and the simulated device the difference is exact; on a GPU the distributed KJTs are in "
         "`activations`.")
# config keys that differ between otherwise identical runs (where they were written, the pipeline itself)
IGNORED_PREFIXES = ("pipeline.", "results_dir", "run_id", "hydra.")


def pipeline_of(run: Run) -> str:
    return run.config.get("pipeline.name", "plain")  # runs from before the axis trained the plain loop


def comparable_groups(runs: List[Run]) -> List[List[Run]]:
    """Finished training runs grouped by everything in their config but the pipeline; a group holds two or more
    pipelines, one run each (the latest)."""
    groups: Dict[tuple, Dict[str, Run]] = {}
    for run in measured_ok_runs(runs):
        key = tuple(sorted((k, v) for k, v in run.config.items() if not k.startswith(IGNORED_PREFIXES)))
        groups.setdefault(key, {})[pipeline_of(run)] = run
    order = list(PIPELINES)
    return [sorted(group.values(), key=lambda r: order.index(pipeline_of(r)) if pipeline_of(r) in order else 99)
            for group in groups.values() if len(group) >= 2]


def batch_kjt_bytes(run: Run) -> Optional[int]:
    """One batch's KJT on a rank: ids (int64) at each table's mean pooling and lengths (int32), per sample."""
    import yaml
    from omegaconf import OmegaConf

    from workloads.config import WorkloadConfig
    from workloads.spec import build_spec

    try:
        data = yaml.safe_load((run.dir / "config.yaml").read_text())
        workload = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), data["workload"]))
        spec = build_spec(workload)
    except Exception:
        return None
    batch = workload.batch_size
    return int(round(batch * sum(t.expected_pooling for t in spec.tables) * 8 + batch * len(spec.tables) * 4))


def allocated(rank) -> int:
    """What tensors held at the peak: allocated where a caching allocator counts, else the live-tensor peak."""
    return rank.peak_allocated_bytes or rank.peak_bytes


def busiest(run: Run):
    return max(run.measured_ranks(), key=allocated)


def figure_pipelines(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(9, "Train pipelines: batches in flight", INTRO)
    groups = comparable_groups(runs)
    if not groups:
        section.skipped = ("no two finished runs that differ only in the pipeline (run e.g. `membench run -m "
                           "pipeline=plain,base,sparse_dist`)")
        return section
    for number, group in enumerate(groups, start=1):
        files, table = draw_group(plot, group, number)
        section.figures.append((f"{group[0].s.workload} on {group[0].s.world_size} {group[0].s.device_type} ranks",
                                files, table))
    return section


def draw_group(plot: Plotter, group: List[Run], number: int) -> Tuple[List[Path], str]:
    names = [pipeline_of(run) for run in group]
    ranks = [busiest(run) for run in group]
    kjt = batch_kjt_bytes(group[0])
    base = ranks[names.index("base")] if "base" in names else None
    reserved = [rank.peak_reserved_bytes for rank in ranks]
    unit = pick_unit([allocated(r) for r in ranks] + [v for v in reserved if v])
    fig, (ax, diff_ax) = plot.plt.subplots(1, 2, figsize=(9.6, 3.4), gridspec_kw={"width_ratios": [3, 2]})
    positions = list(range(len(group)))
    width = 0.4 if any(reserved) else 0.7
    in_flight = [rank.breakdown.get(IN_FLIGHT, 0) for rank in ranks]
    rest = [allocated(rank) - held for rank, held in zip(ranks, in_flight)]
    ax.bar(positions, [unit(v) for v in rest], width, color=OKABE_ITO[0], label="peak allocated, rest")
    ax.bar(positions, [unit(v) for v in in_flight], width, bottom=[unit(v) for v in rest], color=OKABE_ITO[1],
           label=IN_FLIGHT)
    if any(reserved):
        ax.bar([p + width for p in positions], [unit(v or 0) for v in reserved], width, color=OKABE_ITO[2],
               label="peak reserved")
    ax.set_xticks([p + (width / 2 if any(reserved) else 0) for p in positions], names, rotation=20)
    ax.set_ylabel(unit.name)
    ax.set_title(f"Peak per pipeline ({group[0].s.workload}, busiest rank)", loc="left")
    ax.legend(fontsize=8, loc="lower right")
    if base is not None and kjt:
        differences = [(allocated(rank) - allocated(base)) / kjt for rank in ranks]
        diff_ax.bar(positions, differences, 0.7, color=[OKABE_ITO[5] if d > 0 else OKABE_ITO[4] for d in differences])
        for position, difference in zip(positions, differences):
            diff_ax.annotate(f"{difference:+.2f}", (position, difference), ha="center",
                             va="bottom" if difference >= 0 else "top", fontsize=8)
        diff_ax.axhline(0, color="#000000", lw=0.8)
        diff_ax.set_xticks(positions, names, rotation=20)
        diff_ax.set_ylabel("peak − base, in batch KJTs")
        diff_ax.set_title("Against base", loc="left")
    else:
        diff_ax.set_axis_off()
        diff_ax.text(0.5, 0.5, "no base run to compare with", ha="center", va="center")
    files = plot.save(fig, f"fig9_pipelines_{number}")
    rows = []
    for name, rank, held in zip(names, ranks, in_flight):
        difference = allocated(rank) - allocated(base) if base is not None else None
        rows.append([name, PIPELINES[name].holds if name in PIPELINES else "?", rank.rank, f"{allocated(rank):,}",
                     f"{held:,}", f"{difference:+,}" if difference is not None else "—",
                     f"{difference / kjt:+.2f}" if difference is not None and kjt else "—",
                     f"{rank.peak_reserved_bytes:,}" if rank.peak_reserved_bytes else "—"])
    table = md_table(["pipeline", "holds beyond the trained batch", "rank", "peak allocated (bytes)",
                      "in flight at peak", "− base", f"− base, in KJTs of {kjt:,} B" if kjt else "− base, KJTs",
                      "peak reserved"], rows)
    return files, table
