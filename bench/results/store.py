"""Where results live and how they are read and written: atomic JSON, the run directory's files, the
sweep index. A file that cannot be used is a one-line `ResultsError` naming it and what to do."""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List

from bench.results.schema import READABLE_SCHEMA_VERSIONS, JobStats, RankResult, RunSummary

SWEEP_INDEX = "sweep.json"


class ResultsError(ValueError):
    """A results file that cannot be used: one line naming the file and what to do."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write via a temp file in the same directory + rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")


def rank_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.json"


def timeline_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"timeline_rank{rank}.csv"


def progress_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f".progress_rank{rank}"


def heartbeat(run_dir: Path, rank: int) -> None:
    """Mark progress for the launcher's watchdog (the file's mtime is what counts)."""
    progress_file(run_dir, rank).touch()


def write_rank_result(run_dir: Path, result: RankResult) -> None:
    atomic_write_json(rank_file(run_dir, result.rank), asdict(result))


def read_json(path: Path) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ResultsError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ResultsError(f"{path}: not valid JSON ({err}); delete it or re-run the workload") from None


def read_json_object(path: Path) -> Dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, found {type(data).__name__}; re-run the workload")
    return data


def load_rank_result(path: Path) -> RankResult:
    data = read_json_object(path)
    try:
        return RankResult(**data)
    except TypeError as err:
        raise ResultsError(f"{path}: unexpected fields ({err}); re-run the workload") from None


def write_summary(run_dir: Path, summary: RunSummary) -> None:
    atomic_write_json(Path(run_dir) / "summary.json", asdict(summary))


def load_summary(path: Path) -> RunSummary:
    """Load a summary.json (or a run directory); unknown schema versions fail with one line."""
    path = Path(path)
    if path.is_dir():
        path = path / "summary.json"
    data = read_json_object(path)
    version = data.get("schema_version")
    if version not in READABLE_SCHEMA_VERSIONS:
        raise ResultsError(f"{path}: schema_version {version!r} is not supported (this membench reads "
                           f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}); re-run the workload with this version")
    try:
        ranks = [RankResult(**rank) for rank in data.pop("per_rank", [])]
        job = JobStats(**data.pop("job", {}))
        return RunSummary(per_rank=ranks, job=job, **data)
    except TypeError as err:
        raise ResultsError(f"{path}: unexpected fields ({err}); re-run the workload") from None


def is_sweep_dir(path: Path) -> bool:
    return (Path(path) / SWEEP_INDEX).is_file()


def read_sweep_index(sweep_dir: Path) -> Dict[str, Any]:
    """A sweep's sweep.json: {"sweep_id", "runs": [{run_id, status, overrides, dir, error}]}, checked."""
    path = Path(sweep_dir) / SWEEP_INDEX
    data = read_json_object(path)
    runs = data.get("runs")
    if not isinstance(runs, list) or not all(isinstance(run, dict) and "dir" in run for run in runs):
        raise ResultsError(f"{path}: `runs` must be a list of points with a `dir`; re-run the sweep")
    return data


def record_in_sweep(sweep_dir: Path, summary: RunSummary, overrides: List[str]) -> None:
    """sweep.json lists every point so far; rewritten atomically after each point, under a lock because
    launchers like submitit finish points in parallel processes."""
    index_path = Path(sweep_dir) / SWEEP_INDEX
    with open(Path(sweep_dir) / ".sweep.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = read_json(index_path) if index_path.exists() else {"sweep_id": Path(sweep_dir).name, "runs": []}
        index["runs"].append({"run_id": summary.run_id, "status": summary.status, "overrides": overrides,
                              "dir": summary.run_id.split("/")[-1], "error": summary.error})
        index["runs"].sort(key=lambda run: int(run["dir"]) if run["dir"].isdigit() else run["dir"])
        atomic_write_json(index_path, index)


def sweep_statuses(sweep_dir: Path) -> List[str]:
    """The status of every point a sweep has recorded (none when it has no index yet)."""
    if not is_sweep_dir(sweep_dir):
        return []
    return [str(run.get("status")) for run in read_sweep_index(sweep_dir)["runs"]]
