"""Figure 8: the CUDA caching allocator (real or simulated): allocated vs reserved over the steps of one run,
and each run's peak allocated and reserved side by side, labelled by its allocator settings."""
from __future__ import annotations

from pathlib import Path
from typing import List

from bench.report.loading import Run, measured_ok_runs
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, Plotter, Unit, pick_unit
from bench.results.schema import has_cuda_allocator

INTRO = ("What PyTorch's CUDA caching allocator reserves beyond what tensors hold (rounding, split blocks, "
         "cached segments): left, allocated and reserved at each phase end of rank 0 of the first run; right, "
         "the peak allocated and reserved of each run's busiest rank, labelled by its allocator settings "
         "(`allocator.*` / PYTORCH_CUDA_ALLOC_CONF). Simulated devices (`hardware.simulate=true`) model the "
         "allocator; GPU runs measure it.")
SETTINGS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold", "roundup_power2_divisions")


def allocator_runs(runs: List[Run]) -> List[Run]:
    return [run for run in measured_ok_runs(runs)
            if has_cuda_allocator(run.s.device_type) and any(r.peak_reserved_bytes for r in run.measured_ranks())]


def settings_label(run: Run) -> str:
    allocator = run.s.allocator or {}
    parts = [f"{name}={allocator[name]}" for name in SETTINGS if allocator.get(name) not in (None, False)]
    return ", ".join(parts) or "defaults"


def busiest(run: Run):
    return max(run.measured_ranks(), key=lambda r: r.peak_reserved_bytes or 0)


def figure_allocator(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(8, "Allocated vs reserved (CUDA caching allocator)", INTRO)
    chosen = allocator_runs(runs)
    if not chosen:
        section.skipped = ("no finished CUDA or simulated-CUDA run with reserved memory (run e.g. `membench run "
                           "hardware=h100_80g hardware.simulate=true`)")
        return section
    peaks = [v for run in chosen for r in run.measured_ranks() for v in (r.peak_allocated_bytes, r.peak_reserved_bytes)]
    unit = pick_unit(peaks)
    files = draw(plot, chosen, unit)
    rows = []
    for run in chosen:
        rank = busiest(run)
        allocated, reserved = rank.peak_allocated_bytes, rank.peak_reserved_bytes or 0
        fragmentation = (rank.allocator or {}).get("peak_inactive_split_bytes")
        rows.append([run.label, settings_label(run), rank.rank, unit.fmt(allocated), unit.fmt(reserved),
                     f"{reserved / allocated:.3f}" if allocated else "—",
                     unit.fmt(fragmentation) if fragmentation is not None else "—",
                     (rank.allocator or {}).get("num_alloc_retries", "—")])
    table = md_table(["run", "allocator settings", "rank", f"peak allocated ({unit.name})",
                      f"peak reserved ({unit.name})", "reserved / allocated",
                      f"inactive split at peak ({unit.name})", "alloc retries"], rows)
    section.figures.append(("allocated vs reserved", files, table))
    return section


def draw(plot: Plotter, runs: List[Run], unit: Unit) -> List[Path]:
    fig, (left, right) = plot.plt.subplots(1, 2, figsize=(12.5, 4.6))
    timeline = runs[0].timelines().get(0)
    if timeline is not None and "reserved_bytes" in timeline:
        x = range(len(timeline))
        left.plot(x, [unit(v) for v in timeline["phase_peak_bytes"]], color=OKABE_ITO[0], label="allocated (phase peak)")
        left.plot(x, [unit(v) for v in timeline["reserved_bytes"].fillna(0)], color=OKABE_ITO[1], label="reserved")
        left.set_xlabel("phase (in order)")
        left.legend(loc="lower right")
    left.set_title(f"{runs[0].label}: rank 0")
    left.set_ylabel(unit.name)
    labels = [run.label if settings_label(run) in run.label else f"{run.label}\n{settings_label(run)}" for run in runs]
    positions = range(len(runs))
    right.bar([p - 0.2 for p in positions], [unit(busiest(r).peak_allocated_bytes) for r in runs], width=0.4,
              color=OKABE_ITO[0], label="peak allocated")
    right.bar([p + 0.2 for p in positions], [unit(busiest(r).peak_reserved_bytes or 0) for r in runs], width=0.4,
              color=OKABE_ITO[1], label="peak reserved")
    right.set_xticks(list(positions))
    right.set_xticklabels(labels, fontsize=7.5, rotation=20, ha="right")
    right.set_ylabel(unit.name)
    right.set_title("per run (busiest rank)")
    right.legend(loc="upper left")
    return plot.save(fig, "fig8_allocator")
