"""`membench calibrate`: fit the peak predictor's coefficients from measured runs, then check them.

    membench calibrate [--suite conf/suite/calibrate_cpu.yaml] [--check-suite conf/suite/ci_cpu.yaml]
    membench calibrate --validate 20 [--seed 0]    # the predictor on 20 random workloads, nothing fitted
    membench calibrate --record-interval results/runs/validate-<time> ...   # the interval beside predictions

Runs every entry of the calibration suite (each its own torchrun), fits the sparse-side coefficients
(non-negative least squares, see bench/planning/calibration.py), writes results/calibration/<hardware>.json,
then runs the check suite and prints, per rank, the measured peak, membench's prediction and
torchrec's planner estimate with their errors. `--validate N` fits nothing: it draws N random workloads
from `--seed`, runs them and prints the errors of the predictions made with the calibration on disk
(median and max per backend, and how many measured peaks fell inside the interval given beside each
prediction; exit 1 when max > 3 %, median > 1 %, a rank has no prediction or fewer than 95 % fall inside).
`--record-interval DIR...` sets that interval, per backend, to the largest |error| of earlier --validate
runs re-scored with this predictor (a re-fit drops it: it belongs to the coefficients it was measured with).
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Dict, List, Optional

from rich.table import Table

from bench.apps.console import make_console
from bench.apps.scored_runs import Point, existing_points, points_from_run_dir
from bench.harness.suite import SuiteError, load_suite
from bench.planning.calibration import (CALIBRATION_DIR, Calibration, calibration_key, fit_coefficients,
                                        load_calibration, save_calibration)
from bench.planning.predict import error_pct
from bench.run.config import CONF_DIR
from bench.run.execute import run_overrides
from workloads.units import MIB

SUITES_DIR = Path(CONF_DIR) / "suite"


def run_suite_points(suite_path: Path, results_dir: Path) -> tuple[List[Point], str]:
    suite = load_suite(suite_path)
    points, key = [], None
    for index, entry in enumerate(suite.entries, 1):
        print(f"[calibrate] {suite.name} {index}/{len(suite.entries)}: {entry.name}", flush=True)
        run_dir = results_dir / suite.name / entry.name
        summary = run_overrides(entry.all_overrides(), run_dir, f"{results_dir.name}/{suite.name}/{entry.name}")
        if summary.status != "ok":
            print(f"[calibrate]   skipped: status {summary.status}", flush=True)
            continue
        key = key or calibration_key(summary.device_type, summary.hardware)
        points.extend(points_from_run_dir(run_dir, entry.name))
    return points, key or "cpu"


def error_table(title: str, points: List[Point], coefficients: Dict[str, float]) -> tuple[Table, float, float]:
    table = Table(title=title, title_justify="left")
    for column in ("entry", "rank", "measured MiB", "membench MiB", "error %", "torchrec MiB", "error %"):
        table.add_column(column, justify="left" if column == "entry" else "right")
    worst_ours = worst_torchrec = 0.0
    for point in points:
        ours = error_pct(point.predicted(coefficients), point.measured)
        worst_ours = max(worst_ours, abs(ours))
        theirs_mib = theirs_error = "-"
        if point.torchrec is not None:
            theirs = error_pct(point.torchrec, point.measured)
            worst_torchrec = max(worst_torchrec, abs(theirs))
            theirs_mib, theirs_error = f"{point.torchrec / MIB:.2f}", f"{theirs:+.2f}"
        table.add_row(point.entry, str(point.rank), f"{point.measured / MIB:.2f}",
                      f"{point.predicted(coefficients) / MIB:.2f}", f"{ours:+.2f}", theirs_mib, theirs_error)
    return table, worst_ours, worst_torchrec


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="membench calibrate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", type=Path, default=SUITES_DIR / "calibrate_cpu.yaml")
    parser.add_argument("--check-suite", type=Path, default=SUITES_DIR / "ci_cpu.yaml",
                        help="held-out suite to report errors on ('' to skip)")
    parser.add_argument("--out", type=Path, default=CALIBRATION_DIR, help="calibration directory")
    parser.add_argument("--results-dir", type=Path, default=Path("results/runs"))
    parser.add_argument("--from-runs", type=Path, default=None,
                        help="re-fit from an earlier `membench calibrate` output directory instead of running "
                             "(its <suite name>/<entry>/ run directories)")
    parser.add_argument("--validate", type=int, default=None, metavar="N",
                        help="instead of fitting: run N random workloads (none from a suite) and print the "
                             "prediction errors")
    parser.add_argument("--seed", type=int, default=0, help="with --validate: the seed the workloads are drawn from")
    parser.add_argument("--record-interval", type=Path, nargs="+", default=None, metavar="DIR",
                        help="set the interval given beside each prediction from earlier --validate runs "
                             "(their validate-<time> directories, re-scored with this predictor)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = make_parser().parse_args(argv)
    if args.record_interval is not None:
        from bench.apps.prediction_check import record_interval

        return record_interval(args.record_interval, args.out)
    if args.validate is not None:
        if args.validate < 1:
            print(f"membench calibrate: --validate {args.validate}: give the number of workloads, >= 1",
                  file=sys.stderr)
            return 2
        from bench.apps.prediction_check import run_validation

        return run_validation(args.validate, args.seed, args.results_dir)
    try:
        points, key, check_points = measured_points(args)
    except SuiteError as err:
        print(f"membench calibrate: {err}", file=sys.stderr)
        return 2
    if points is None:
        return 2
    if len(points) < 3:
        print(f"membench calibrate: only {len(points)} usable measurements from {args.suite}; need >= 3",
              file=sys.stderr)
        return 1
    return fit_and_save(args, points, key, check_points)


def measured_points(args):
    """(points to fit, calibration key, held-out points): from earlier runs (--from-runs) or new ones; points
    is None when --from-runs names no calibration output."""
    suite_name = load_suite(args.suite).name
    check_name = load_suite(args.check_suite).name if str(args.check_suite) else None
    if args.from_runs is not None:
        if not (args.from_runs / suite_name).is_dir():
            print(f"membench calibrate: no {suite_name}/ under {args.from_runs}; pass the directory that "
                  f"an earlier `membench calibrate` wrote (results/runs/calibrate-<time>)", file=sys.stderr)
            return None, None, None
        check_points = existing_points(args.from_runs / check_name) if check_name else []
        return existing_points(args.from_runs / suite_name), "cpu", check_points
    results_dir = args.results_dir / f"calibrate-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    points, key = run_suite_points(args.suite, results_dir)
    check_points = run_suite_points(args.check_suite, results_dir)[0] if check_name else []
    return points, key, check_points


def fit_and_save(args, points: List[Point], key: str, check_points: List[Point]) -> int:
    coefficients = fit_coefficients([p.features for p in points], [p.measured - p.fixed for p in points])
    console = make_console()
    fit_table, fit_worst, _ = error_table(f"calibration fit ({args.suite.name})", points, coefficients)
    console.print(fit_table)
    held_out_worst = None
    if check_points:
        check_table, held_out_worst, torchrec_worst = error_table(f"held-out check ({args.check_suite.name})",
                                                                  check_points, coefficients)
        console.print(check_table)
        console.print(f"held-out max |error|: membench {held_out_worst:.2f} %, torchrec planner {torchrec_worst:.2f} %")
    previous = load_calibration(args.out, key)
    if previous.interval_pct:
        console.print(f"the interval recorded with the previous fit ({previous.interval_source}) is dropped: it was "
                      f"measured with other coefficients; record it again with --record-interval")
    calibration = Calibration(hardware=key, coefficients=coefficients, points=len(points),
                              max_abs_error_pct=round(held_out_worst if held_out_worst is not None else fit_worst, 3),
                              source=f"membench calibrate --suite {args.suite.name} ({len(points)} rank measurements)")
    path = save_calibration(args.out, calibration)
    console.print("coefficients: " + ", ".join(f"{k}={v:.4g}" for k, v in coefficients.items()))
    console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
