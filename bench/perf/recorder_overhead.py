"""Benchmark: what memory recording costs, as a ratio of step time with recording on vs off.

    python -m bench.perf.recorder_overhead [--workload tiny] [--repeats 2] [overrides...]

Runs the same workload under torchrun with `record.enabled=true` and `false` (alternating, to spread
machine noise over both) and prints the median step time of each and their ratio. On CPU the exact
recorder intercepts every op, so expect a ratio well above 1; on GPU the CUDA backend only reads
allocator counters at phase boundaries.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from bench.run.execute import run_overrides


def measure(overrides, enabled: bool, results: Path, index: int) -> float:
    run_id = f"{'on' if enabled else 'off'}-{index}"
    summary = run_overrides([*overrides, f"record.enabled={str(enabled).lower()}"], results / run_id, run_id)
    if summary.status != "ok":
        raise SystemExit(f"benchmark run {run_id} ended {summary.status}: {summary.error}")
    return summary.job.step_time_ms_p50


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="tiny")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides, e.g. workload.steps=20")
    args = parser.parse_args()
    overrides = [f"workload={args.workload}", "workload.steps=15", *args.overrides]
    on, off = [], []
    with tempfile.TemporaryDirectory(prefix="membench-overhead-") as tmp:
        for index in range(args.repeats):
            off.append(measure(overrides, False, Path(tmp), index))
            on.append(measure(overrides, True, Path(tmp), index))
            print(f"repeat {index + 1}/{args.repeats}: step p50 off {off[-1]:.1f} ms, on {on[-1]:.1f} ms", flush=True)
    off_ms, on_ms = statistics.median(off), statistics.median(on)
    print(f"workload {args.workload} ({' '.join(overrides[1:])}): step time p50 recording off {off_ms:.1f} ms, "
          f"on {on_ms:.1f} ms -> overhead ratio {on_ms / off_ms:.2f}x")


if __name__ == "__main__":
    main()
