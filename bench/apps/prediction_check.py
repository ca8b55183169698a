"""`membench calibrate --validate N`: the peak predictor judged on N random workloads it was never fitted on.

The workloads are drawn from a seed (bench/harness/random_workloads.py), each is run with `membench run`,
and every rank's measured peak is set against membench's prediction (made before launch, with the
calibration on disk) and torchrec's planner estimate. Prints the table and, per backend, the median and
largest |error|; writes the rows and the summary to <results dir>/validate-<time>/validation.json.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

from rich.table import Table

from bench.apps.console import make_console
from bench.harness.random_workloads import random_workloads
from bench.results.store import atomic_write_json
from bench.run.execute import run_overrides
from workloads.units import MIB

# what the check aims at (issue "Predictions that hold on workloads no one calibrated on")
TARGET_MAX_ABS_ERROR_PCT = 3.0
TARGET_MEDIAN_ABS_ERROR_PCT = 1.0
TARGET_INTERVAL_COVERAGE = 0.95  # measured peaks inside the interval given beside their prediction
MIN_INTERVAL_RANKS = 20  # fewer re-scored ranks of a backend than this: no interval is recorded for it


@dataclass
class ValidationRow:
    workload: int
    backend: str
    sharding: str
    rank: int
    measured_bytes: int
    predicted_bytes: Optional[int]
    error_pct: Optional[float]  # membench's prediction, positive = over-estimate; None = no prediction
    torchrec_error_pct: Optional[float]
    interval: Optional[List[int]] = None  # [low, high] given beside the prediction, when the calibration has one
    pipeline: str = "plain"  # the train pipeline it ran through (pipeline=)

    @property
    def in_interval(self) -> Optional[bool]:
        return None if self.interval is None else self.interval[0] <= self.measured_bytes <= self.interval[1]


def _value(overrides: List[str], key: str) -> str:
    return next((o.split("=", 1)[1] for o in overrides if o.startswith(key + "=")), "")


def rows_for_run(index: int, overrides: List[str], summary) -> List[ValidationRow]:
    estimate = summary.estimate or {}
    predicted = estimate.get("per_rank_peak") or []
    ours, theirs = estimate.get("error_pct") or [], estimate.get("torchrec_error_pct") or []
    intervals = estimate.get("per_rank_interval") or []

    def at(values, rank):
        return values[rank] if rank < len(values) else None

    return [ValidationRow(index, _value(overrides, "model"), _value(overrides, "sharding"), r.rank, r.peak_bytes,
                          at(predicted, r.rank), at(ours, r.rank), at(theirs, r.rank), at(intervals, r.rank),
                          _value(overrides, "pipeline") or "plain")
            for r in summary.per_rank if r.status == "ok"]


def backend_summary(rows: List[ValidationRow]) -> Dict[str, Dict[str, object]]:
    """Per backend: ranks, ranks without a prediction, median and max |error| (ours and torchrec's)."""
    out: Dict[str, Dict[str, object]] = {}
    for backend in sorted({row.backend for row in rows}):
        mine = [row for row in rows if row.backend == backend]
        ours = [abs(row.error_pct) for row in mine if row.error_pct is not None]
        theirs = [abs(row.torchrec_error_pct) for row in mine if row.torchrec_error_pct is not None]
        inside = [row.in_interval for row in mine if row.in_interval is not None]
        out[backend] = {
            "ranks": len(mine), "without_prediction": len(mine) - len(ours),
            "median_abs_error_pct": round(statistics.median(ours), 3) if ours else None,
            "max_abs_error_pct": round(max(ours), 3) if ours else None,
            "within_target": sum(e <= TARGET_MAX_ABS_ERROR_PCT for e in ours),
            "torchrec_median_abs_error_pct": round(statistics.median(theirs), 3) if theirs else None,
            "torchrec_max_abs_error_pct": round(max(theirs), 3) if theirs else None,
            "with_interval": len(inside),
            "interval_coverage": round(sum(inside) / len(inside), 4) if inside else None,
        }
    return out


def meets_target(summary: Dict[str, Dict[str, object]]) -> bool:
    """Per backend: every rank predicted, max and median |error| within target, and (where an interval was
    given) at least TARGET_INTERVAL_COVERAGE of the measured peaks inside it."""
    return all(s["without_prediction"] == 0 and s["max_abs_error_pct"] is not None
               and s["max_abs_error_pct"] <= TARGET_MAX_ABS_ERROR_PCT
               and s["median_abs_error_pct"] <= TARGET_MEDIAN_ABS_ERROR_PCT
               and (s.get("interval_coverage") is None or s["interval_coverage"] >= TARGET_INTERVAL_COVERAGE)
               for s in summary.values())


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.2f}"


def print_validation(rows: List[ValidationRow], summary: Dict[str, Dict[str, object]], console) -> None:
    table = Table(title="prediction on random workloads (none calibrated on)", title_justify="left")
    for column in ("#", "backend", "sharding", "pipeline", "rank", "measured MiB", "membench MiB", "error %",
                   "torchrec error %"):
        table.add_column(column, justify="right" if column not in ("backend", "sharding", "pipeline") else "left")
    for row in rows:
        predicted = "-" if row.predicted_bytes is None else f"{row.predicted_bytes / MIB:.2f}"
        table.add_row(str(row.workload), row.backend, row.sharding, row.pipeline, str(row.rank),
                      f"{row.measured_bytes / MIB:.2f}", predicted, _pct(row.error_pct), _pct(row.torchrec_error_pct))
    console.print(table)
    for backend, stats in summary.items():
        theirs = ("" if stats["torchrec_median_abs_error_pct"] is None else
                  f"; torchrec's planner: median {stats['torchrec_median_abs_error_pct']} %, "
                  f"max {stats['torchrec_max_abs_error_pct']} %")
        coverage = ("no interval recorded" if stats.get("interval_coverage") is None else
                    f"{round(stats['interval_coverage'] * stats['with_interval'])} of {stats['with_interval']} "
                    f"inside the interval given")
        console.print(f"{backend}: {stats['ranks']} ranks, {stats['without_prediction']} without a prediction; "
                      f"|error| median {stats['median_abs_error_pct']} %, max {stats['max_abs_error_pct']} % "
                      f"({stats['within_target']} within {TARGET_MAX_ABS_ERROR_PCT:g} %); {coverage}{theirs}")
    verdict = "meets" if meets_target(summary) else "misses"
    console.print(f"{verdict} the target: max |error| <= {TARGET_MAX_ABS_ERROR_PCT:g} %, median <= "
                  f"{TARGET_MEDIAN_ABS_ERROR_PCT:g} %, a prediction for every rank and >= "
                  f"{TARGET_INTERVAL_COVERAGE:.0%} inside its interval, per backend")


def run_validation(count: int, seed: int, results_dir: Path) -> int:
    """Draw, run and score; exit status 0 when the target is met, 1 when not (the table says where)."""
    out_dir = results_dir / f"validate-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    workloads = random_workloads(count, seed)
    rows: List[ValidationRow] = []
    failed = []
    for index, overrides in enumerate(workloads, 1):
        print(f"[validate] {index}/{count}: {' '.join(overrides[1:])}", flush=True)
        run_dir = out_dir / f"{index:02d}"
        summary = run_overrides(overrides, run_dir, f"{out_dir.name}/{index:02d}")
        if summary.status != "ok":
            failed.append((index, summary.status))
            continue
        rows.extend(rows_for_run(index, overrides, summary))
    summary = backend_summary(rows)
    atomic_write_json(out_dir / "validation.json", {
        "seed": seed, "workloads": [{"index": i, "overrides": o} for i, o in enumerate(workloads, 1)],
        "not_ok": [{"index": i, "status": s} for i, s in failed],
        "rows": [asdict(row) for row in rows], "summary": summary,
        "target": {"max_abs_error_pct": TARGET_MAX_ABS_ERROR_PCT,
                   "median_abs_error_pct": TARGET_MEDIAN_ABS_ERROR_PCT}})
    console = make_console()
    print_validation(rows, summary, console)
    for index, status in failed:
        console.print(f"workload {index}: status {status} (no measurement; see {out_dir / f'{index:02d}'})")
    console.print(f"wrote {out_dir / 'validation.json'}")
    return 0 if meets_target(summary) and not failed else 1


def interval_from_points(points, coefficients: Optional[Dict[str, float]] = None,
                         min_ranks: int = MIN_INTERVAL_RANKS) -> Dict[str, float]:
    """Per backend, the largest |error| of the predictions `coefficients` give for re-scored runs (rounded up
    to 0.01 %): with a few dozen ranks, the largest seen is the honest stand-in for a 95th percentile.
    Backends with fewer than `min_ranks` ranks get none."""
    import math

    from bench.planning.predict import error_pct

    errors: Dict[str, List[float]] = {}
    for point in points:
        errors.setdefault(point.backend, []).append(abs(error_pct(point.predicted(coefficients or {}),
                                                                  point.measured)))
    return {backend: math.ceil(max(values) * 100) / 100 for backend, values in sorted(errors.items())
            if len(values) >= min_ranks}


def record_interval(validation_dirs: List[Path], calibration_dir: Path) -> int:
    """`membench calibrate --record-interval DIR...`: re-score the runs of earlier --validate directories with
    this predictor and store, per backend, the interval to give beside each prediction."""
    import sys

    from bench.apps.scored_runs import points_from_run_dir
    from bench.planning.calibration import load_calibration, save_calibration

    points = []
    for directory in validation_dirs:
        if not (directory / "validation.json").is_file():
            print(f"membench calibrate: --record-interval {directory}: no validation.json there; pass the "
                  f"validate-<time> directories that `membench calibrate --validate N` wrote", file=sys.stderr)
            return 2
        for summary_path in sorted(directory.glob("*/summary.json")):
            points.extend(points_from_run_dir(summary_path.parent, summary_path.parent.name))
    calibration = load_calibration(calibration_dir, "cpu")
    interval = interval_from_points(points, calibration.coefficients)  # the prediction a run makes
    if not interval:
        print(f"membench calibrate: --record-interval: fewer than {MIN_INTERVAL_RANKS} ranks of any backend in "
              f"{', '.join(map(str, validation_dirs))}", file=sys.stderr)
        return 1
    counts = {backend: sum(p.backend == backend for p in points) for backend in interval}
    calibration.interval_pct = interval
    calibration.interval_source = ("membench calibrate --record-interval: the largest |error| of "
                                   + ", ".join(f"{counts[b]} {b} ranks" for b in interval)
                                   + " from " + ", ".join(d.name for d in validation_dirs))
    path = save_calibration(calibration_dir, calibration)
    console = make_console()
    for backend, pct in interval.items():
        console.print(f"{backend}: interval +-{pct} % (the largest |error| of {counts[backend]} ranks)")
    console.print(f"wrote {path}")
    return 0
