"""Synthetic results for the export / ls / progress tests, written with the real writers (composed
config, summary_for, write_summary, write_run_config, record_in_sweep, the recorder's TimelineWriter):
what `membench run` leaves behind, without torchrun."""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from bench.results.schema import RankResult, Status, complete_breakdown, job_stats
from bench.results.store import record_in_sweep, write_summary
from bench.run.execute import compose_run_config
from bench.run.launchspec import LaunchSpec, write_run_config
from bench.run.summary import summary_for

MIB = 1024**2
CAPACITY = 64 * MIB
PHASES = ("input", "forward", "backward", "optimizer")


def rank_result(rank: int, peak: int, status: str = "ok", capacity: int = CAPACITY) -> RankResult:
    parts = {"embedding_weights": peak // 2, "embedding_optimizer": peak // 8, "dense_params": peak // 40,
             "activations": peak // 5}
    oom = ({"rank": rank, "step": 0, "phase": "forward", "requested_bytes": 3 * MIB,
            "message": "emulated OOM", "stats": {"live_bytes": peak}, "snapshot_path": None}
           if status == Status.OOM else None)
    return RankResult(rank=rank, status=status, device="cpu", capacity_bytes=capacity, peak_bytes=peak,
                      peak_allocated_bytes=peak, utilization=peak / capacity, headroom_bytes=capacity - peak,
                      peak_step=1, peak_phase="forward", breakdown=complete_breakdown(peak, parts),
                      build_peak_bytes=peak // 2, warmup_peak_bytes=peak - 10, step_times_s=[0.02, 0.01, 0.01],
                      recorder="cpu_exact", oom=oom)


def write_timelines(run_dir: Path, ranks: Sequence[RankResult], steps: int = 3) -> None:
    from bench.run.memory.recorder import TimelineWriter
    from bench.results.store import timeline_file

    for rank in ranks:
        writer = TimelineWriter(timeline_file(run_dir, rank.rank))
        writer.write(["0.100000", -1, "build", rank.peak_bytes // 2, rank.peak_bytes // 2, None, None])
        for step in range(steps):
            for number, phase in enumerate(PHASES):
                writer.write([f"{0.2 + step * 0.1 + number * 0.02:.6f}", step, phase, rank.peak_bytes * 3 // 4,
                              rank.peak_bytes - (0 if phase == "forward" else 1000), None, None])
        writer.close()


def make_run(run_dir: Path, overrides: Sequence[str] = (), *, peaks: Sequence[int] = (20 * MIB, 18 * MIB),
             status: str = Status.OK, started_at: str = "2026-01-01T10:00:00+00:00",
             sweep_dir: Optional[Path] = None, timelines: bool = True):
    """One run as `membench run OVERRIDES` writes it (into a sweep when sweep_dir is given)."""
    cfg = compose_run_config(["hardware=cpu", *overrides])
    run_dir.mkdir(parents=True, exist_ok=True)
    sweep_id = sweep_dir.name if sweep_dir is not None else None
    run_id = f"{sweep_id}/{run_dir.name}" if sweep_id else run_dir.name
    rank_status = Status.OOM if status == Status.OOM else Status.OK
    ranks = [rank_result(rank, peak, rank_status) for rank, peak in enumerate(peaks)]
    summary = summary_for(cfg, run_id=run_id, status=status, world_size=len(ranks), device_type="cpu",
                          device_name="cpu", started_at=started_at, wall_s=3.0, sweep_id=sweep_id,
                          per_rank=ranks, oom_ranks=[r.rank for r in ranks if r.status == Status.OOM],
                          job=job_stats(ranks, cfg.workload.batch_size, 1))
    write_summary(run_dir, summary)
    write_run_config(run_dir, cfg, LaunchSpec(device_type="cpu", dist_backend="gloo", world_size=len(ranks),
                                              ranks_per_node=len(ranks), nodes=1, capacity_bytes=CAPACITY,
                                              collective_timeout_s=60))
    if timelines:
        write_timelines(run_dir, ranks)
    if sweep_dir is not None:
        record_in_sweep(sweep_dir, summary, [f"results_dir={sweep_dir.parent}", "hardware=cpu", *overrides])
    return summary


def make_sweep(sweep_dir: Path, points: Sequence[Sequence[str]], *, statuses: Sequence[str] = (),
               started_at: str = "2026-01-02T10:00:00+00:00") -> None:
    """A sweep like `membench run -m` leaves: points 0..n-1 and sweep.json."""
    for number, overrides in enumerate(points):
        status = statuses[number] if number < len(statuses) else Status.OK
        make_run(sweep_dir / str(number), overrides, status=status, sweep_dir=sweep_dir,
                 peaks=(20 * MIB + number * MIB, 18 * MIB + number * MIB), started_at=started_at)


GRID = [["workload.batch_size=8", "workload.seed=0"], ["workload.batch_size=8", "workload.seed=1"],
        ["workload.batch_size=16", "workload.seed=0"], ["workload.batch_size=16", "workload.seed=1"]]
