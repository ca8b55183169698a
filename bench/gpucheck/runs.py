"""`membench run` as a user starts it, on the GPU (simulated: a GPU preset with hardware.simulate=true on CPU):
the native backend with timeline and snapshot, a forced OOM, a stalled rank that the watchdog must end without
leaving a process, and the torchrec backend (when fbgemm-gpu imports) with membench's prediction beside the
measured peak."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from bench.gpucheck.log import CheckLog
from bench.gpucheck.verdicts import breakdown_adds_up, nvml_covers_reserved
from workloads.units import MIB

RUN_TIMEOUT_S = 150
# the stalled-rank drill: on a GPU, long enough for CUDA and NCCL start-up; simulated, it only needs the
# watchdog to fire (during start-up or after it: either way the run is a timeout and must leave no process)
WATCHDOG_S = {"gpu": 20, "simulated": 5}


class RunTimedOut(RuntimeError):
    """A `membench run` of a stage ran past RUN_TIMEOUT_S; its launcher, agents and ranks were ended."""


def _run_dirs(runs: Path) -> set:
    return {path.parent for path in runs.rglob("launch.json")} if runs.exists() else set()


def membench_run(out_dir: Path, *overrides: str, env: Optional[Dict[str, str]] = None
                 ) -> Tuple[Optional[dict], Optional[Path], str]:
    """`membench run` in a subprocess: (summary or None, its run directory, the output's last lines). Past
    RUN_TIMEOUT_S the run's processes are ended, every one (the agents and ranks are in sessions of their
    own: killing the launcher alone would leave them holding the GPU), and RunTimedOut says so."""
    from bench.run.reaper import end_run

    runs = out_dir / "runs"
    before = set(runs.rglob("summary.json")) if runs.exists() else set()
    dirs_before = _run_dirs(runs)
    proc = subprocess.Popen([sys.executable, "-m", "bench", "run", f"results_dir={runs}", *overrides],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        left = []
        for run_dir in sorted(_run_dirs(runs) - dirs_before) or [out_dir]:
            left += end_run([proc], run_dir)
        proc.communicate()
        raise RunTimedOut(f"membench run {' '.join(overrides)} ran past {RUN_TIMEOUT_S} s; ended it "
                          f"(processes left: {left or 'none'})") from None
    new = sorted(set(runs.rglob("summary.json")) - before) if runs.exists() else []
    tail = " | ".join(output.strip().splitlines()[-3:])
    if not new:
        return None, None, tail
    return json.loads(new[0].read_text()), new[0].parent, tail


def hardware_overrides(simulate: bool, ranks: int = 1) -> List[str]:
    """One GPU (as on the single-GPU host), or `ranks` simulated H100s on CPU."""
    if simulate:
        return ["hardware=h100_80g", "hardware.simulate=true", f"hardware.ranks_per_node={ranks}"]
    return ["hardware=auto", "hardware.ranks_per_node=1"]


def _peaks(summary: dict) -> str:
    return ", ".join(f"{r['peak_bytes'] / MIB:.1f} MiB" for r in summary["per_rank"])


def native_run(simulate: bool, out_dir: Path, log: CheckLog) -> None:
    overrides = ["model=native", "workload=tiny", "workload.steps=3", "record.snapshot=true",
                 *hardware_overrides(simulate)]
    summary, run_dir, tail = membench_run(out_dir, *overrides)
    ok = summary is not None and summary["status"] == "ok" and summary["model_backend"] == "native"
    adds_up = ok and all(r["peak_bytes"] > 0 and breakdown_adds_up(r["peak_bytes"], r["breakdown"]).ok
                         for r in summary["per_rank"])
    log.check("native workload", adds_up, f"status {summary and summary['status']}, peaks "
                                          f"{_peaks(summary) if summary else tail}")
    if not ok:
        return
    rows = [len((run_dir / f"timeline_rank{r['rank']}.csv").read_text().splitlines()) - 1 for r in summary["per_rank"]]
    log.check("native: timeline", all(count >= 5 for count in rows), f"rows per rank {rows}")
    # the sampler's raw readings (the recorder's device-used column is floored at reserved): the cache keeps
    # what was reserved, so a later sample sees at least the peak
    per_rank = [(rank["rank"], nvml_covers_reserved((rank.get("nvml") or {}).get("device_used_peak_bytes"),
                                                    rank["peak_reserved_bytes"] or 0)) for rank in summary["per_rank"]]
    reading = {True: "this process's NVML entry", False: "the device's used (NVML lists no process here, so "
                                                           "other processes on the GPU are in it)"}
    log.check("native: NVML used >= reserved", all(verdict.ok for _, verdict in per_rank),
              "; ".join(f"rank {rank}: {verdict.detail}" for rank, verdict in per_rank) + "; reading: " +
              ", ".join(sorted({reading[bool((r.get("nvml") or {}).get("process_reported"))]
                                for r in summary["per_rank"]})))
    log.check("native: memory_viz snapshot", bool(list(run_dir.glob("snapshot_rank*.pickle"))), str(run_dir))
    versions_ok = simulate or "cuda" in summary["versions"]  # a simulated device has no CUDA to name
    log.check("native: allocator and versions recorded", bool(summary.get("allocator")) and versions_ok,
              f"allocator {summary.get('allocator', {}).get('backend')}, versions {summary['versions']}")


def oom_drill(simulate: bool, out_dir: Path, log: CheckLog) -> None:
    if simulate:  # a 5 MiB device: the model refuses the tiny workload's first large segment
        forced = ["hardware.capacity_gib=0.005", "hardware.non_torch_reserve_mib=0"]
    else:  # an allocator cap of 8 MiB: far below what the tiny workload needs
        fraction = 8 * MIB / torch.cuda.get_device_properties(0).total_memory
        forced = [f"hardware.memory_fraction={fraction:.8f}"]
    summary, _, tail = membench_run(out_dir, "model=native", "workload=tiny", "workload.steps=3",
                                    *hardware_overrides(simulate), *forced)
    oom = summary and next((r["oom"] for r in summary["per_rank"] if r.get("oom")), None)
    log.check("forced OOM run", bool(summary and summary["status"] == "oom" and oom and oom["phase"]),
              f"status {summary and summary['status']}: rank {oom and oom['rank']} step {oom and oom['step']} "
              f"{oom and oom['phase']}" if summary else tail)


def watchdog_drill(simulate: bool, out_dir: Path, log: CheckLog) -> None:
    """A rank that stops making progress: the watchdog ends the run (timeout) and no process is left."""
    from bench.run.reaper import rank_processes

    summary, run_dir, tail = membench_run(out_dir, "model=native", "workload=tiny", *hardware_overrides(simulate),
                                          f"launcher.watchdog_s={WATCHDOG_S['simulated' if simulate else 'gpu']}",
                                          env={"MEMBENCH_FAULT_HANG_RANK": "0"})
    left = rank_processes(run_dir) if run_dir else []
    log.check("watchdog drill", bool(summary and summary["status"] == "timeout") and not left,
              f"status {summary and summary['status']}, rank processes left: {[p.pid for p in left]}"
              if summary else tail)


def torchrec_run(simulate: bool, out_dir: Path, log: CheckLog) -> None:
    try:
        import fbgemm_gpu  # noqa: F401  (importable is what is checked)
        import torchrec  # noqa: F401
    except Exception as err:  # noqa: BLE001 (any import failure means: no torchrec here)
        log.skip("torchrec workload", f"fbgemm-gpu / torchrec do not import here ({type(err).__name__}: "
                                      f"{str(err).splitlines()[0][:120] if str(err) else ''}); see docs/gpu.md")
        return
    # simulated: two ranks, so torchrec's all-to-all buffers go through the allocator model too
    summary, _, tail = membench_run(out_dir, "model=torchrec", "workload=tiny", "workload.steps=3",
                                    *hardware_overrides(simulate, ranks=2))
    ok = summary is not None and summary["status"] == "ok"
    log.check("torchrec workload", ok, f"status {summary and summary['status']}, peaks "
                                       f"{_peaks(summary) if summary else tail}")
    estimate = (summary or {}).get("estimate") or {}
    if not ok:
        return
    errors = estimate.get("error_pct")
    log.check("prediction vs measured", bool(errors) and all(e is not None for e in errors),
              "membench " + ", ".join(f"{e:+.1f}%" for e in errors or []) + "; torchrec's planner " +
              ", ".join(f"{e:+.1f}%" for e in estimate.get("torchrec_error_pct") or [] if e is not None)
              + (" (uncalibrated on this GPU: membench calibrate)" if not simulate else ""))
