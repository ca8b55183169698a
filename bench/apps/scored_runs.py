"""Measured runs scored by this version of the predictor: its inputs and its prediction per rank.

Shared by `membench calibrate` (fit and held-out check) and its `--record-interval` (the errors of earlier
`--validate` runs): each run is re-scored from its config and sharding plan, so no run is repeated when
the predictor changes.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional


@dataclass
class Point:
    entry: str
    rank: int
    measured: int
    fixed: int
    features: Dict[str, float]
    torchrec: Optional[int]  # torchrec's planner estimate (None: a native run, which torchrec does not plan)
    backend: str = "torchrec"

    def predicted(self, coefficients: Dict[str, float]) -> int:
        return int(round(self.fixed + sum(coefficients.get(k, 0.0) * v for k, v in self.features.items())))


def points_from_run_dir(run_dir: Path, label: str) -> List[Point]:
    """Predictor inputs for a finished run, recomputed from its config and sharding plan with this
    version of the predictor (so re-fitting needs no new runs)."""
    import json

    from bench.run.launchspec import load_run_config
    from bench.results.store import load_summary
    from bench.planning.dry_run import dry_run_for
    from bench.planning.estimate import shares_from_plan, predict
    from workloads.spec import build_spec

    summary = load_summary(run_dir)
    if summary.status != "ok" or summary.mode != "train":
        return []
    cfg, launch = load_run_config(run_dir)
    spec = build_spec(cfg.workload)
    if cfg.model.backend == "native":  # its dry run is the model itself: nothing to fit, only to check
        from bench.planning.native_estimate import predict_native

        native = predict_native(spec, launch.world_size, cfg.model.sparse_grads)
        return [Point(label, r.rank, r.peak_bytes, native[r.rank].total_bytes, {}, None, "native")
                for r in summary.per_rank]
    shares = shares_from_plan(json.loads((run_dir / "sharding_plan.json").read_text()), spec, launch.world_size)
    predictions = predict(spec, shares, {}, dry_run_for(cfg, spec))  # its pipeline holds batches in flight
    torchrec = (summary.estimate or {}).get("torchrec_per_rank_peak") or [0] * launch.world_size
    return [Point(label, r.rank, r.peak_bytes, predictions[r.rank].total_bytes, predictions[r.rank].features,
                  torchrec[r.rank]) for r in summary.per_rank]


def existing_points(suite_dir: Path) -> List[Point]:
    points = []
    for summary_path in sorted(Path(suite_dir).glob("*/summary.json")):
        points.extend(points_from_run_dir(summary_path.parent, summary_path.parent.name))
    return points
