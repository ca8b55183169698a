"""Loading results: the summary.json files under the given paths, their runs and sweeps, and the labels
and sweep axes derived from the runs' configs."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from bench.report.messages import NoResults, WarningLog
from bench.report.style import key_part
from bench.results.store import ResultsError, load_summary
from bench.results.schema import RunSummary

# Keys that never describe what a run measured
IGNORED_KEYS = frozenset({"results_dir", "run_id", "timeout_s", "hydra.verbose"})
TIMELINE_COLUMNS = frozenset({"step", "phase", "in_use_bytes", "phase_peak_bytes"})


def natural_key(text: str) -> List[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def flatten(data: Any, prefix: str = "") -> Dict[str, Any]:
    flat: Dict[str, Any] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
    else:
        flat[prefix[:-1]] = data
    return flat


def hashable(value: Any) -> Any:
    """A comparable form: overrides are strings ("512"), config values typed (512); both compare as "512"."""
    if value is None:
        return None
    if isinstance(value, (list, dict)):
        return json.dumps(value, sort_keys=True).replace(" ", "")
    if isinstance(value, str) and value.startswith("["):
        return value.replace(" ", "")
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_overrides(items: Iterable[str]) -> Dict[str, str]:
    parsed: Dict[str, str] = {}
    for item in items:
        if "=" not in str(item):
            continue
        key, value = str(item).split("=", 1)
        key = key.lstrip("+~")
        if key in IGNORED_KEYS or key.startswith("hydra."):
            continue
        parsed[key] = value
    return parsed


@dataclass
class Sweep:
    dir: Path
    sweep_id: str
    # dir name of each point -> sweep.json entry (may list points whose summary is missing)
    points: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    has_index: bool = False
    varying: List[str] = field(default_factory=list)


@dataclass
class Run:
    dir: Path
    summary: RunSummary
    config: Dict[str, Any]
    sweep: Optional[Sweep] = None
    overrides: Dict[str, str] = field(default_factory=dict)
    label: str = ""
    # timelines load lazily, while figures are drawn: their warnings still belong to this report
    log: WarningLog = field(default_factory=WarningLog, repr=False, compare=False)
    _timelines: Optional[Dict[int, Any]] = None

    @property
    def s(self) -> RunSummary:
        return self.summary

    def value(self, key: str) -> Any:
        """The value of a config key (or group) for labels and sweep axes: for a group (workload=...)
        the name the run resolved to (workload.name may be overridden), else the sweep's override."""
        special = {"mode": self.s.mode, "workload": self.s.workload, "hardware": self.s.hardware,
                   "world_size": self.s.world_size or None, "sharding": self.config.get("sharding.type")}
        if special.get(key) is not None:
            return special[key]
        if key in self.overrides:
            return self.overrides[key]
        if key in self.config:
            return self.config[key]
        if f"{key}.name" in self.config:
            return self.config[f"{key}.name"]
        return None

    def measured_ranks(self):
        return [r for r in self.s.per_rank if r.status == "ok"]

    def timelines(self) -> Dict[int, Any]:
        if self._timelines is None:
            import pandas as pd

            self._timelines = {}
            for path in sorted(self.dir.glob("timeline_rank*.csv"), key=lambda p: natural_key(p.name)):
                rank = int(re.findall(r"\d+", path.stem)[-1])
                try:
                    frame = pd.read_csv(path)
                except Exception as err:  # empty or torn file: report the rest
                    self.log.warn(f"skipping timeline {path}: {err.__class__.__name__}: {err}")
                    continue
                if len(frame) and TIMELINE_COLUMNS <= set(frame.columns):
                    self._timelines[rank] = frame
        return self._timelines


def measured_ok_runs(runs: List[Run]) -> List[Run]:
    return [r for r in runs if r.s.mode != "plan" and r.s.status == "ok" and r.measured_ranks()]


def oom_in_use(rank) -> int:
    """Bytes in use when the allocation failed. `stats` are taken after the error unwound (temporaries
    freed), so the rank's peak counts when it was reached in the failing step and phase."""
    event = rank.oom or {}
    in_use = int((event.get("stats") or {}).get("live_bytes", 0) or 0)
    if rank.peak_step == event.get("step") and rank.peak_phase == event.get("phase"):
        in_use = max(in_use, rank.peak_bytes)
    return in_use


def find_summary_files(path: Path, skip: Optional[Path], log: WarningLog) -> List[Path]:
    prog = log.prog
    if path.is_file():
        if path.name == "summary.json":
            return [path]
        raise NoResults(f"{prog}: {path} is not a results directory or summary.json; give a run, sweep or "
                        f"results directory")
    if not path.exists():
        raise NoResults(f"{prog}: {path} does not exist; run `membench run` first or check the path")
    try:
        os.listdir(path)
    except OSError as err:
        raise NoResults(f"{prog}: cannot read {path} ({err.strerror or err}); no summary.json read; "
                        f"check its permissions") from None
    found: List[Path] = []

    def on_error(err: OSError) -> None:
        log.warn(f"cannot read {err.filename} ({err.strerror}); skipped")

    for root, dirs, files in os.walk(path, onerror=on_error):
        root_path = Path(root)
        dirs[:] = sorted((d for d in dirs if not d.startswith(".")
                          and (skip is None or (root_path / d).resolve() != skip)), key=natural_key)
        if "summary.json" in files:
            found.append(root_path / "summary.json")
    return found


def load_config(run_dir: Path, log: WarningLog) -> Dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
    except Exception as err:
        log.warn(f"{path}: unreadable config ({err.__class__.__name__}); labels and sweep axes use the summary")
        return {}
    return {k: hashable(v) for k, v in flatten(data).items()} if isinstance(data, dict) else {}


def load_sweep(sweep_dir: Path, log: WarningLog) -> Sweep:
    sweep = Sweep(dir=sweep_dir, sweep_id=sweep_dir.name)
    index = sweep_dir / "sweep.json"
    if index.exists():
        try:
            data = json.loads(index.read_text())
            sweep.sweep_id = str(data.get("sweep_id") or sweep_dir.name)
            for entry in data.get("runs", []):
                name = str(entry.get("dir") or str(entry.get("run_id", "")).split("/")[-1])
                sweep.points[name] = entry
            sweep.has_index = True
        except (OSError, ValueError, AttributeError, TypeError) as err:
            log.warn(f"{index}: unreadable sweep index ({err.__class__.__name__}); sweep axes come from configs")
    return sweep


def summary_files(paths: Sequence[Path], skip: Optional[Path], log: WarningLog,
                  skip_bad_paths: bool = False) -> List[Path]:
    """Every summary.json under the paths, once each, in the order found. With skip_bad_paths, a path
    that is missing, unreadable or not results is a warning instead of the end (the others still count)."""
    files: List[Path] = []
    seen = set()
    for path in paths:
        try:
            found_here = find_summary_files(path, skip, log)
        except NoResults as err:
            if not skip_bad_paths:
                raise
            log.warn(f"{str(err).split(': ', 1)[-1]} (skipped)")
            continue
        for found in found_here:
            key = found.resolve()
            if key not in seen:
                seen.add(key)
                files.append(found)
    return files


def load_run(path: Path, sweeps: Dict[Path, Sweep], log: WarningLog) -> Optional[Run]:
    """The run of one summary.json (None when unreadable), attached to its sweep (added to `sweeps`)."""
    try:
        summary = load_summary(path)
    except ResultsError as err:
        log.warn(f"skipping {path}: {err}")
        return None
    except Exception as err:  # a summary with fields of the wrong shape
        log.warn(f"skipping {path}: {err.__class__.__name__}: {err}")
        return None
    run_dir = path.parent
    run = Run(dir=run_dir, summary=summary, config=load_config(run_dir, log), log=log)
    parent = run_dir.parent
    if (parent / "sweep.json").exists() or (summary.sweep_id and parent.name == summary.sweep_id):
        sweep = sweeps.get(parent.resolve())
        if sweep is None:
            sweep = sweeps[parent.resolve()] = load_sweep(parent, log)
        run.sweep = sweep
        entry = sweep.points.get(run_dir.name)
        if entry:
            run.overrides = parse_overrides(entry.get("overrides") or [])
    return run


def load_runs(paths: Sequence[Path], skip: Optional[Path], log: Optional[WarningLog] = None,
              skip_bad_paths: bool = False) -> Tuple[List[Run], List[Sweep]]:
    log = log if log is not None else WarningLog()
    files = summary_files(paths, skip, log, skip_bad_paths)
    if not files:
        where = ", ".join(str(p) for p in paths)
        raise NoResults(f"{log.prog}: no summary.json under {where}; run `membench run` first")
    runs: List[Run] = []
    sweeps: Dict[Path, Sweep] = {}
    for path in files:
        run = load_run(path, sweeps, log)
        if run is not None:
            runs.append(run)
    if not runs:
        where = ", ".join(str(p) for p in paths)
        raise NoResults(f"{log.prog}: no readable summary.json under {where} ({len(files)} skipped as corrupt); "
                        f"run `membench run` first")
    runs.sort(key=lambda r: natural_key(str(r.dir)))
    for sweep in sweeps.values():
        members = [r for r in runs if r.sweep is sweep]
        sweep.varying = sweep_varying_keys(sweep, members)
    assign_labels(runs)
    return runs, sorted(sweeps.values(), key=lambda s: natural_key(str(s.dir)))


def independent_keys(candidates: Sequence[str], rows: Sequence[Callable[[str], Any]]) -> List[str]:
    """Keys, in order, that each split the rows further (drops keys determined by earlier ones)."""
    chosen: List[str] = []
    combos = 1
    for key in candidates:
        values = {hashable(value(key)) for value in rows} - {None}
        if len(values) < 2:
            continue
        together = {tuple(hashable(value(k)) for k in [*chosen, key]) for value in rows}
        if len(together) > combos:
            chosen.append(key)
            combos = len(together)
    return chosen


def sweep_varying_keys(sweep: Sweep, members: List[Run]) -> List[str]:
    if sweep.has_index and sweep.points:
        parsed = [parse_overrides(p.get("overrides") or []) for p in sweep.points.values()]
        order: List[str] = []
        for overrides in parsed:
            order += [k for k in overrides if k not in order]
        return independent_keys(order, [lambda k, o=o: o.get(k) for o in parsed])
    keys = sorted({k for run in members for k in run.config if k not in IGNORED_KEYS})
    first = [k for k in ("workload.name", "sharding.type", "hardware.name") if k in keys]
    return independent_keys(first + [k for k in keys if k not in first], [r.value for r in members])


def assign_labels(runs: List[Run]) -> None:
    """Short labels from what differs between the runs of each mode (train, plan): groups first, then
    swept keys, then other config keys until the labels are unique."""
    modes: Dict[str, List[Run]] = {}
    for run in runs:
        modes.setdefault(run.s.mode, []).append(run)
    for members in modes.values():
        assign_labels_within(members)


def labels_for(runs: List[Run], keys: List[str]) -> List[str]:
    labels = []
    for r in runs:
        parts = [key_part(k, r.value(k)) for k in keys if r.value(k) is not None]
        labels.append(" · ".join(parts) or f"{r.s.workload} {r.s.status} ({r.s.run_id.split('/')[-1]})")
    return labels


def assign_labels_within(runs: List[Run]) -> None:
    sweep_keys: List[str] = []
    for run in runs:
        if run.sweep:
            sweep_keys += [k for k in run.sweep.varying if k not in sweep_keys]
    primary = ["workload", "sharding", "hardware", "world_size"]
    primary += [k for k in sweep_keys if k not in primary and k not in
                ("workload.name", "sharding.type", "hardware.name")]
    keys = independent_keys(primary, [r.value for r in runs])
    labels = labels_for(runs, keys)
    if len(set(labels)) < len(runs):
        others = sorted({k for r in runs for k in r.config if k not in IGNORED_KEYS and
                         not k.startswith(("workload.name", "sharding.type", "hardware.name"))})
        extra = [k for k in independent_keys(keys + others, [r.value for r in runs]) if k not in keys]
        for key in extra[:3]:
            keys.append(key)
            labels = labels_for(runs, keys)
            if len(set(labels)) == len(runs):
                break
    if not keys:
        labels = [f"{r.s.workload} · {r.value('sharding') or r.s.hardware}" for r in runs]
    counts: Dict[str, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    for run, label in zip(runs, labels):
        run.label = label if counts[label] == 1 else f"{label} ({run.s.run_id.split('/')[-1]})"
