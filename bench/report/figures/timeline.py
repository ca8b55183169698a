"""Figure 1: memory in use per rank over the run, for a few representative runs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bench.report.loading import Run, natural_key, oom_in_use
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, OOM_FACE, PHASE_COLORS, Plotter, Unit, at, pct, pick_unit

PHASES = ("build", "input", "forward", "backward", "optimizer")
INTRO = ("Memory in use on each rank over the run, one slot per recorded phase (build, then "
         "input / forward / backward / optimizer of every step). The thick line is the highest "
         "memory in use during the phase, the dashed one what is still live when it ends; the "
         "star marks the run's reported peak (measured steps, after warm-up).")


@dataclass(frozen=True)
class Scale:
    """The y axis every panel of one run shares."""
    unit: Unit
    data_top: float
    capacity_on_scale: bool


@dataclass
class Drawn:
    """Marks some panel drew: the legend and the x label mention only those."""
    star: bool = False
    warmup: bool = False
    request: bool = False


def oom_depth(run: Run) -> Tuple[int, int, float]:
    """How far an OOM run got (step, phase), then how full its fullest rank was: the deepest failure shows most."""
    events = [x.oom for x in run.s.per_rank if x.oom]
    step, phase = max(((e.get("step", -1), PHASES.index(e["phase"]) if e.get("phase") in PHASES else -1)
                       for e in events), default=(-1, -1))
    return step, phase, max(x.peak_bytes / x.capacity_bytes if x.capacity_bytes else 0 for x in run.s.per_rank)


def representative_runs(runs: List[Run]) -> List[Tuple[Run, str]]:
    """Up to three runs worth a timeline: the busiest ok run, the most imbalanced one, one OOM run."""
    candidates = [r for r in runs if r.s.mode != "plan" and r.s.per_rank and
                  any(r.dir.glob("timeline_rank*.csv"))]
    picks: List[Tuple[Run, str]] = []
    ok = [r for r in candidates if r.s.status == "ok" and r.measured_ranks()]
    if ok:
        busiest = max(ok, key=lambda r: (max(x.utilization for x in r.measured_ranks()), natural_key(str(r.dir))))
        picks.append((busiest, "highest utilization"))
        imbalanced = max(ok, key=lambda r: r.s.job.imbalance)
        if imbalanced is not busiest and imbalanced.s.job.imbalance > 1.01:
            picks.append((imbalanced, f"most imbalanced, {imbalanced.s.job.imbalance:.3f}"))
    ooms = [r for r in candidates if r.s.status == "oom"]
    if ooms:
        picks.append((max(ooms, key=oom_depth), "out of memory"))
    if not picks and candidates:
        picks.append((candidates[0], "first run"))
    return picks[:3]


def shown_ranks(run: Run, available: Sequence[int], limit: int = 4) -> List[int]:
    if len(available) <= limit:
        return list(available)
    by_rank = {r.rank: r for r in run.s.per_rank}
    chosen = [r for r in run.s.oom_ranks[:1] if r in available]
    ordered = sorted(available, key=lambda k: -(by_rank[k].peak_bytes if k in by_rank else 0))
    for rank in [ordered[0], ordered[-1], *ordered[1:]]:
        if rank not in chosen:
            chosen.append(rank)
        if len(chosen) == limit:
            break
    return sorted(chosen)


def figure_timeline(plot: Plotter, runs: List[Run]) -> Section:
    section = Section(1, "Memory timeline per rank", INTRO)
    picks = representative_runs(runs)
    if not picks:
        section.skipped = "no run has a timeline_rank<R>.csv (runs with `record.timeline=false` or plan runs only)"
        return section
    for index, (run, reason) in enumerate(picks, start=1):
        frames = run.timelines()
        ranks = shown_ranks(run, sorted(frames))
        if not ranks:
            section.notes.append(f"{run.label}: timeline files unreadable; skipped")
            continue
        section.figures.append(run_figure(plot, run, reason, index, frames, ranks))
    return section


def run_scale(run: Run, frames: Dict[int, Any], ranks: List[int]) -> Scale:
    by_rank = {r.rank: r for r in run.s.per_rank}
    values: List[float] = []
    for rank in ranks:
        frame = frames[rank]
        values += list(frame["phase_peak_bytes"].dropna()) + list(frame["in_use_bytes"].dropna())
        if "reserved_bytes" in frame:
            values += list(frame["reserved_bytes"].dropna())
    data_top = max(values, default=0)
    capacities = [by_rank[k].capacity_bytes for k in ranks if k in by_rank]
    # a capacity far above the data would flatten the lines, unless the run hit it
    capacity_on_scale = bool(capacities) and (max(capacities) <= 2.5 * data_top or run.s.status == "oom")
    unit = pick_unit(values + (capacities if capacity_on_scale else []))
    return Scale(unit, data_top, capacity_on_scale)


def run_figure(plot: Plotter, run: Run, reason: str, index: int, frames: Dict[int, Any],
               ranks: List[int]) -> Tuple[str, List[Path], str]:
    by_rank = {r.rank: r for r in run.s.per_rank}
    warmup = run.config.get("workload.warmup_steps")
    scale = run_scale(run, frames, ranks)
    fig, axes = plot.plt.subplots(len(ranks), 1, figsize=(10.5, 1.0 + 2.6 * len(ranks)), sharex=True,
                                  squeeze=False)
    drawn = Drawn()
    table_rows = []
    for ax, rank in zip(axes[:, 0], ranks):
        result = by_rank.get(rank)
        slots = draw_rank(ax, rank, frames[rank].reset_index(drop=True), result, warmup, scale, drawn)
        if result is not None:
            table_rows.append(table_row(rank, result, scale.unit, slots))
    axes[-1, 0].set_xlabel("step (each step: input | forward | backward | optimizer)"
                           + ("; dotted line: end of warm-up" if drawn.warmup else ""))
    handles = legend_handles(frames, ranks, scale, drawn, run.s.status == "oom")
    fig.suptitle(f"Memory timeline: {run.label} ({reason})", x=0.01, ha="left")
    shown = ("" if len(ranks) == len(run.s.per_rank)
             else f"; ranks {', '.join(map(str, ranks))} of {len(run.s.per_rank)}")
    fig.tight_layout(rect=(0, 0.07 if len(ranks) > 1 else 0.12, 1, 1))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    files = plot.save(fig, f"fig1_timeline_{index}")
    unit = scale.unit
    table = md_table(["rank", "status", f"peak ({unit.name})", "peak (bytes)", "peak at", "capacity (bytes)",
                      "utilization %", "build peak (bytes)", "warm-up peak (bytes)", "timeline rows"],
                     table_rows)
    return f"{run.label}: {reason} (`{run.dir}`{shown})", files, table


def table_row(rank: int, result, unit: Unit, slots: int) -> List[Any]:
    return [rank, result.status, unit.fmt(result.peak_bytes), result.peak_bytes,
            at(result.peak_step, result.peak_phase), result.capacity_bytes, pct(result.utilization),
            result.build_peak_bytes, result.warmup_peak_bytes, slots]


def draw_rank(ax, rank: int, frame, result, warmup: Any, scale: Scale, drawn: Drawn) -> int:
    """One rank's panel; returns its number of phase slots."""
    slots = len(frame)
    steps = list(frame["step"])
    draw_phases(ax, frame, scale.unit)
    drawn.warmup |= draw_warmup(ax, steps, warmup)
    set_height(ax, result, scale)
    live = None
    if result is not None and result.status == "ok":
        drawn.star |= draw_peak(ax, frame, steps, result, scale.unit)
    if result is not None and result.oom:
        live = oom_live(frame, result)
        drawn.request |= draw_oom(ax, slots, live, result.oom, scale.unit)
    ax.set_title(rank_title(rank, result, live, scale), fontsize=10, loc="left")
    ax.set_ylabel(f"memory ({scale.unit.name})")
    ax.set_xlim(0, slots)
    set_step_ticks(ax, steps)
    ax.grid(axis="x", alpha=0.0)
    return slots


def draw_phases(ax, frame, unit: Unit) -> None:
    n = len(frame)
    for i, phase in enumerate(frame["phase"]):
        ax.axvspan(i, i + 1, color=PHASE_COLORS.get(str(phase), "#FFFFFF"), alpha=0.22, lw=0)
    peak_y = [unit(v) for v in frame["phase_peak_bytes"]]
    ax.hlines(peak_y, range(n), range(1, n + 1), color=OKABE_ITO[0], lw=2.4, zorder=3)
    ax.vlines(range(1, n), peak_y[:-1], peak_y[1:], color=OKABE_ITO[0], lw=1.0, zorder=3)
    ax.plot([i + 1 for i in range(n)], [unit(v) for v in frame["in_use_bytes"]], ls="--", marker=".",
            ms=4, lw=1.2, color=OKABE_ITO[5], zorder=4)
    if "reserved_bytes" in frame and frame["reserved_bytes"].notna().any():
        ax.plot([i + 1 for i in range(n)], [unit(v) for v in frame["reserved_bytes"]], lw=1.2,
                color=OKABE_ITO[2], zorder=3)


def draw_warmup(ax, steps: List[int], warmup: Any) -> bool:
    """The steady-state boundary: the first slot of the first measured step."""
    if warmup is None:
        return False
    starts = [i for i, s in enumerate(steps) if s >= int(warmup)]
    if starts and starts[0] > 0:
        ax.axvline(starts[0], color="#444444", lw=1.0, ls=":", zorder=2)
        return True
    return False


def set_height(ax, result, scale: Scale) -> None:
    top = scale.data_top
    if result is not None and scale.capacity_on_scale:
        ax.axhline(scale.unit(result.capacity_bytes), color="#000000", ls="-.", lw=1.3, zorder=2)
        top = max(top, result.capacity_bytes)
    if result is not None and result.oom and result.oom.get("requested_bytes"):
        # room for the failed request above what was in use, up to twice the capacity
        wanted = oom_in_use(result) + result.oom["requested_bytes"]
        top = max(top, min(wanted, 2 * result.capacity_bytes))
    ax.set_ylim(0, scale.unit(top) * 1.18 if top else 1)


def draw_peak(ax, frame, steps: List[int], result, unit: Unit) -> bool:
    hits = [i for i in range(len(frame)) if steps[i] == result.peak_step and
            str(frame["phase"][i]) == result.peak_phase]
    if not hits:
        return False
    x = hits[-1] + 0.5
    y = unit(result.peak_bytes)
    ax.plot([x], [y], marker="*", ms=13, color="#000000", zorder=6, mec="white", mew=0.6)
    right = x > len(frame) * 0.6
    ax.annotate(f"peak {unit.fmt(result.peak_bytes)} {unit.name}", (x, y),
                xytext=(-10 if right else 10, 6), textcoords="offset points",
                ha="right" if right else "left", va="bottom", fontsize=9,
                bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.85), zorder=7)
    return True


def oom_live(frame, result) -> float:
    """Bytes in use at the failure; without stats from the failing step the last recorded phase peak."""
    event = result.oom
    stats = event.get("stats") or {}
    if stats or result.peak_step == event.get("step"):
        return oom_in_use(result)
    return frame["phase_peak_bytes"].iloc[-1]


def draw_oom(ax, slots: int, live: float, event: Dict[str, Any], unit: Unit) -> bool:
    """The failure mark, and an arrow for the failed request when its size is known."""
    ax.plot([slots - 0.5], [unit(live)], marker="X", ms=11, color=OOM_FACE, mec="black", mew=0.6, zorder=6)
    if not event.get("requested_bytes"):
        return False
    tip = min(unit(live + event["requested_bytes"]), ax.get_ylim()[1] * 0.97)
    ax.annotate("", xy=(slots - 0.5, tip), xytext=(slots - 0.5, unit(live)), zorder=5,
                arrowprops=dict(arrowstyle="-|>", color=OOM_FACE, lw=1.8, shrinkA=6, shrinkB=0))
    return True


def rank_title(rank: int, result, live: Optional[float], scale: Scale) -> str:
    unit = scale.unit
    if result is not None and result.oom:
        event = result.oom
        requested = event.get("requested_bytes")
        return (f"rank {rank}: OOM at {at(event.get('step', -1), event.get('phase', ''))}, "
                f"{unit.fmt(live)} {unit.name} in use"
                + (f" + {unit.fmt(requested)} {unit.name} requested" if requested else "")
                + f" > capacity {unit.fmt(result.capacity_bytes)} {unit.name}")
    if result is None:
        return f"rank {rank}"
    title = (f"rank {rank} ({result.status}): peak {unit.fmt(result.peak_bytes)} {unit.name}, "
             f"capacity {unit.fmt(result.capacity_bytes)} {unit.name}, "
             f"utilization {pct(result.utilization, 2)} %")
    if not scale.capacity_on_scale:
        title += " (capacity line off scale)"
    return title


def set_step_ticks(ax, steps: List[int]) -> None:
    """One tick at the first slot of each step, thinned to at most about 25."""
    tick_at, tick_label = [], []
    previous = None
    for i, s in enumerate(steps):
        if s != previous:
            tick_at.append(i)
            tick_label.append("build" if s < 0 else str(s))
            previous = s
    stride = max(1, math.ceil(len(tick_at) / 25))
    ax.set_xticks(tick_at[::stride], tick_label[::stride])


def legend_handles(frames: Dict[int, Any], ranks: List[int], scale: Scale, drawn: Drawn, oom_run: bool) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    present = [p for p in PHASES if any(str(x) == p for k in ranks for x in frames[k]["phase"])]
    handles = [Line2D([], [], color=OKABE_ITO[0], lw=2.4, label="peak within phase"),
               Line2D([], [], color=OKABE_ITO[5], lw=1.2, ls="--", marker=".", label="in use at phase end")]
    if any("reserved_bytes" in frames[k] and frames[k]["reserved_bytes"].notna().any() for k in ranks):
        handles.append(Line2D([], [], color=OKABE_ITO[2], lw=1.2, label="reserved (allocator)"))
    if scale.capacity_on_scale:
        handles.append(Line2D([], [], color="#000000", ls="-.", lw=1.3, label="capacity"))
    if drawn.star:
        handles.append(Line2D([], [], color="#000000", marker="*", ls="", ms=11, label="reported peak"))
    if oom_run:
        handles.append(Line2D([], [], color=OOM_FACE, marker="X", ls="", ms=9, mec="black", label="OOM"))
    if drawn.request:
        handles.append(Line2D([], [], color=OOM_FACE, lw=1.8, marker="^", ms=6, label="failed request"))
    return handles + [Patch(color=PHASE_COLORS[p], alpha=0.45, label=p) for p in present]
