"""Console tables for a finished run and a finished sweep (rich)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from rich.console import Console
from rich.table import Table

from bench.results import RunSummary

GIB = 1024**3
MIB = 1024**2
# Short names keep the per-rank table readable in an 80-column CI log
SHORT = {"embedding_weights": "emb_w", "embedding_optimizer": "emb_opt", "embedding_grads": "emb_g", "dense_params": "dense_p",
         "dense_grads": "dense_g", "dense_optimizer": "dense_opt", "activations": "act",
         "comm_buffers": "comm", "allocator_overhead": "alloc_ovh", "non_torch": "non_torch", "other": "other"}
STATUS_STYLE = {"ok": "green", "oom": "red", "failed": "red", "timeout": "yellow", "invalid": "magenta"}


def _mib(num_bytes) -> str:
    return "-" if num_bytes is None else f"{num_bytes / MIB:,.1f}"


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
    if summary.error:
        console.print(f"[{style}]{summary.status}: {summary.error}[/{style}]")
    console.print(f"results: {run_dir}")


def print_sweep(statuses: List[Tuple[str, str, Path]], console: Console | None = None) -> None:
    console = console or make_console()
    table = Table(title="sweep", title_justify="left")
    table.add_column("run")
    table.add_column("status")
    table.add_column("dir")
    for run_id, status, run_dir in statuses:
        style = STATUS_STYLE.get(status, "")
        table.add_row(run_id, f"[{style}]{status}[/{style}]", str(run_dir))
    console.print(table)
