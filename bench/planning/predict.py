"""Predict each rank's peak before a run starts, and score the prediction once it has finished."""
from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench.accounting.allocator_config import allocator_settings_for
from bench.planning.calibration import CALIBRATION_DIR, calibration_key, load_calibration, prediction_interval
from bench.planning.torchrec_adapter import quiet_libraries
from bench.results.schema import RankResult
from workloads.units import MIB


def predict_run(cfg, launch, calibration_dir: Path = CALIBRATION_DIR) -> Dict[str, Any]:
    """Plan on the meta device exactly as the workers will, then predict per-rank peaks."""
    import torch

    from bench.planning.dry_run import dry_run_for
    from bench.planning.estimate import add_device_overheads, predict, shares_from_plan
    from bench.planning.torchrec_adapter import describe_plan, make_sharding_plan, torchrec_estimate_parts
    from workloads.model import build_model
    from workloads.spec import build_spec

    quiet_libraries()
    spec = build_spec(cfg.workload)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(spec, torch.device("meta"))
        plan, capture = make_sharding_plan(cfg, spec, launch.world_size, launch.ranks_per_node,
                                           launch.device_type, launch.capacity_bytes, model)
        dry_run = dry_run_for(cfg, spec)
    calibration = load_calibration(calibration_dir, calibration_key(launch.device_type, cfg.hardware.name))
    shares = shares_from_plan(describe_plan(plan), spec, launch.world_size, cfg.sharding.caching_ratio)
    torchrec_parts = torchrec_estimate_parts(capture, launch.world_size)
    settings = allocator_settings_for(cfg.allocator, launch.device_type)
    predictions = [add_device_overheads(p, launch.device_type, cfg.hardware.non_torch_reserve_mib * MIB)
                   for p in predict(spec, shares, calibration.coefficients, dry_run, allocator_settings=settings)]
    return {
        "calibration": calibration.source,
        **interval_fields([p.total_bytes for p in predictions], calibration, "torchrec"),
        "per_rank_peak": [p.total_bytes for p in predictions],
        "per_rank_breakdown": [p.breakdown for p in predictions],
        # what the calibration fits: measured peak - fixed part = sum(coefficient * feature)
        "per_rank_fixed": [p.total_bytes - sparse_part(p, calibration.coefficients) for p in predictions],
        "per_rank_features": [p.features for p in predictions],
        "torchrec_per_rank_peak": [sum(values) for values in zip(*torchrec_parts.values())],
        # where torchrec's estimate comes from: its shards (static: weights, optimizer state, its I/O
        # estimates) and its heuristic reservations on every rank (dense x6, KJT x20)
        "torchrec_per_rank_parts": torchrec_parts,
    }


def sparse_part(prediction, coefficients: Dict[str, float]) -> int:
    return int(round(sum(coefficients.get(k, 0.0) * v for k, v in prediction.features.items())))


NATIVE_SOURCE = "none: a dry run of the native model itself (bench/planning/native_estimate.py)"


def interval_fields(peaks: List[int], calibration, backend: str) -> Dict[str, Any]:
    """The interval beside each prediction, when the calibration has one for this backend."""
    pct = calibration.interval_pct.get(backend)
    if pct is None:
        return {}
    return {"interval_pct": pct, "interval_source": calibration.interval_source,
            "per_rank_interval": [prediction_interval(peak, pct) for peak in peaks]}


def predict_native_run(cfg, launch, calibration_dir: Path = CALIBRATION_DIR) -> Dict[str, Any]:
    """The native backend's ranks, each trained on `meta` as the worker trains it (nothing calibrated;
    torchrec's planner has nothing to say about a model it does not shard); on a GPU, with the caching
    allocator's overhead (the dry run replayed through its model) and the memory outside it."""
    from bench.planning.estimate import add_device_overheads
    from bench.planning.native_estimate import predict_native
    from workloads.spec import build_spec

    settings = allocator_settings_for(cfg.allocator, launch.device_type)
    predictions = [add_device_overheads(p, launch.device_type, cfg.hardware.non_torch_reserve_mib * MIB)
                   for p in predict_native(build_spec(cfg.workload), launch.world_size, cfg.model.sparse_grads,
                                           settings)]
    calibration = load_calibration(calibration_dir, calibration_key(launch.device_type, cfg.hardware.name))
    return {
        "calibration": NATIVE_SOURCE,
        **interval_fields([p.total_bytes for p in predictions], calibration, "native"),
        "per_rank_peak": [p.total_bytes for p in predictions],
        "per_rank_breakdown": [p.breakdown for p in predictions],
        "per_rank_fixed": [p.total_bytes for p in predictions],
        "per_rank_features": [{} for _ in predictions],
    }


def try_predict_run(cfg, launch) -> Optional[Dict[str, Any]]:
    try:
        if cfg.model.backend == "native":
            return predict_native_run(cfg, launch)
        return predict_run(cfg, launch)
    except Exception as err:  # a prediction must never stop a measurement
        print(f"[membench] peak prediction unavailable: {type(err).__name__}: {err}".splitlines()[0],
              file=sys.stderr)
        return None


def error_pct(predicted: int, measured: int) -> Optional[float]:
    return round(100.0 * (predicted - measured) / measured, 3) if measured else None


def score(estimate: Optional[Dict[str, Any]], ranks: List[RankResult]) -> Optional[Dict[str, Any]]:
    """Add per-rank errors (predicted vs measured peak, %, positive = over-estimate) for ranks that ran."""
    if estimate is None:
        return None
    measured = {r.rank: r.peak_bytes for r in ranks if r.status == "ok"}
    for key, source in (("error_pct", "per_rank_peak"), ("torchrec_error_pct", "torchrec_per_rank_peak")):
        if source in estimate:  # a native run has no torchrec estimate
            estimate[key] = [error_pct(value, measured[rank]) if rank in measured else None
                             for rank, value in enumerate(estimate[source])]
    return estimate
