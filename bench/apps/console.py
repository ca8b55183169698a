"""Console tables (rich): a finished run, a sweep, a plan, a provisioning report."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.results.schema import RunSummary
from workloads.units import GIB, MIB

# Short names keep the per-rank table readable in an 80-column CI log
SHORT = {"embedding_weights": "emb_w", "embedding_optimizer": "emb_opt", "embedding_grads": "emb_g", "dense_params": "dense_p",
         "dense_grads": "dense_g", "dense_optimizer": "dense_opt", "activations": "act",
         "comm_buffers": "comm", "inputs_in_flight": "in_flight", "allocator_overhead": "alloc_ovh", "non_torch": "non_torch", "other": "other"}
STATUS_STYLE = {"ok": "green", "oom": "red", "failed": "red", "timeout": "yellow", "invalid": "magenta"}


def _mib(num_bytes) -> str:
    return "-" if num_bytes is None else f"{num_bytes / MIB:,.1f}"


def human_bytes(num_bytes) -> str:
    """GiB from 1 GiB up, else MiB: a peak in a one-line listing."""
    if num_bytes is None:
        return "-"
    return f"{num_bytes / GIB:,.2f} GiB" if num_bytes >= GIB else f"{num_bytes / MIB:,.1f} MiB"


def top_categories(breakdown: dict, count: int = 3) -> str:
    ranked = sorted(((v, k) for k, v in breakdown.items() if v > 0), reverse=True)[:count]
    return " ".join(f"{SHORT.get(k, k)} {v / MIB:,.1f}" for v, k in ranked)


def make_console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # logs and CI: do not squeeze tables into 80 columns
        console = Console(highlight=False, width=160)
    return console


def print_run_summary(summary: RunSummary, run_dir: Path, console: Console | None = None) -> None:
    console = console or make_console()
    style = STATUS_STYLE.get(summary.status, "")
    console.print(f"[bold]{summary.run_id}[/bold]  status [{style}]{summary.status}[/{style}]  "
                  f"workload {summary.workload}  world size {summary.world_size}  wall {summary.wall_s:.1f} s")
    if summary.per_rank:
        table = Table(title="per-rank memory (MiB)", title_justify="left")
        for column in ("rank", "status", "peak", "capacity", "util %", "headroom", "peak at",
                       "top categories at peak"):
            table.add_column(column, justify="right" if column not in ("status", "peak at",
                                                                      "top categories at peak (MiB)") else "left")
        for rank in summary.per_rank:
            table.add_row(str(rank.rank), rank.status, _mib(rank.peak_bytes), _mib(rank.capacity_bytes),
                          f"{100 * rank.utilization:.2f}", _mib(rank.headroom_bytes),
                          f"step {rank.peak_step} {rank.peak_phase}", top_categories(rank.breakdown))
        console.print(table)
        job = summary.job
        if job.steps:
            console.print(f"job: utilization min/mean/max {100 * job.utilization_min:.2f}/"
                          f"{100 * job.utilization_mean:.2f}/{100 * job.utilization_max:.2f} %, imbalance "
                          f"{job.imbalance:.3f}, step p50 {job.step_time_ms_p50:.1f} ms, "
                          f"{job.samples_per_s:,.0f} samples/s")
        print_prediction_terms(summary, console)
    if summary.error:
        console.print(f"[{style}]{summary.status}: {summary.error}[/{style}]")
    console.print(f"results: {run_dir}")


STATIC_CATEGORIES = ("embedding_weights", "embedding_optimizer", "dense_params", "dense_grads", "dense_optimizer")


def static_bytes(breakdown: dict) -> int:
    """What a rank holds whatever the batch: weights, their optimizer state, DDP's gradient buckets."""
    return sum(int(breakdown.get(category, 0)) for category in STATIC_CATEGORIES)


def print_prediction_terms(summary: RunSummary, console: Console) -> None:
    """The prediction made before launch beside the measurement, category by category, for the rank it
    missed most: the term that is off is the row that differs."""
    estimate = summary.estimate if isinstance(summary.estimate, dict) else {}
    predicted, errors = estimate.get("per_rank_breakdown"), estimate.get("error_pct")
    measured = {rank.rank: rank for rank in summary.per_rank if rank.status == "ok"}
    scored = [(abs(e), r) for r, e in enumerate(errors or []) if e is not None and r in measured]
    if not predicted or not scored:
        return
    _, worst = max(scored)
    rank, terms = measured[worst], predicted[worst]
    interval = (estimate.get("per_rank_interval") or [None] * (worst + 1))[worst]
    given = "" if interval is None else (
        f"; interval {interval[0] / MIB:,.2f}-{interval[1] / MIB:,.2f} "
        f"({'inside' if interval[0] <= rank.peak_bytes <= interval[1] else 'OUTSIDE'})")
    table = Table(title=f"prediction vs measured, rank {worst} (MiB; error {errors[worst]:+.2f} %{given})",
                  title_justify="left")
    for column in ("category", "predicted", "measured", "difference"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for category, measured_bytes in rank.breakdown.items():
        guess = int(terms.get(category, 0))
        if guess or measured_bytes:
            table.add_row(category, f"{guess / MIB:,.2f}", f"{measured_bytes / MIB:,.2f}",
                          f"{(guess - measured_bytes) / MIB:+,.2f}")
    console.print(table)
    parts = estimate.get("torchrec_per_rank_parts")
    if parts:
        shards, dense, kjt = (parts[key][worst] for key in ("shards", "dense", "kjt"))
        static = static_bytes(rank.breakdown)
        console.print(f"torchrec's planner: {(shards + dense + kjt) / MIB:,.2f} MiB = shards {shards / MIB:,.2f} "
                      f"(weights, optimizer state, its I/O estimates) + heuristic reservations: dense "
                      f"{dense / MIB:,.2f}, KJT {kjt / MIB:,.2f}; measured {rank.peak_bytes / MIB:,.2f} "
                      f"(static {static / MIB:,.2f}, the rest {(rank.peak_bytes - static) / MIB:,.2f})")


def print_sweep(outcomes, console: Console | None = None) -> None:
    """One row per job: its run id, status, largest rank peak, the overrides that differ between the jobs
    and directory (any objects with run_id, status and run_dir; peak_bytes and overrides when they have them)."""
    console = console or make_console()
    table = Table(title="sweep", title_justify="left")
    for column in ("run", "status", "peak", "swept", "dir"):
        table.add_column(column, justify="right" if column == "peak" else "left")
    every = [set(getattr(outcome, "overrides", ())) for outcome in outcomes]
    shared = set.intersection(*every) if len(every) > 1 else set()
    for outcome in outcomes:
        run_id, status, run_dir = outcome.run_id, outcome.status, outcome.run_dir
        overrides = [item for item in getattr(outcome, "overrides", ()) if item not in shared]
        style = STATUS_STYLE.get(status, "")
        table.add_row(run_id, f"[{style}]{status}[/{style}]", human_bytes(getattr(outcome, "peak_bytes", None)),
                      " ".join(overrides), str(run_dir))
    console.print(table)


# -- plan mode and provisioning -----------------------------------------------------------------
def print_plan(summary: RunSummary, run_dir: Path) -> None:
    console = make_console()
    ranks = summary.per_rank
    style = "green" if summary.status == "ok" else "red"
    console.print(f"[bold]{summary.run_id}[/bold]  plan  workload {summary.workload} on {summary.world_size} x "
                  f"{summary.hardware}  [{style}]{summary.estimate['verdict']}[/{style}]  "
                  f"(placement {summary.estimate['planner']} {summary.estimate['plan_time_s']} s, wall {summary.wall_s:.1f} s)")
    if ranks:
        shown = sorted(ranks, key=lambda r: r.peak_bytes, reverse=True)
        if len(shown) > 8:
            shown = shown[:5] + [min(ranks, key=lambda r: r.peak_bytes)]
        table = Table(title=f"per-rank estimate (GiB){' - top 5 and the smallest' if len(ranks) > 8 else ''}",
                      title_justify="left")
        in_flight = any(rank.breakdown.get("inputs_in_flight") for rank in shown)
        cached = any(rank.breakdown.get("embedding_cache") for rank in shown)
        for column in ("rank", "total", "capacity", "util %", "headroom", "emb weights", "emb optim",
                       *(["emb cache+state"] if cached else []), "dense+optim", "activations",
                       *(["in flight"] if in_flight else []), "overheads"):
            table.add_column(column, justify="right")
        for rank in shown:
            b = rank.breakdown
            dense = b["dense_params"] + b["dense_grads"] + b["dense_optimizer"]
            table.add_row(str(rank.rank), f"{rank.peak_bytes / GIB:.2f}", f"{rank.capacity_bytes / GIB:.2f}",
                          f"{100 * rank.utilization:.1f}", f"{rank.headroom_bytes / GIB:.2f}",
                          f"{b['embedding_weights'] / GIB:.2f}", f"{b['embedding_optimizer'] / GIB:.2f}",
                          *([f"{(b['embedding_cache'] + b['embedding_cache_state']) / GIB:.2f}"] if cached else []),
                          f"{dense / GIB:.2f}", f"{b['activations'] / GIB:.2f}",
                          *([f"{b.get('inputs_in_flight', 0) / GIB:.3f}"] if in_flight else []),
                          f"{(b['allocator_overhead'] + b['non_torch']) / GIB:.2f}")
        console.print(table)
        job = summary.job
        console.print(f"job: utilization min/mean/max {100 * job.utilization_min:.1f}/{100 * job.utilization_mean:.1f}/"
                      f"{100 * job.utilization_max:.1f} %, imbalance {job.imbalance:.3f}")
    host = (summary.estimate or {}).get("per_node_host_bytes") or []
    if any(host):
        console.print(f"host memory (UVM tables): highest node {max(host) / GIB:.2f} GiB of "
                      f"{summary.estimate['host_capacity_bytes'] / GIB:.2f} GiB per node")
    if summary.error:
        console.print(f"[{style}]{summary.error}[/{style}]")
    console.print(f"results: {run_dir}")


def limit_name(point: dict) -> str:
    """Which limit a world size that does not fit ran into: HBM per rank, host memory per node (UVM tables),
    or the planner's refusal."""
    return {"hbm": "HBM", "host": "host memory"}.get(point.get("binding"), "planner" if point.get("reason") else "HBM")


def print_provision(report: dict, out_path: Path) -> None:
    console = make_console()
    table = Table(title=f"provisioning {report['workload']} on {report['hardware']} "
                        f"({report['capacity_bytes'] / GIB:.0f} GiB/rank, headroom {100 * report['headroom']:.0f}%)",
                  title_justify="left")
    rows = report["results"]
    cached = any(row.get("caching_ratio") is not None for row in rows)
    host = any((row["recommended"] or {}).get("max_node_host_bytes") for row in rows)
    for column in ("batch/rank", *(["cache ratio"] if cached else []), "recommended ranks", "nodes", "max rank GiB",
                   "util max %", "util mean %", *(["host/node GiB"] if host else []), "next smaller",
                   "it lacks (GiB)", "limit"):
        table.add_column(column, justify="right")
    for row in rows:
        chosen, smaller = row["recommended"], row["next_smaller"]
        lead = [str(row["batch_size"]), *([f"{row['caching_ratio']:g}" if row.get("caching_ratio") else "default"]
                                         if cached else [])]
        if chosen is None:
            table.add_row(*lead, "none fits", *["-"] * (7 + host))
            continue
        lacks = "-" if smaller is None else f"{smaller['shortfall_bytes'] / GIB:.2f}"
        table.add_row(*lead, str(chosen["world_size"]),
                      str(chosen["world_size"] // report["ranks_per_node"]), f"{chosen['max_rank_bytes'] / GIB:.2f}",
                      f"{100 * chosen['utilization_max']:.1f}", f"{100 * chosen['utilization_mean']:.1f}",
                      *([f"{chosen.get('max_node_host_bytes', 0) / GIB:.1f}"] if host else []),
                      "-" if smaller is None else str(smaller["world_size"]), lacks,
                      "-" if smaller is None else limit_name(smaller))
    console.print(table)
    if host:
        console.print(f"host memory per node: {report['host_capacity_bytes'] / GIB:.0f} GiB (hardware.host_memory_gib)")
    console.print(f"results: {out_path}")
