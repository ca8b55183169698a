"""Synthetic results for the report tests, written by hand: summary.json through bench.results' writer,
config.yaml and the timelines directly (no composed config, so a test sets any field the report reads), and
`membench report` run in this process on them."""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Optional

import yaml

from bench import report
from bench.results.schema import CATEGORIES, JobStats, RankResult, RunSummary, job_stats
from bench.results.store import write_summary

MIB = 1024**2
PHASES = ("input", "forward", "backward", "optimizer")


def make_rank(rank: int, peak: int, capacity: int, status: str = "ok", step: int = 2, phase: str = "forward",
              oom: Optional[dict] = None) -> RankResult:
    parts = {"embedding_weights": peak // 2, "embedding_optimizer": peak // 32, "dense_params": peak // 40,
             "dense_grads": peak // 40, "dense_optimizer": peak // 20, "activations": peak // 6,
             "comm_buffers": peak // 16}
    breakdown = {c: parts.get(c, 0) for c in CATEGORIES if c != "other"}
    breakdown["other"] = peak - sum(breakdown.values())
    return RankResult(rank=rank, status=status, device="cpu", capacity_bytes=capacity, peak_bytes=peak,
                      peak_allocated_bytes=peak, utilization=peak / capacity, headroom_bytes=capacity - peak,
                      peak_step=step, peak_phase=phase, breakdown=breakdown, build_peak_bytes=peak // 2,
                      warmup_peak_bytes=peak - 100, step_times_s=[0.01] * 4, recorder="cpu_exact", oom=oom)


def write_timeline(run_dir: Path, rank: RankResult, steps: int = 4, fail_at: Optional[tuple] = None) -> None:
    base = rank.peak_bytes * 3 // 4
    rows = [[0.1, -1, "build", base - 1000, base, "", ""]]
    t = 0.1
    for step in range(steps):
        for phase in PHASES:
            t += 0.01
            bump = {"input": 0, "forward": rank.peak_bytes - base, "backward": (rank.peak_bytes - base) // 2,
                    "optimizer": 10}[phase]
            peak = base + bump - (0 if (step, phase) == (rank.peak_step, rank.peak_phase) else 7)
            rows.append([f"{t:.6f}", step, phase, base + bump // 3, peak, "", ""])
            if fail_at == (step, phase):
                break
        if fail_at and step == fail_at[0]:
            break
    with open(run_dir / f"timeline_rank{rank.rank}.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["time_s", "step", "phase", "in_use_bytes", "phase_peak_bytes", "reserved_bytes",
                         "device_used_bytes"])
        writer.writerows(rows)


def make_run(run_dir: Path, ranks: List[RankResult], *, workload: str = "tiny", sharding: str = "table_wise",
             batch: int = 512, rows: int = 10000, capacity_gib: float = 0.05, status: Optional[str] = None,
             mode: str = "train", sweep_id: Optional[str] = None, estimate: Optional[dict] = None,
             timeline: bool = True, error: Optional[str] = None, hardware: str = "cpu",
             pipeline: Optional[str] = None) -> RunSummary:
    run_dir.mkdir(parents=True, exist_ok=True)
    if status is None:
        status = "oom" if any(r.status == "oom" for r in ranks) else "ok"
    run_id = f"{sweep_id}/{run_dir.name}" if sweep_id else run_dir.name
    summary = RunSummary(
        run_id=run_id, status=status, mode=mode, workload=workload, hardware=hardware,
        world_size=len(ranks), device_type="cpu", device_name="cpu", model_backend="torchrec",
        config_hash="0" * 16, versions={"torch": "test"}, started_at="2026-01-01T00:00:00+00:00", wall_s=1.0,
        exit_code=0 if status == "ok" else 3, error=error,
        oom_ranks=[r.rank for r in ranks if r.status == "oom"], per_rank=ranks,
        job=job_stats(ranks, batch, 1) if status == "ok" else JobStats(), estimate=estimate, sweep_id=sweep_id)
    write_summary(run_dir, summary)
    config = {"workload": {"name": workload, "rows": rows, "batch_size": batch, "warmup_steps": 1,
                           "embedding_dim": 64},
              "hardware": {"name": hardware, "capacity_gib": capacity_gib}, "sharding": {"type": sharding},
              "mode": mode, "results_dir": "/somewhere", "run_id": run_id}
    if pipeline is not None:
        config["pipeline"] = {"name": pipeline}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    if timeline and mode == "train":
        for rank in ranks:
            fail = (rank.oom["step"], rank.oom["phase"]) if rank.oom else None
            write_timeline(run_dir, rank, fail_at=fail)
    return summary


def oom_event(rank: int, step: int, phase: str, requested: int, live: int, capacity: int) -> dict:
    return {"rank": rank, "step": step, "phase": phase, "requested_bytes": requested,
            "message": f"membench emulated OOM on rank {rank}: Tried to allocate ({requested} bytes)",
            "stats": {"live_bytes": live, "capacity_bytes": capacity}, "snapshot_path": None}


CAP = int(0.05 * 1024**3)


def make_sweep(root: Path) -> Dict[str, RunSummary]:
    """A 2 x 2 sweep (batch x rows) with one OOM point, like `membench run -m` writes it."""
    sweep_dir = root / "sweep-20260101-000000-abcdef"
    sweep_id = sweep_dir.name
    points = [(512, 10000, 16 * MIB), (512, 20000, 26 * MIB), (4096, 10000, 45 * MIB), (4096, 20000, None)]
    index = {"sweep_id": sweep_id, "runs": []}
    made = {}
    for n, (batch, rows, peak) in enumerate(points):
        if peak is None:
            ranks = [make_rank(r, 50 * MIB, CAP, status="oom", step=0, phase="forward",
                               oom=oom_event(r, 0, "forward", 3 * MIB, 30 * MIB, CAP)) for r in range(2)]
        else:
            ranks = [make_rank(0, peak, CAP), make_rank(1, peak - 3 * MIB, CAP)]
        made[str(n)] = make_run(sweep_dir / str(n), ranks, batch=batch, rows=rows, sweep_id=sweep_id)
        index["runs"].append({"run_id": f"{sweep_id}/{n}", "status": made[str(n)].status,
                              "overrides": ["hardware=cpu", f"results_dir={root}", f"workload.batch_size={batch}",
                                            f"workload.rows={rows}", "hardware.capacity_gib=0.05"],
                              "dir": str(n), "error": None})
    (sweep_dir / "sweep.json").write_text(json.dumps(index, indent=2))
    return made


def run_report(capsys, *argv: str) -> tuple:
    code = report.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err
