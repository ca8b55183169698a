"""Results as one table, for notebooks and `membench export`.

    from bench.report.frame import load_frame
    runs = load_frame("results/runs/sweep-<id>")              # one row per run and rank
    runs.groupby("workload.batch_size")["peak_bytes"].max()     # a sweep by one of its axes

`load_frame(paths)` reads every summary.json under the paths (runs, sweeps, results roots; the same
loader as `membench report`) into a pandas DataFrame with one row per run and rank (a run that recorded
no rank, e.g. an invalid config, is one row with an empty `rank`). Its columns:

- the run: run_id, sweep_id, point (its directory in a sweep), run_dir, started_at, wall_s, mode,
  status, exit_code, error, oom_ranks, workload, hardware, sharding, model, world_size, device_type,
  device_name, model_backend, config_hash, schema_version, sweep_axes (the keys its sweep varied);
- the rank: rank, rank_status, device, capacity_bytes, peak_bytes, peak_allocated_bytes,
  peak_reserved_bytes, peak_device_used_bytes, utilization, headroom_bytes, peak_step, peak_phase,
  build_peak_bytes, warmup_peak_bytes, recorder, rank_error, oom_step, oom_phase, oom_requested_bytes,
  `breakdown.<category>` (bench.results.schema.CATEGORIES), `alloc_stats.<counter>` (CUDA caching
  allocator), `nvml.<field>`;
- the prediction: predicted_peak_bytes, prediction_error_pct (positive = over-estimate),
  torchrec_predicted_peak_bytes, torchrec_error_pct, estimate_verdict (plan mode);
- the job: `job.<stat>` (utilization min/mean/max, imbalance, step_time_ms_p50, samples_per_s, ...);
- what produced it: `version.<package>`, `alloc_conf.<setting>` (the allocator settings the ranks ran with);
- the resolved config (config.yaml) flattened with dots: `workload.batch_size`, `hardware.capacity_gib`,
  `sharding.type`, `allocator.expandable_segments`, ... (lists as JSON text; a top-level key that a
  column above already names is kept as `config.<key>`). A config group added later (a `pipeline`
  group, say) becomes columns the same way, with no change here.

`load_timelines(paths)` is the ranks' timelines as one long table: run_id, sweep_id, point, rank, then
the `timeline_rank<R>.csv` columns (time_s, step, phase, in_use_bytes, phase_peak_bytes, reserved_bytes,
device_used_bytes). Join it with load_frame on (run_id, rank).

A file that cannot be read (a corrupt summary, a foreign file among the paths, a torn timeline) is
named in a warning on stderr and skipped; when nothing is left, `NoResults` says so in one line.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from bench.report.loading import Run, flatten, load_runs
from bench.report.emulated_jobs import merge_emulated_ranks
from bench.report.messages import ReportError, WarningLog
from bench.results.schema import CATEGORIES, RankResult

PathLike = Union[str, "os.PathLike[str]"]
FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".parquet": "parquet"}
# config.yaml keys that say where a run was written, not what it measured (run_dir is a column)
WHERE_KEYS = frozenset({"results_dir", "run_id"})
# group columns beside workload and hardware (which the summary names): config key of the choice made
GROUP_CHOICE_KEYS = {"sharding": "sharding.type", "model": "model.backend"}


class ExportError(ReportError):
    """A table that cannot be written; the message is the one line printed on stderr."""


def _as_paths(paths: Union[PathLike, Iterable[PathLike]]) -> List[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    return [Path(p) for p in paths]


def _cell(value: Any) -> Any:
    """Lists and dicts as compact JSON text, so every format (CSV, parquet) holds the cell."""
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return value


def read_typed_config(run_dir: Path) -> Dict[str, Any]:
    """config.yaml flattened with typed values (loading's Run.config holds strings, for comparing).
    An unreadable one is empty here; the loader has already warned about it."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception:
        return {}
    return {key: _cell(value) for key, value in flatten(data).items()} if isinstance(data, dict) else {}


def _run_columns(run: Run, config: Dict[str, Any]) -> Dict[str, Any]:
    s = run.summary
    columns: Dict[str, Any] = {
        "run_id": s.run_id,
        "sweep_id": s.sweep_id or (run.sweep.sweep_id if run.sweep else None),
        "point": run.dir.name if run.sweep else None,
        "run_dir": str(run.dir),
        "started_at": s.started_at, "wall_s": s.wall_s, "mode": s.mode, "status": s.status,
        "exit_code": s.exit_code, "error": s.error, "oom_ranks": _cell(list(s.oom_ranks)),
        "workload": s.workload, "hardware": s.hardware,
    }
    for group, key in GROUP_CHOICE_KEYS.items():
        columns[group] = config.get(key, run.overrides.get(group))
    if columns["model"] is None:
        columns["model"] = s.model_backend
    columns.update({"world_size": s.world_size, "device_type": s.device_type, "device_name": s.device_name,
                    "model_backend": s.model_backend, "config_hash": s.config_hash,
                    "schema_version": s.schema_version,
                    "sweep_axes": ",".join(run.sweep.varying) if run.sweep else None})
    return columns


def _rank_columns(rank: RankResult) -> Dict[str, Any]:
    oom = rank.oom or {}
    columns: Dict[str, Any] = {
        "rank": rank.rank, "rank_status": rank.status, "device": rank.device,
        "capacity_bytes": rank.capacity_bytes, "peak_bytes": rank.peak_bytes,
        "peak_allocated_bytes": rank.peak_allocated_bytes, "peak_reserved_bytes": rank.peak_reserved_bytes,
        "peak_device_used_bytes": rank.peak_device_used_bytes, "utilization": rank.utilization,
        "headroom_bytes": rank.headroom_bytes, "peak_step": rank.peak_step, "peak_phase": rank.peak_phase,
        "build_peak_bytes": rank.build_peak_bytes, "warmup_peak_bytes": rank.warmup_peak_bytes,
        "recorder": rank.recorder, "rank_error": rank.error,
        "oom_step": oom.get("step"), "oom_phase": oom.get("phase"), "oom_requested_bytes": oom.get("requested_bytes"),
    }
    breakdown = rank.breakdown or {}
    # every category, in schema order, even where this run has none (a column per category, always)
    for category in [*CATEGORIES, *sorted(set(breakdown) - set(CATEGORIES))]:
        columns[f"breakdown.{category}"] = breakdown.get(category)
    for prefix, values in (("alloc_stats", rank.allocator), ("nvml", rank.nvml)):
        for key, value in flatten(values or {}).items():
            columns[f"{prefix}.{key}"] = _cell(value)
    return columns


def _prediction_columns(estimate: Optional[Dict[str, Any]], rank: Optional[int]) -> Dict[str, Any]:
    estimate = estimate or {}

    def at(key: str) -> Any:
        values = estimate.get(key)
        return values[rank] if isinstance(values, list) and rank is not None and 0 <= rank < len(values) else None

    return {"predicted_peak_bytes": at("per_rank_peak"), "prediction_error_pct": at("error_pct"),
            "torchrec_predicted_peak_bytes": at("torchrec_per_rank_peak"),
            "torchrec_error_pct": at("torchrec_error_pct"),
            "estimate_verdict": estimate.get("verdict")}


def run_rows(run: Run) -> List[Dict[str, Any]]:
    """The rows of one run: one per rank (one with an empty rank when it recorded none)."""
    s = run.summary
    config = read_typed_config(run.dir)
    shared = _run_columns(run, config)
    tail: Dict[str, Any] = {}
    for key, value in vars(s.job).items():
        tail[f"job.{key}"] = value
    for package, version in sorted((s.versions or {}).items()):
        tail[f"version.{package}"] = version
    for key, value in flatten(s.allocator or {}).items():
        tail[f"alloc_conf.{key}"] = _cell(value)
    named = set(shared) | set(tail) | {"rank"}
    for key, value in sorted(config.items()):
        if key in WHERE_KEYS:
            continue
        tail[f"config.{key}" if key in named else key] = value
    # a swept key the config does not hold (a `+key=value` override): the sweep index has it
    for key, value in run.overrides.items():
        if key not in tail and key not in shared:
            tail[key] = value
    ranks: List[Optional[RankResult]] = list(s.per_rank) or [None]
    rows = []
    for rank in ranks:
        row = dict(shared)
        if rank is None:
            row["rank"] = None
        else:
            row.update(_rank_columns(rank))
        row.update(_prediction_columns(s.estimate, None if rank is None else rank.rank))
        row.update(tail)
        rows.append(row)
    return rows


# column sections, in table order; names without one of these prefixes are the run's and rank's columns,
# or (after them) the config's
SECTIONS = ("breakdown.", "alloc_stats.", "nvml.", "predicted_peak_bytes", "prediction_error_pct",
            "torchrec_predicted_peak_bytes", "torchrec_error_pct", "estimate_verdict", "job.", "version.",
            "alloc_conf.")
FIXED_COLUMNS = frozenset({
    "run_id", "sweep_id", "point", "run_dir", "started_at", "wall_s", "mode", "status", "exit_code", "error",
    "oom_ranks", "workload", "hardware", "sharding", "model", "world_size", "device_type", "device_name",
    "model_backend", "config_hash", "schema_version", "sweep_axes", "rank", "rank_status", "device",
    "capacity_bytes", "peak_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_used_bytes",
    "utilization", "headroom_bytes", "peak_step", "peak_phase", "build_peak_bytes", "warmup_peak_bytes",
    "recorder", "rank_error", "oom_step", "oom_phase", "oom_requested_bytes"})


def _section(name: str) -> int:
    if name in FIXED_COLUMNS:
        return 0
    for number, prefix in enumerate(SECTIONS, start=1):
        if name.startswith(prefix):
            return number
    return len(SECTIONS) + 1


def typed_frame(rows: Sequence[Dict[str, Any]]):
    """A DataFrame whose integer columns stay integers where some rows lack a value (pandas' nullable
    Int64; plain construction would turn them into floats, and CSV would print 1.0e9 for bytes)."""
    import pandas as pd

    seen: Dict[str, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row))
    # a column only later runs have (a newer counter, a new config key) joins its own section
    order = sorted(seen, key=_section)
    data = {}
    for name in order:
        values = [row.get(name) for row in rows]
        present = [v for v in values if v is not None]
        if present and all(isinstance(v, bool) for v in present):
            data[name] = pd.array(values, dtype="boolean")
        elif present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
            data[name] = pd.array(values, dtype="Int64")
        elif present and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
            data[name] = pd.array([float("nan") if v is None else float(v) for v in values], dtype="float64")
        else:
            data[name] = pd.array(values, dtype="object")
    return pd.DataFrame(data, columns=order)


def load_frame(paths: Union[PathLike, Iterable[PathLike]], log: Optional[WarningLog] = None):
    """One row per run and rank of every summary.json under `paths` (see the module docstring)."""
    log = log if log is not None else WarningLog("membench export")
    runs, _ = load_runs(_as_paths(paths), skip=None, log=log, skip_bad_paths=True)
    runs = merge_emulated_ranks(runs)  # a sweep over emulate.rank: one job's rows
    return typed_frame([row for run in runs for row in run_rows(run)])


def load_timelines(paths: Union[PathLike, Iterable[PathLike]], log: Optional[WarningLog] = None):
    """Every rank's timeline under `paths` as one long table (run_id, sweep_id, point, rank, time_s, ...)."""
    import pandas as pd

    log = log if log is not None else WarningLog("membench export")
    runs, _ = load_runs(_as_paths(paths), skip=None, log=log, skip_bad_paths=True)
    runs = merge_emulated_ranks(runs)
    parts = []
    for run in runs:
        for rank, timeline in run.timelines().items():
            sweep_id = run.summary.sweep_id or (run.sweep.sweep_id if run.sweep else None)
            part = timeline.copy()
            part.insert(0, "rank", rank)
            part.insert(0, "point", run.dir.name if run.sweep else None)
            part.insert(0, "sweep_id", sweep_id)
            part.insert(0, "run_id", run.summary.run_id)
            parts.append(part)
    if not parts:
        where = ", ".join(map(str, _as_paths(paths)))
        raise ExportError(f"{log.prog}: no timeline_rank*.csv under {where} ({len(runs)} runs read); "
                          f"timelines are recorded by training runs with record.timeline=true")
    return pd.concat(parts, ignore_index=True)


def table_format(out: Path) -> str:
    """csv, jsonl or parquet, from the file name; a one-line error names the choices."""
    suffix = Path(out).suffix.lower()
    if suffix not in FORMATS:
        raise ExportError(f"membench export: --out {out}: unknown format {suffix or '(no suffix)'!r}; "
                          f"name the file .csv, .jsonl or .parquet")
    return FORMATS[suffix]


def require_parquet_engine() -> None:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ExportError("membench export: .parquet needs pyarrow (`pip install pyarrow`); or write "
                          ".csv or .jsonl") from None


def _parquet_safe(frame):
    """Parquet wants one type per column: a column mixing types (a config key that is a number in one
    run and text in another) is written as text."""
    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype == object:
            kinds = {type(v) for v in frame[name] if v is not None and v == v}
            if len(kinds) > 1:
                frame[name] = frame[name].map(lambda v: None if v is None or v != v else str(v))
    return frame


def write_table(frame, out: Path) -> str:
    """Write `frame` to `out` in the format its suffix names, atomically (a reader never sees half a
    file); returns the format."""
    out = Path(out)
    kind = table_format(out)
    if kind == "parquet":
        require_parquet_engine()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as err:
        raise ExportError(f"membench export: cannot write {out} ({err.strerror or err}); "
                          f"choose a writable --out") from None
    os.close(fd)
    try:
        if kind == "csv":
            frame.to_csv(tmp, index=False)
        elif kind == "jsonl":
            frame.to_json(tmp, orient="records", lines=True, date_format="iso")
        else:
            _parquet_safe(frame).to_parquet(tmp, index=False)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return kind
