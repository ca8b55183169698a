"""How fast and how well does plan mode place terabyte-scale tables, ours vs torchrec's planner?

Run as ``python -m bench.perf.plan_speed [--quick] [--skip-torchrec] [--torchrec-timeout S]``.
On this machine's CPU, with no GPU or process group, it places the embedding tables of

(a) the tb_10 workload (1000 tables x 20M rows x dim 128 fp32, row-wise Adagrad: 10.3 TB with
    optimizer state) on 64, 256 and 1024 ranks, and
(b) the same tables with 100, 250, 500 and 1000 tables on a fixed world size (256),

each with membench's ``bench.planning.greedy.place_greedy`` and torchrec's default
``EmbeddingShardingPlanner`` (``place_torchrec``), on H100-like ranks (80 GiB HBM, 8 ranks per node;
torchrec also gets 2 TiB of host memory per rank for UVM). For each it prints the plan time, the
fullest rank's embedding memory (weights + optimizer state, GiB), the mean, the imbalance (max/mean)
and the speedup (torchrec's plan time / ours).

tb_10 does not fit 64 ranks of 80 GiB HBM (ours reports the shortfall, ~4.5k GiB); torchrec may spill
to host memory (UVM) there, but on a 2-core machine its planner did not finish tb_10 on 64 ranks within
45 minutes. torchrec takes minutes to hours per point at this scale: ``--quick`` uses smaller shapes
(tables of 2M rows: 50 tables on 8, 16, 32 ranks; 25, 50, 100 tables on 8 ranks) and finishes in
about two minutes; ``--skip-torchrec`` times ours alone at full scale. ``--torchrec-timeout S`` passes ``timeout_seconds`` to torchrec's planner,
which bounds its proposal search only (not enumeration) and makes its plan depend on wall-clock time.
torchrec's plan time excludes building the meta-device model (``setup s``).
"""
from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional

from bench.perf.table import print_table
from bench.planning.greedy import place_greedy
from bench.planning.torchrec_adapter import place_torchrec
from bench.planning.types import Placement, PlacementError
from bench.run.config import CONF_DIR
from workloads.config import WorkloadConfig
from workloads.spec import WorkloadSpec, build_spec
from workloads.units import GIB, TB


def load_workload(name: str) -> WorkloadConfig:
    from omegaconf import OmegaConf

    path = Path(CONF_DIR) / "workload" / f"{name}.yaml"
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(WorkloadConfig), OmegaConf.load(path)))


@dataclass
class Row:
    section: str
    workload: str
    tables: int
    total_tb: float  # weights + optimizer state
    world_size: int
    planner: str
    placement: Optional[Placement] = None
    error: str = ""
    setup_s: Optional[float] = None
    speedup: Optional[float] = None  # torchrec plan time / ours

    @property
    def plan_s(self) -> Optional[float]:
        return self.placement.plan_time_s if self.placement else None


def total_tb(spec: WorkloadSpec) -> float:
    from workloads.storage import table_storage

    return sum(sum(table_storage(t, spec.config.embedding_optimizer)) for t in spec.tables) / TB


def run_ours(spec: WorkloadSpec, world_size: int, capacity: int, repeats: int) -> tuple:
    """(placement with the median plan time of `repeats` runs, error message)."""
    times, placement = [], None
    for _ in range(repeats):
        try:
            placement = place_greedy(spec, world_size, capacity)
        except PlacementError as error:
            return None, f"PlacementError: {error}"
        times.append(placement.plan_time_s)
    placement.plan_time_s = statistics.median(times)
    return placement, ""


def run_torchrec(spec: WorkloadSpec, world_size: int, capacity: int, ranks_per_node: int,
                 timeout: Optional[int]) -> tuple:
    try:
        return place_torchrec(spec, world_size, capacity, local_world_size=min(ranks_per_node, world_size),
                              timeout_seconds=timeout), ""
    except PlacementError as error:
        return None, f"PlacementError: {error}"


def measure(section: str, name: str, spec: WorkloadSpec, world_size: int, args, capacity: int) -> List[Row]:
    common = dict(section=section, workload=name, tables=len(spec.tables), total_tb=total_tb(spec),
                  world_size=world_size)
    ours, error = run_ours(spec, world_size, capacity, args.repeats)
    rows = [Row(planner="membench", placement=ours, error=error, **common)]
    report(rows[-1])
    if not args.skip_torchrec:
        theirs, error = run_torchrec(spec, world_size, capacity, args.ranks_per_node, args.torchrec_timeout)
        row = Row(planner="torchrec", placement=theirs, error=error, **common,
                  setup_s=theirs.info.get("model_build_s") if theirs else None)
        if theirs and ours and ours.plan_time_s > 0:
            row.speedup = theirs.plan_time_s / ours.plan_time_s
        rows.append(row)
        report(row)
    return rows


def kernels(p: Placement) -> str:
    counts = p.to_dict()["compute_kernels"]
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def sharding(p: Placement) -> str:
    counts = p.to_dict()["sharding_types"]
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def report(row: Row) -> None:
    """One progress line per measurement, as soon as it is done (torchrec points take minutes)."""
    head = f"[{row.section}] {row.workload} {row.tables} tables, {row.world_size} ranks, {row.planner}:"
    if row.placement is None:
        print(f"{head} {row.error}", flush=True)
        return
    p = row.placement
    extra = f", {row.speedup:,.0f}x slower than ours" if row.speedup else ""
    print(f"{head} {p.plan_time_s:.4f} s, max {p.max_rank_bytes / GIB:.2f} GiB, imbalance "
          f"{p.imbalance:.4f}, {len(p.shards)} shards ({sharding(p)}; {kernels(p)}){extra}", flush=True)


def fmt(value: Optional[float], spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(rows: List[Row], header: str) -> None:
    cols = ["section", "workload", "tables", "TB", "ranks", "planner", "plan s", "setup s", "max GiB",
            "mean GiB", "imbalance", "shards", "torchrec/ours", "note"]
    data = []
    for r in rows:
        p = r.placement
        if p is None:
            note = r.error.split(": ", 1)[-1]
        else:
            note = sharding(p)
            if any(k != "fused" for k in p.to_dict()["compute_kernels"]):
                note += f"; {kernels(p)}"
            if p.per_rank_other_bytes:
                note += f"; est. HBM max {max(p.per_rank_hbm_bytes) / GIB:.1f} GiB"
        data.append([
            r.section, r.workload, str(r.tables), f"{r.total_tb:.2f}", str(r.world_size), r.planner,
            fmt(r.plan_s, ".4f"), fmt(r.setup_s, ".1f"),
            fmt(p.max_rank_bytes / GIB if p else None, ".2f"), fmt(p.mean_rank_bytes / GIB if p else None, ".2f"),
            fmt(p.imbalance if p else None, ".4f"), str(len(p.shards)) if p else "-",
            f"{r.speedup:,.0f}x" if r.speedup else "-", note,
        ])
    print_table(header, cols, data, left={"section", "workload", "planner", "note"}, width=240)


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smaller shapes (tables of 2M rows) and world sizes (8-32): about two minutes with torchrec")
    p.add_argument("--skip-torchrec", action="store_true", help="time membench's placement only")
    p.add_argument("--torchrec-timeout", type=int, default=None, metavar="S",
                   help="timeout_seconds for torchrec's planner (bounds its proposal loop only; the chosen "
                        "plan then depends on wall-clock time)")
    p.add_argument("--world-sizes", type=str, default=None, help="comma-separated (default 64,256,1024; quick 8,16,32)")
    p.add_argument("--table-counts", type=str, default=None,
                   help="comma-separated (default 100,250,500,1000; quick 25,50,100)")
    p.add_argument("--table-world-size", type=int, default=None, help="world size of the table-count sweep "
                   "(default 256; quick 8)")
    p.add_argument("--capacity-gib", type=float, default=80.0, help="HBM per rank (default: H100 80 GiB)")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="runs of ours per point (median time)")
    args = p.parse_args(argv)
    if args.torchrec_timeout is not None and args.torchrec_timeout <= 0:
        p.error("--torchrec-timeout must be > 0")

    base = load_workload("tb_10")
    if args.quick:
        base = replace(base, rows=2_000_000)
    world_sizes = [int(w) for w in (args.world_sizes or ("8,16,32" if args.quick else "64,256,1024")).split(",")]
    table_counts = [int(n) for n in (args.table_counts or ("25,50,100" if args.quick else "100,250,500,1000")).split(",")]
    table_world = args.table_world_size or (8 if args.quick else 256)
    capacity = int(args.capacity_gib * GIB)

    t_start = time.perf_counter()
    rows: List[Row] = []
    shape = base.name if not args.quick else f"{base.name} @ 2M rows"
    spec = build_spec(replace(base, num_tables=50) if args.quick else base)
    for world_size in world_sizes:
        rows += measure("world size", shape, spec, world_size, args, capacity)
    for n in table_counts:
        rows += measure(f"tables @ {table_world}", shape, build_spec(replace(base, num_tables=n)), table_world, args,
                        capacity)

    render(rows, f"plan mode placement: membench greedy vs torchrec default planner "
                      f"({args.capacity_gib:g} GiB HBM per rank, {args.ranks_per_node} ranks per node"
                      f"{', torchrec timeout %d s' % args.torchrec_timeout if args.torchrec_timeout else ''})")
    print(f"total {time.perf_counter() - t_start:.1f} s. max/mean GiB: embedding weights + optimizer state per "
          "rank (same formulas for both planners); torchrec's 'est. HBM' adds its I/O buffer estimates. "
          "plan s: ours median of --repeats runs; torchrec's plan() alone (setup s: building the meta model).")


if __name__ == "__main__":
    main()
