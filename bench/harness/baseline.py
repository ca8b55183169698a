"""Regression baselines: what a stored run must still look like, and the comparison against a new run.

A baseline (`results/baselines/<hardware>/<entry>.json`) keeps the fields that matter (status, per-rank
peak, utilization and breakdown at the peak, job imbalance, where an expected OOM happened) plus
per-metric relative tolerances, the suite entry's definition hash and the environment it was recorded in.
The same comparison serves `membench compare RUN_A RUN_B`, with run A's record in the baseline's place.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from bench.results.schema import RunSummary
from bench.results.store import atomic_write_json
from bench.harness.suite import SuiteEntry

BASELINE_SCHEMA_VERSION = 2
# version 1 had no per-rank breakdown: still read, the "moved most" column then says so
READABLE_SCHEMA_VERSIONS = (1, 2)
METRICS = ("peak_bytes", "utilization", "imbalance")
REGENERATE = "regenerate with: pytest -m membench --update-baselines"
# The prediction's worst per-rank |error| may grow by this many percentage points before it fails
ESTIMATE_ERROR_TOLERANCE_PP = 1.0
# Libraries whose version change can move memory numbers: named when a baseline was recorded under others
VERSIONED_LIBRARIES = ("torch", "torchrec", "fbgemm-gpu", "fbgemm-gpu-cpu")


class BaselineError(ValueError):
    """A baseline that cannot be used (missing, corrupt, other schema, other definition): one line."""


@dataclass
class Row:
    """One line of the comparison table."""
    entry: str
    rank: str
    metric: str
    baseline: Any
    now: Any
    delta: str  # absolute change (bytes for peak_bytes)
    delta_pct: str
    tolerance: str
    moved_most: str = ""  # the breakdown category whose bytes changed most, with its change
    failed: bool = False


@dataclass
class Comparison:
    rows: List[Row] = field(default_factory=list)  # every rank's peak, plus each failing metric
    reasons: List[str] = field(default_factory=list)  # one-line failure reasons
    notes: List[str] = field(default_factory=list)  # improvements and other news that do not fail
    version_changes: List[str] = field(default_factory=list)  # "torch 2.13.0 -> 2.14.1"

    @property
    def failed_rows(self) -> List[Row]:
        return [row for row in self.rows if row.failed]

    @property
    def ok(self) -> bool:
        return not self.failed_rows and not self.reasons


def baseline_path(baseline_dir: Path, entry: SuiteEntry) -> Path:
    return Path(baseline_dir) / entry.hardware / f"{entry.name}.json"


def oom_site(record: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Where each OOM rank failed: [{rank, step, phase}], from a summary dict or a baseline."""
    sites = []
    for rank in record.get("per_rank", []):
        oom = rank.get("oom")
        if oom:
            sites.append({"rank": rank["rank"], "step": oom.get("step"), "phase": oom.get("phase")})
    return sites


def run_record(summary: RunSummary) -> Dict[str, Any]:
    """The comparable part of a run: what a baseline stores, and what `membench compare` reads of run A."""
    data = asdict(summary)
    return {
        "config_hash": summary.config_hash,
        "environment": {**summary.versions, "device_name": summary.device_name},
        "status": summary.status,
        "world_size": summary.world_size,
        "per_rank": [
            {"rank": r["rank"], "status": r["status"], "peak_bytes": r["peak_bytes"],
             "utilization": r["utilization"], "breakdown": dict(r["breakdown"]),
             "oom": ({k: r["oom"][k] for k in ("step", "phase")} if r.get("oom") else None)}
            for r in data["per_rank"]
        ],
        "imbalance": summary.job.imbalance,
        "estimate_error_pct": worst_estimate_error(data.get("estimate")),
    }


def make_baseline(entry: SuiteEntry, summary: RunSummary, rtol: float) -> Dict[str, Any]:
    return {
        "schema_version": BASELINE_SCHEMA_VERSION,
        "name": entry.name,
        "hardware": entry.hardware,
        "overrides": list(entry.overrides),
        "definition_hash": entry.definition_hash,
        **run_record(summary),
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
    if version not in READABLE_SCHEMA_VERSIONS:
        raise BaselineError(f"baseline {path} has schema_version {version!r}, this membench reads "
                            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}; {REGENERATE}")
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


def moved_most(base_breakdown: Optional[Dict[str, int]], now_breakdown: Dict[str, int]) -> str:
    """The breakdown category whose bytes changed most between the two peaks, e.g. 'activations +1,048,576'."""
    if base_breakdown is None:
        return "n/a (baseline has no breakdown)"
    changes = {category: now_breakdown.get(category, 0) - base_breakdown.get(category, 0)
               for category in sorted(set(base_breakdown) | set(now_breakdown))}
    category, change = max(changes.items(), key=lambda item: abs(item[1]), default=("", 0))
    return f"{category} {change:+,}" if change else ""


def version_changes(base_environment: Dict[str, Any], now_versions: Dict[str, str]) -> List[str]:
    """'torch 2.13.0 -> 2.14.1' for each library whose version differs from the baseline's."""
    changes = []
    for library in VERSIONED_LIBRARIES:
        before, after = base_environment.get(library), now_versions.get(library)
        if before != after:
            changes.append(f"{library} {before or '(absent)'} -> {after or '(absent)'}")
    return changes


def compare_records(name: str, base: Dict[str, Any], summary: RunSummary,
                    tolerances: Dict[str, float]) -> Comparison:
    """Compare a run with a stored record (a baseline, or another run's `run_record`)."""
    result = Comparison()
    result.version_changes = version_changes(base.get("environment") or {}, summary.versions)
    now = asdict(summary)
    base_status, now_status = base["status"], summary.status
    if base_status != now_status:
        if base_status == "oom" and now_status == "ok":
            result.notes.append(f"{name}: improved: the baseline ran out of memory, now it fits")
        else:
            where = "; ".join(f"rank {s['rank']} step {s['step']} {s['phase']}" for s in oom_site(now))
            detail = f" at {where}" if where else (f": {summary.error}" if summary.error else "")
            result.rows.append(Row(name, "job", "status", base_status, now_status, "regressed", "", "exact",
                                   failed=True))
            result.reasons.append(f"{name}: status {base_status} -> {now_status}{detail}")
        return result
    if now_status == "oom":
        base_sites = [{k: s[k] for k in ("rank", "step", "phase")} for s in oom_site(base)]
        now_sites = oom_site(now)
        if base_sites != now_sites:
            result.rows.append(Row(name, "job", "oom site", base_sites, now_sites, "moved", "", "exact",
                                   failed=True))
        return result
    if now_status != "ok":
        return result
    if len(base["per_rank"]) != len(summary.per_rank):
        result.reasons.append(f"{name}: baseline has {len(base['per_rank'])} ranks, now "
                              f"{len(summary.per_rank)}; {REGENERATE}")
        return result
    for base_rank, now_rank in zip(base["per_rank"], summary.per_rank):
        rank = str(now_rank.rank)
        base_peak, now_peak = base_rank["peak_bytes"], now_rank.peak_bytes
        result.rows.append(Row(name, rank, "peak_bytes", base_peak, now_peak, f"{now_peak - base_peak:+,}",
                               _relative(base_peak, now_peak), f"{100 * tolerances['peak_bytes']:g}%",
                               moved_most(base_rank.get("breakdown"), now_rank.breakdown),
                               failed=_exceeds(base_peak, now_peak, tolerances["peak_bytes"], True)))
        if now_peak < base_peak:
            result.notes.append(f"{name}: rank {rank} peak shrank {_relative(base_peak, now_peak)}")
        base_util, now_util = base_rank["utilization"], now_rank.utilization
        if _exceeds(base_util, now_util, tolerances["utilization"], False):
            result.rows.append(Row(name, rank, "utilization", round(base_util, 6), round(now_util, 6),
                                   f"{now_util - base_util:+.6f}", _relative(base_util, now_util),
                                   f"{100 * tolerances['utilization']:g}%", failed=True))
    base_error, now_error = base.get("estimate_error_pct"), worst_estimate_error(now.get("estimate"))
    if base_error is not None and now_error is not None and now_error > base_error + ESTIMATE_ERROR_TOLERANCE_PP:
        result.rows.append(Row(name, "job", "estimate |error| %", base_error, now_error,
                               f"{now_error - base_error:+.2f} pp", "", f"{ESTIMATE_ERROR_TOLERANCE_PP:g} pp",
                               failed=True))
    base_imbalance, now_imbalance = base["imbalance"], summary.job.imbalance
    if _exceeds(base_imbalance, now_imbalance, tolerances["imbalance"], True):
        result.rows.append(Row(name, "job", "imbalance", round(base_imbalance, 6), round(now_imbalance, 6),
                               f"{now_imbalance - base_imbalance:+.6f}", _relative(base_imbalance, now_imbalance),
                               f"{100 * tolerances['imbalance']:g}%", failed=True))
    return result


def entry_tolerances(baseline: Dict[str, Any], rtol_override: Optional[float]) -> Dict[str, float]:
    if rtol_override is not None:
        return {metric: rtol_override for metric in METRICS}
    return {metric: float(baseline["tolerances"].get(metric, 0.05)) for metric in METRICS}


def compare(entry: SuiteEntry, baseline: Dict[str, Any], summary: RunSummary,
            rtol_override: Optional[float] = None) -> Comparison:
    """A suite entry's run against its baseline."""
    name = entry.name
    result = compare_records(name, baseline, summary, entry_tolerances(baseline, rtol_override))
    if baseline["definition_hash"] != entry.definition_hash:
        result.reasons.insert(0, f"{name}: baseline was recorded for another definition of this entry (overrides "
                                 f"{baseline.get('overrides')} vs now {entry.overrides}); if the change is intended, "
                                 f"{REGENERATE}")
    if baseline.get("config_hash") != summary.config_hash:
        result.notes.append(f"{name}: the resolved config differs from the baseline's "
                            f"({baseline.get('config_hash')} -> {summary.config_hash})")
    return result


TABLE_COLUMNS = (("entry", "entry"), ("rank", "rank"), ("metric", "metric"), ("baseline", "baseline"),
                 ("now", "now"), ("delta", "delta"), ("delta %", "delta_pct"), ("tolerance", "tolerance"),
                 ("moved most", "moved_most"), ("result", "failed"))


def _cell(row: Row, attribute: str) -> str:
    value = getattr(row, attribute)
    if attribute == "failed":
        return "FAIL" if value else "ok"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def format_rows(rows: Sequence[Row]) -> str:
    """The comparison table: entry, rank, metric, baseline, now, delta, delta %, tolerance, moved most."""
    header = tuple(title for title, _ in TABLE_COLUMNS)
    cells = [header] + [tuple(_cell(row, attribute) for _, attribute in TABLE_COLUMNS) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header))]
    lines = ["  ".join(value.ljust(width) for value, width in zip(line, widths)).rstrip() for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_comparison(result: Comparison) -> str:
    """Reasons, the table and the version changes: what a reviewer needs, in one block."""
    lines = list(result.reasons)
    if result.failed_rows and not result.reasons:
        lines.append(headline(result.failed_rows))
    if result.rows:
        lines.append(format_rows(result.rows))
    if result.version_changes:
        lines.append("versions differ from the baseline's: " + "; ".join(result.version_changes))
    return "\n".join(lines)


def headline(failed_rows: Sequence[Row]) -> str:
    """One line for pytest's short summary: which entry, how many metrics, the worst mover."""
    worst = max(failed_rows, key=lambda row: abs(_pct(row.delta_pct)))
    where = f"rank {worst.rank} " if worst.rank != "job" else ""
    change = worst.delta_pct or worst.delta
    return (f"{worst.entry}: {len(failed_rows)} metric(s) over tolerance; worst {where}{worst.metric} {change} "
            f"(tolerance {worst.tolerance})")


def _pct(text: str) -> float:
    """'+25.00%' -> 25.0; '', 'n/a' -> 0 (rows such as a status change carry no percentage)."""
    try:
        return float(text.rstrip("%"))
    except ValueError:
        return 0.0


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
