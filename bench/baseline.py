"""Regression baselines: what a stored run must still look like, and the comparison against a new run.

A baseline (`results/baselines/<hardware>/<entry>.json`) keeps the fields that matter (status, per-rank
peak and utilization, job imbalance, where an expected OOM happened) plus per-metric relative
tolerances, the suite entry's definition hash and the environment it was recorded in.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from bench.results import RunSummary, atomic_write_json
from bench.suite import SuiteEntry

BASELINE_SCHEMA_VERSION = 1
METRICS = ("peak_bytes", "utilization", "imbalance")
REGENERATE = "regenerate with: pytest -m membench --update-baselines"
# The prediction's worst per-rank |error| may grow by this many percentage points before it fails
ESTIMATE_ERROR_TOLERANCE_PP = 1.0


class BaselineError(ValueError):
    """A baseline that cannot be used (missing, corrupt, other schema, other definition): one line."""


@dataclass
class Row:
    workload: str
    rank: str
    metric: str
    baseline: Any
    now: Any
    delta: str
    tolerance: str


@dataclass
class Comparison:
    rows: List[Row] = field(default_factory=list)  # failing metrics
    reasons: List[str] = field(default_factory=list)  # one-line failure reasons
    notes: List[str] = field(default_factory=list)  # improvements and other news that do not fail

    @property
    def ok(self) -> bool:
        return not self.rows and not self.reasons


def baseline_path(baseline_dir: Path, entry: SuiteEntry) -> Path:
    return Path(baseline_dir) / entry.hardware / f"{entry.name}.json"


def oom_site(summary_or_baseline: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Where each OOM rank failed: [{rank, step, phase}], from a summary dict or a baseline."""
    sites = []
    for rank in summary_or_baseline.get("per_rank", []):
        oom = rank.get("oom")
        if oom:
            sites.append({"rank": rank["rank"], "step": oom.get("step"), "phase": oom.get("phase")})
    return sites


def make_baseline(entry: SuiteEntry, summary: RunSummary, rtol: float) -> Dict[str, Any]:
    data = asdict(summary)
    return {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "name": entry.name,
        "hardware": entry.hardware,
        "overrides": list(entry.overrides),
        "definition_hash": entry.definition_hash,
        "config_hash": summary.config_hash,
        "environment": {**summary.versions, "device_name": summary.device_name},
        "status": summary.status,
        "world_size": summary.world_size,
        "per_rank": [
            {"rank": r["rank"], "status": r["status"], "peak_bytes": r["peak_bytes"],
             "utilization": r["utilization"], "oom": ({k: r["oom"][k] for k in ("step", "phase")}
                                                       if r.get("oom") else None)}
            for r in data["per_rank"]
        ],
        "imbalance": summary.job.imbalance,
        "estimate_error_pct": worst_estimate_error(data.get("estimate")),
        "tolerances": {metric: rtol for metric in METRICS},
    }


def worst_estimate_error(estimate: Optional[Dict[str, Any]]) -> Optional[float]:
    """Largest |predicted - measured| / measured over the ranks that ran, in %; None without a prediction."""
    errors = [abs(e) for e in (estimate or {}).get("error_pct") or [] if e is not None]
    return round(max(errors), 3) if errors else None


def write_baseline(path: Path, baseline: Dict[str, Any]) -> None:
    atomic_write_json(path, baseline)


def load_baseline(path: Path, entry: SuiteEntry) -> Dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BaselineError(f"no baseline for {entry.name} at {path}; {REGENERATE}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BaselineError(f"corrupt baseline {path} (not valid JSON: {err}); {REGENERATE}") from None
    if not isinstance(data, dict):
        raise BaselineError(f"corrupt baseline {path} (not a JSON object); {REGENERATE}")
    version = data.get("schema_version")
    if version != BASELINE_SCHEMA_VERSION:
        raise BaselineError(f"baseline {path} has schema_version {version!r}, this membench reads "
                            f"{BASELINE_SCHEMA_VERSION}; {REGENERATE}")
    missing = [key for key in ("status", "per_rank", "imbalance", "tolerances", "definition_hash")
               if key not in data]
    if missing:
        raise BaselineError(f"corrupt baseline {path} (missing {', '.join(missing)}); {REGENERATE}")
    for metric, tolerance in dict(data["tolerances"]).items():
        if metric not in METRICS or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 10:
            raise BaselineError(f"baseline {path}: tolerances.{metric}={tolerance!r}: use one of {', '.join(METRICS)} "
                                f"with a relative tolerance in [0, 10) (0.05 = 5%)")
    return data


def _relative(base: float, now: float) -> str:
    if base == 0:
        return "n/a" if now == 0 else "+inf"
    return f"{100 * (now - base) / base:+.2f}%"


def _exceeds(base: float, now: float, tolerance: float, worse_when_higher: bool) -> bool:
    change = (now - base) if worse_when_higher else (base - now)
    return change > tolerance * abs(base)


def compare(entry: SuiteEntry, baseline: Dict[str, Any], summary: RunSummary,
            rtol_override: Optional[float] = None) -> Comparison:
    result = Comparison()
    name = entry.name
    tolerances = {m: (rtol_override if rtol_override is not None else float(baseline["tolerances"].get(m, 0.05)))
                  for m in METRICS}
    if baseline["definition_hash"] != entry.definition_hash:
        result.reasons.append(
            f"{name}: baseline was recorded for another definition of this entry (overrides "
            f"{baseline.get('overrides')} vs now {entry.overrides}); if the change is intended, {REGENERATE}")
    if baseline.get("config_hash") != summary.config_hash:
        result.notes.append(f"{name}: the resolved config differs from the baseline's "
                            f"({baseline.get('config_hash')} -> {summary.config_hash})")
    now = asdict(summary)
    base_status, now_status = baseline["status"], summary.status
    if base_status != now_status:
        if base_status == "oom" and now_status == "ok":
            result.notes.append(f"{name}: improved: the baseline ran out of memory, now it fits")
        else:
            where = "; ".join(f"rank {s['rank']} step {s['step']} {s['phase']}" for s in oom_site(now))
            detail = f" at {where}" if where else (f": {summary.error}" if summary.error else "")
            result.rows.append(Row(name, "job", "status", base_status, now_status, "regressed", "exact"))
            result.reasons.append(f"{name}: status {base_status} -> {now_status}{detail}")
        return result
    if now_status == "oom":
        base_sites = [{k: s[k] for k in ("rank", "step", "phase")} for s in oom_site(baseline)]
        now_sites = oom_site(now)
        if base_sites != now_sites:
            result.rows.append(Row(name, "job", "oom site", base_sites, now_sites, "moved", "exact"))
        return result
    if now_status != "ok":
        return result
    if len(baseline["per_rank"]) != len(summary.per_rank):
        result.reasons.append(f"{name}: baseline has {len(baseline['per_rank'])} ranks, now "
                              f"{len(summary.per_rank)}; {REGENERATE}")
        return result
    for base_rank, now_rank in zip(baseline["per_rank"], summary.per_rank):
        rank = str(now_rank.rank)
        for metric, worse_when_higher, now_value in (("peak_bytes", True, now_rank.peak_bytes),
                                                     ("utilization", False, now_rank.utilization)):
            base_value = base_rank[metric]
            if _exceeds(base_value, now_value, tolerances[metric], worse_when_higher):
                result.rows.append(Row(name, rank, metric, base_value, now_value,
                                       _relative(base_value, now_value), f"{100 * tolerances[metric]:g}%"))
            elif metric == "peak_bytes" and now_value < base_value:
                result.notes.append(f"{name}: rank {rank} peak shrank {_relative(base_value, now_value)}")
    base_error, now_error = baseline.get("estimate_error_pct"), worst_estimate_error(now.get("estimate"))
    if base_error is not None and now_error is not None and now_error > base_error + ESTIMATE_ERROR_TOLERANCE_PP:
        result.rows.append(Row(name, "job", "estimate |error| %", base_error, now_error,
                               f"{now_error - base_error:+.2f} pp", f"{ESTIMATE_ERROR_TOLERANCE_PP:g} pp"))
    if _exceeds(baseline["imbalance"], summary.job.imbalance, tolerances["imbalance"], True):
        result.rows.append(Row(name, "job", "imbalance", round(baseline["imbalance"], 6),
                               round(summary.job.imbalance, 6), _relative(baseline["imbalance"], summary.job.imbalance),
                               f"{100 * tolerances['imbalance']:g}%"))
    return result


def format_rows(rows: List[Row]) -> str:
    """The failure table: workload, rank, metric, baseline, now, delta, tolerance."""
    header = ("workload", "rank", "metric", "baseline", "now", "delta", "tolerance")
    cells = [header] + [tuple(str(getattr(row, f)) for f in
                              ("workload", "rank", "metric", "baseline", "now", "delta", "tolerance")) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def describe_update(old: Optional[Dict[str, Any]], new: Dict[str, Any]) -> str:
    """One line saying what --update-baselines changed for an entry."""
    name = new["name"]
    if old is None:
        return f"{name}: new baseline (status {new['status']})"
    changes = []
    if old.get("status") != new["status"]:
        changes.append(f"status {old.get('status')} -> {new['status']}")
    for base_rank, new_rank in zip(old.get("per_rank", []), new["per_rank"]):
        if base_rank.get("peak_bytes") != new_rank["peak_bytes"]:
            changes.append(f"rank {new_rank['rank']} peak {base_rank.get('peak_bytes')} -> {new_rank['peak_bytes']} "
                           f"({_relative(base_rank.get('peak_bytes') or 0, new_rank['peak_bytes'])})")
    if len(old.get("per_rank", [])) != len(new["per_rank"]):
        changes.append(f"ranks {len(old.get('per_rank', []))} -> {len(new['per_rank'])}")
    if old.get("imbalance") != new["imbalance"]:
        changes.append(f"imbalance {old.get('imbalance')} -> {new['imbalance']}")
    if old.get("definition_hash") != new["definition_hash"]:
        changes.append("definition changed")
    return f"{name}: " + ("; ".join(changes) if changes else "unchanged")
