"""The predictor's calibration: coefficients of its correction, fitted on measured runs, stored per hardware
(results/calibration/<hardware>.json; CPU accounting does not depend on the host, so all CPU runs share
one)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from bench.planning.estimate import FEATURES
from bench.results.schema import kernel_device
from bench.results.store import atomic_write_json

CALIBRATION_DIR = Path(__file__).resolve().parent.parent.parent / "results" / "calibration"
# Uncalibrated: the simulated step is taken as is (no correction).
DEFAULT_COEFFICIENTS = {name: 0.0 for name in FEATURES}
CALIBRATION_SCHEMA_VERSION = 1


def calibration_key(device_type: str, hardware_name: str) -> str:
    """CPU accounting does not depend on the host, so all CPU runs share one calibration (a simulated GPU's
    tensors are the CPU kernels' too)."""
    return "cpu" if kernel_device(device_type) == "cpu" else hardware_name


@dataclass
class Calibration:
    hardware: str
    coefficients: Dict[str, float]
    points: int = 0
    max_abs_error_pct: Optional[float] = None
    source: str = "default"
    schema_version: int = CALIBRATION_SCHEMA_VERSION
    # per backend: the half-width of the interval given beside each prediction, as |error| % (the largest
    # seen on random workloads measured with this predictor: `membench calibrate --record-interval`)
    interval_pct: Dict[str, float] = field(default_factory=dict)
    interval_source: Optional[str] = None


def prediction_interval(predicted_bytes: int, interval_pct: float) -> List[int]:
    """[low, high] of the measured peak a prediction allows, when its error (predicted - measured) / measured
    is within +-interval_pct."""
    fraction = interval_pct / 100.0  # < 1: recorded from errors of working predictions
    return [int(predicted_bytes / (1.0 + fraction)), int(predicted_bytes / (1.0 - fraction))]


def calibration_path(root: Path, hardware: str) -> Path:
    return Path(root) / f"{hardware}.json"


def load_calibration(root: Path, hardware: str) -> Calibration:
    """The stored calibration for `hardware`, or the uncalibrated defaults when there is none."""
    path = calibration_path(root, hardware)
    if not path.exists():
        return Calibration(hardware=hardware, coefficients=dict(DEFAULT_COEFFICIENTS))
    data = json.loads(path.read_text())
    if data.get("schema_version") != CALIBRATION_SCHEMA_VERSION or set(data.get("coefficients", {})) != set(FEATURES):
        raise ValueError(f"{path}: unsupported calibration file; regenerate with `membench calibrate hardware={hardware}`")
    return Calibration(**data)


def fit_coefficients(samples: List[Dict[str, float]], residuals: List[float]) -> Dict[str, float]:
    """Non-negative least squares of residual bytes on the features (a buffer lives >= 0 times).

    Exact for a handful of features: solve ordinary least squares on every subset of features and
    keep the best solution whose coefficients are all >= 0.
    """
    import itertools

    import numpy as np

    matrix = np.array([[sample[name] for name in FEATURES] for sample in samples], dtype=float)
    target = np.array(residuals, dtype=float)
    scale = np.abs(matrix).max(axis=0)
    scale[scale == 0] = 1.0
    scaled = matrix / scale
    best, best_error = np.zeros(len(FEATURES)), float(np.sum(target ** 2))
    for size in range(1, len(FEATURES) + 1):
        for subset in itertools.combinations(range(len(FEATURES)), size):
            solution, *_ = np.linalg.lstsq(scaled[:, subset], target, rcond=None)
            if np.any(solution < 0):
                continue
            error = float(np.sum((scaled[:, subset] @ solution - target) ** 2))
            if error < best_error - 1e-9 * max(1.0, best_error):
                best = np.zeros(len(FEATURES))
                best[list(subset)] = solution
                best_error = error
    return {name: float(value / s) for name, value, s in zip(FEATURES, best, scale)}


def save_calibration(root: Path, calibration: Calibration) -> Path:
    path = calibration_path(root, calibration.hardware)
    atomic_write_json(path, asdict(calibration))
    return path
