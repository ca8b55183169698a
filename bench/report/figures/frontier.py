"""Figure 5: the OOM frontier of each sweep over two or more overrides, a heatmap of busiest-rank
utilization with the points that ran out of memory marked."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from bench.report.loading import Run, Sweep, hashable, natural_key, oom_in_use, parse_overrides
from bench.report.markdown import Section, md_table
from bench.report.style import OOM_FACE, STATUS_TEXT_COLOR, Plotter, at, fmt_value, pct

INTRO = ("For each sweep over two or more overrides: the utilization of the busiest rank "
         "(peak / capacity) at every point; cells that ran out of memory are hatched and give "
         "where it failed and a lower bound of what the failing rank needed "
         "(live + requested bytes at the failure, as % of capacity).")
EXAMPLE = "`membench run -m workload.batch_size=512,4096 workload.rows=10000,200000`"
OOM_CELL = "#F4D6C6"
OTHER_CELL = "#EEEEEE"

Points = Dict[str, Dict[str, Any]]  # point dir name -> {"run", "value" (key -> value), "status"}


@dataclass(frozen=True)
class Grid:
    """The axes of one sweep's heatmaps: y and x keys with their values, one panel per facet combination."""
    x_key: str
    y_key: str
    facet_keys: List[str]
    xs: List[Any]
    ys: List[Any]


def sort_axis(values: List[Any]) -> List[Any]:
    try:
        return sorted(values, key=lambda v: float(v))
    except (TypeError, ValueError):
        return values


def oom_need(run: Run) -> Optional[float]:
    """Lower bound of the memory the failing rank needed (in use at failure + requested) / capacity."""
    for rank in run.s.per_rank:
        event = rank.oom or {}
        requested = event.get("requested_bytes")
        if requested and rank.capacity_bytes:
            return (oom_in_use(rank) + requested) / rank.capacity_bytes
    return None


def oom_where(run: Run) -> str:
    for rank in run.s.per_rank:
        if rank.oom:
            return f"r{rank.rank} {at(rank.oom.get('step', -1), rank.oom.get('phase', ''))}"
    return ""


def fixed_overrides(sweep: Sweep) -> str:
    """The overrides every point of the sweep shares (its context), e.g. "workload=tiny sharding=table_wise"."""
    parsed = [parse_overrides(p.get("overrides") or []) for p in sweep.points.values()]
    if not parsed:
        return ""
    shared = [f"{k}={v}" for k, v in parsed[0].items() if k not in sweep.varying and all(o.get(k) == v for o in parsed)]
    return " ".join(shared)


def cell_patch(rectangle, x: int, y: int, face: str, hatch_color: str, hatch: str):
    """A hatched heatmap cell with a white border like the others (hatchcolor: matplotlib >= 3.10)."""
    try:
        return rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor="white", hatch=hatch,
                         hatchcolor=hatch_color, lw=2, zorder=2)
    except AttributeError:
        return rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=face, edgecolor=hatch_color, hatch=hatch, lw=0,
                         zorder=2)


def skip_reason(sweeps: List[Sweep]) -> str:
    if sweeps:
        return ("no sweep varies two overrides (found "
                + "; ".join(f"{s.sweep_id}: {', '.join(s.varying) or 'nothing'} varies" for s in sweeps)
                + f"); run e.g. {EXAMPLE}")
    return f"no sweep directory (sweep.json) among the inputs; run e.g. {EXAMPLE}"


def figure_frontier(plot: Plotter, runs: List[Run], sweeps: List[Sweep], max_panels: int = 6) -> Section:
    section = Section(5, "OOM frontier", INTRO)
    usable = [s for s in sweeps if len(s.varying) >= 2]
    if not usable:
        section.skipped = skip_reason(sweeps)
        return section
    cmap = plot.plt.get_cmap("viridis")
    for index, sweep in enumerate(usable, start=1):
        section.figures.append(sweep_figure(plot, cmap, runs, sweep, index, max_panels, section.notes))
    one_d = [s for s in sweeps if len(s.varying) < 2]
    if one_d:
        section.notes.append("not a 2-D sweep, no frontier: " + ", ".join(s.sweep_id for s in one_d))
    return section


def sweep_points(sweep: Sweep, runs: List[Run]) -> Points:
    """Every point of the sweep, run or not: the index may list points whose summary is missing."""
    members = {r.dir.name: r for r in runs if r.sweep is sweep}
    points: Points = {}
    for name in sorted(set(members) | set(sweep.points), key=natural_key):
        run = members.get(name)
        overrides = parse_overrides((sweep.points.get(name) or {}).get("overrides") or [])
        value = (lambda k, r=run, o=overrides: o.get(k) if k in o else (r.value(k) if r else None))
        points[name] = {"run": run, "value": value, "status": run.s.status if run else
                        (sweep.points.get(name) or {}).get("status", "missing")}
    return points


def axis_values(points: Points, key: str) -> List[Any]:
    seen: List[Any] = []
    for p in points.values():
        v = p["value"](key)
        if v is not None and hashable(v) not in [hashable(s) for s in seen]:
            seen.append(v)
    return sort_axis(seen)


def facet_combos(points: Points, facet_keys: List[str]) -> List[Tuple[Any, ...]]:
    facets: List[Tuple[Any, ...]] = []
    for p in points.values():
        combo = tuple(hashable(p["value"](k)) for k in facet_keys)
        if combo not in facets:
            facets.append(combo)
    return facets


def sweep_figure(plot: Plotter, cmap, runs: List[Run], sweep: Sweep, index: int, max_panels: int,
                 notes: List[str]) -> Tuple[str, List[Path], str]:
    points = sweep_points(sweep, runs)
    x_key, y_key, facet_keys = sweep.varying[1], sweep.varying[0], sweep.varying[2:]
    grid = Grid(x_key, y_key, facet_keys, axis_values(points, x_key), axis_values(points, y_key))
    facets = facet_combos(points, facet_keys)
    if len(facets) > max_panels:
        notes.append(f"{sweep.sweep_id}: {len(facets)} combinations of {', '.join(facet_keys)}; "
                     f"the first {max_panels} shown")
        facets = facets[:max_panels]
    ncols = min(len(facets), 3)
    nrows = math.ceil(len(facets) / ncols)
    cell_w = max(1.25, min(1.9, 9.0 / max(len(grid.xs), 1)))
    fig, axes = plot.plt.subplots(nrows, ncols, figsize=(max(5.0, cell_w * len(grid.xs) * ncols + 2.6),
                                                         1.0 * len(grid.ys) * nrows + 1.9 + 0.5 * nrows),
                                  squeeze=False)
    grid_tables, point_rows, statuses = [], [], set()
    image = None
    for f_index, combo in enumerate(facets):
        ax = axes[f_index // ncols, f_index % ncols]
        image, facet_text, table = draw_facet(ax, cmap, points, combo, grid, point_rows, statuses)
        grid_tables.append((facet_text, table))
    for f_index in range(len(facets), nrows * ncols):
        axes[f_index // ncols, f_index % ncols].set_visible(False)
    finish_figure(fig, image, sweep, grid, statuses)
    files = plot.save(fig, f"fig5_oom_frontier_{index}")
    tables = "\n\n".join((f"*{facet}*\n\n" if facet else "") + table for facet, table in grid_tables)
    tables += "\n\n" + md_table(["point", *facet_keys, y_key, x_key, "status", "busiest peak (bytes)",
                                 "capacity (bytes)", "busiest utilization %"], point_rows)
    return f"sweep `{sweep.sweep_id}` (`{sweep.dir}`)", files, tables


def facet_cells(points: Points, combo: Tuple[Any, ...], grid: Grid):
    """The panel's cells by (y index, x index), and the busiest-rank utilization of each finished one."""
    import numpy as np

    utilization = np.full((len(grid.ys), len(grid.xs)), np.nan)
    cells: Dict[Tuple[int, int], Dict[str, Any]] = {}
    for name, p in points.items():
        if tuple(hashable(p["value"](k)) for k in grid.facet_keys) != combo:
            continue
        xv, yv = p["value"](grid.x_key), p["value"](grid.y_key)
        if xv is None or yv is None:
            continue
        i = [hashable(v) for v in grid.ys].index(hashable(yv))
        j = [hashable(v) for v in grid.xs].index(hashable(xv))
        cells[(i, j)] = {**p, "name": name}
        run = p["run"]
        if run is not None and run.s.status == "ok" and run.measured_ranks():
            utilization[i, j] = max(x.utilization for x in run.measured_ranks())
    return utilization, cells


def draw_facet(ax, cmap, points: Points, combo: Tuple[Any, ...], grid: Grid, point_rows: List[List[Any]],
               statuses: set):
    """One panel; returns its image (for the colour bar), its title and its table, and adds to point_rows."""
    import numpy as np

    utilization, cells = facet_cells(points, combo, grid)
    image = ax.imshow(np.ma.masked_invalid(utilization * 100), cmap=cmap, vmin=0, vmax=100, aspect="auto",
                      origin="lower")
    grid_rows = []
    for i, yv in enumerate(grid.ys):
        grid_row = [fmt_value(yv)]
        for j in range(len(grid.xs)):
            cell = cells.get((i, j))
            if cell is None:
                ax.text(j, i, "—", ha="center", va="center", color=STATUS_TEXT_COLOR, fontsize=9)
                grid_row.append("—")
                continue
            statuses.add(cell["status"])
            grid_row.append(draw_cell(ax, i, j, cell, utilization[i, j]))
            point_rows.append(point_row(cell, grid, utilization[i, j]))
        grid_rows.append(grid_row)
    facet_text = style_facet(ax, grid, combo)
    table = md_table([f"{grid.y_key} \\ {grid.x_key}", *[fmt_value(v) for v in grid.xs]], grid_rows)
    return image, facet_text, table


def draw_cell(ax, i: int, j: int, cell: Dict[str, Any], value: float) -> str:
    """The cell's text (and hatch unless it finished); returns its entry in the grid table."""
    from matplotlib.patches import Rectangle

    run, status = cell["run"], cell["status"]
    if status == "ok" and not math.isnan(value):
        ax.text(j, i, f"{value * 100:.1f}%", ha="center", va="center", fontsize=9.5,
                color="white" if value < 0.6 else "black", fontweight="bold")
        return f"{pct(value)} %"
    if status == "oom":
        ax.add_patch(cell_patch(Rectangle, j, i, OOM_CELL, OOM_FACE, "///"))
        need = oom_need(run) if run else None
        where_ = oom_where(run) if run else ""
        text = "OOM" + (f"\n{where_}" if where_ else "") + (f"\nneeds ≥{need * 100:.1f}%" if need else "")
        ax.text(j, i, text, ha="center", va="center", fontsize=8, color="black", zorder=3,
                bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.85))
        return "OOM" + (f" ({where_}; needs ≥ {pct(need)} %)" if need else "")
    ax.add_patch(cell_patch(Rectangle, j, i, OTHER_CELL, "#999999", ".."))
    ax.text(j, i, status, ha="center", va="center", fontsize=9, zorder=3)
    return status


def point_row(cell: Dict[str, Any], grid: Grid, value: float) -> List[Any]:
    run, status = cell["run"], cell["status"]
    peak = max((x.peak_bytes for x in run.measured_ranks()), default=None) if run else None
    cap = run.s.per_rank[0].capacity_bytes if run and run.s.per_rank else None
    measured = status == "ok" and not math.isnan(value)
    return [cell["name"], *[fmt_value(cell["value"](k)) for k in grid.facet_keys],
            fmt_value(cell["value"](grid.y_key)), fmt_value(cell["value"](grid.x_key)), status,
            peak if status == "ok" else "—", cap if cap is not None else "—",
            pct(value) if measured else "—"]


def style_facet(ax, grid: Grid, combo: Tuple[Any, ...]) -> str:
    """Ticks, labels and white cell borders of one panel; returns its title (the facet's values)."""
    import numpy as np

    ax.set_xticks(range(len(grid.xs)), [fmt_value(v) for v in grid.xs])
    ax.set_yticks(range(len(grid.ys)), [fmt_value(v) for v in grid.ys])
    ax.set_xlabel(grid.x_key)
    ax.set_ylabel(grid.y_key)
    ax.grid(False)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xticks(np.arange(-0.5, len(grid.xs), 1), minor=True)
    ax.set_yticks(np.arange(-0.5, len(grid.ys), 1), minor=True)
    ax.grid(which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    facet_text = ", ".join(f"{k}={fmt_value(v)}" for k, v in zip(grid.facet_keys, combo))
    if facet_text:
        ax.set_title(facet_text, fontsize=10, loc="left")
    return facet_text


def finish_figure(fig, image, sweep: Sweep, grid: Grid, statuses: set) -> None:
    from matplotlib.patches import Patch

    fixed = fixed_overrides(sweep)
    fig.suptitle(f"OOM frontier: {sweep.sweep_id}\nbusiest-rank utilization (%) over {grid.y_key} × {grid.x_key}"
                 + (f"\nfixed: {fixed}" if fixed else ""), x=0.01, ha="left", fontsize=12)
    fig.tight_layout(rect=(0, 0.1, 0.88, 1))
    cax = fig.add_axes((0.9, 0.2, 0.022, 0.65))
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("peak / capacity of the busiest rank (%)")
    handles = []
    if "oom" in statuses:
        handles.append(Patch(facecolor=OOM_CELL, edgecolor=OOM_FACE, hatch="///", label="out of memory"))
    if statuses - {"ok", "oom"}:
        handles.append(Patch(facecolor=OTHER_CELL, edgecolor="#999999", hatch="..",
                             label="/".join(sorted(statuses - {"ok", "oom"}))))
    if handles:
        fig.legend(handles=handles, loc="lower left", ncol=2, frameon=False, bbox_to_anchor=(0.01, 0.0))
