"""Figure 11: UVM-cached tables against the cache ratio (`membench provision ... plan.caching_ratios=[...]`): per
workload and hardware, the GPUs each cache ratio needs and the utilization of its largest rank there, beside the
GPUs the same workload needs with every table in HBM (a provision report without cache ratios)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Sequence, Tuple

from bench.report.loading import natural_key
from bench.report.markdown import Section, md_table
from bench.report.style import OKABE_ITO, Plotter

RESULT_FILE = "provision.json"
INTRO = ("Terabyte tables in host memory with an HBM cache (fused_uvm_caching), planned at each cache ratio "
         "(`membench provision`, docs/plan.md#provisioning): left, the smallest world size that fits with the "
         "headroom, with the count all in HBM dashed; right, the planned utilization of the largest rank there. "
         "A marker says which limit the next smaller world size ran into: filled circle HBM, open circle host "
         "memory, square none (one node fits).")
EXAMPLE = ("`membench provision workload=tb_10 hardware=h100_80g sharding.compute_kernel=fused_uvm_caching "
           "'plan.caching_ratios=[0.05,0.1,0.2]'`")
Key = Tuple[str, str, str, int]  # workload, hardware, planner, batch size


def provision_files(paths: Sequence[Path]) -> List[Path]:
    """Every provision.json at or under the report's inputs, once each."""
    found = set()
    for path in paths:
        if path.is_file() and path.name == RESULT_FILE:
            found.add(path.resolve())
        elif path.is_dir():
            found.update(p.resolve() for p in path.rglob(RESULT_FILE))
    return sorted(found, key=lambda p: natural_key(str(p)))


def curves(files: List[Path], notes: List[str]) -> Tuple[Dict[Key, List[dict]], Dict[Key, int]]:
    """Per (workload, hardware, planner, batch): the cache-ratio rows that found a world size, by ratio; and
    the world size of the same job with every table in HBM, where a report without cache ratios has one."""
    cached: Dict[Key, List[dict]] = {}
    in_hbm: Dict[Key, int] = {}
    for path in files:
        try:
            report = json.loads(path.read_text())
            rows = [(row, (report["workload"], report["hardware"], report["planner"], row["batch_size"]))
                    for row in report["results"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            notes.append(f"{path}: unreadable provision report ({err.__class__.__name__}); skipped")
            continue
        for row, key in rows:
            if not row.get("recommended"):
                continue
            if row.get("caching_ratio") is not None and row.get("compute_kernel") == "fused_uvm_caching":
                cached.setdefault(key, []).append({**row["recommended"], "caching_ratio": row["caching_ratio"],
                                                   "limit": (row.get("next_smaller") or {}).get("binding")})
            elif row.get("compute_kernel") in (None, "fused", "auto"):
                in_hbm[key] = row["recommended"]["world_size"]
    return {key: sorted(points, key=lambda p: p["caching_ratio"]) for key, points in cached.items()}, in_hbm


def figure_cache_ratio(plot: Plotter, paths: Sequence[Path]) -> Section:
    section = Section(11, "UVM cache ratio", INTRO)
    cached, in_hbm = curves(provision_files(paths), section.notes)
    if not cached:
        section.skipped = f"no provision report over cache ratios among the inputs (make one with {EXAMPLE})"
        return section
    files = draw(plot, cached, in_hbm)
    section.figures.append((f"{len(cached)} provisioned job(s)", files, table(cached, in_hbm)))
    return section


def label(key: Key) -> str:
    workload, hardware, planner, batch = key
    return f"{workload} on {hardware} ({planner}, batch {batch})"


def table(cached: Dict[Key, List[dict]], in_hbm: Dict[Key, int]) -> str:
    rows = [[label(key), f"{p['caching_ratio']:g}", p["world_size"], f"{100 * p['utilization_max']:.1f} %",
             {"hbm": "HBM", "host": "host memory"}.get(p["limit"], "-"), in_hbm.get(key, "")]
            for key, points in cached.items() for p in points]
    return md_table(["job", "cache ratio", "GPUs", "util max", "next smaller ran out of", "GPUs, all in HBM"], rows)


def draw(plot: Plotter, cached: Dict[Key, List[dict]], in_hbm: Dict[Key, int]) -> List[Path]:
    fig, (left, right) = plot.plt.subplots(1, 2, figsize=(12.5, 4.6))
    for number, (key, points) in enumerate(cached.items()):
        color = OKABE_ITO[number % len(OKABE_ITO)]
        ratios = [p["caching_ratio"] for p in points]
        for ax, values in ((left, [p["world_size"] for p in points]),
                           (right, [100 * p["utilization_max"] for p in points])):
            ax.plot(ratios, values, color=color, lw=1.2, label=label(key) if ax is left else None)
            for ratio, value, point in zip(ratios, values, points):
                ax.scatter([ratio], [value], s=36, color=color, zorder=3, marker="o" if point["limit"] else "s",
                           facecolors="none" if point["limit"] == "host" else color)
        if key in in_hbm:
            left.axhline(in_hbm[key], color=color, lw=0.9, ls="--")
            left.annotate(f"all in HBM: {in_hbm[key]}", (ratios[0], in_hbm[key]), textcoords="offset points",
                          xytext=(0, 4), fontsize=8, color=color)
    left.set_xlabel("cache ratio (share of each table's rows in HBM)")
    left.set_ylabel("GPUs (smallest world size that fits)")
    left.set_ylim(bottom=0)
    left.set_title("GPUs needed", loc="left")
    left.legend(loc="center left", frameon=False, fontsize=8)
    right.set_xlabel("cache ratio")
    right.set_ylabel("utilization of the largest rank (%)")
    right.set_ylim(0, 100)
    right.set_title("planned utilization there", loc="left")
    fig.suptitle("UVM-cached tables against the cache ratio (membench provision)", x=0.01, ha="left")
    fig.tight_layout()
    return plot.save(fig, "fig11_cache_ratio")
