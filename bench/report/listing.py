"""What `membench ls` lists: past runs and sweeps, newest first, one row each.

A sweep (results/runs/sweep-<id>/) or a regression-suite session (suite-<time>/) is one row over its
points: the worst status with a count per status, the largest rank peak and utilization of any point.
Filters select runs first; a sweep then stands for the points that matched.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from bench.report.loading import Run
from bench.results.schema import SEVERITY, Status


@dataclass(frozen=True)
class RunFilter:
    """Which runs to list; an empty field lets every run through (values compare case-insensitively)."""
    statuses: Tuple[str, ...] = ()
    workloads: Tuple[str, ...] = ()
    hardware: Tuple[str, ...] = ()
    modes: Tuple[str, ...] = ()

    def matches(self, run: Run) -> bool:
        s = run.summary
        return all(not wanted or str(value).lower() in wanted
                   for wanted, value in ((self.statuses, s.status), (self.workloads, s.workload),
                                         (self.hardware, s.hardware), (self.modes, s.mode)))

    def describe(self) -> str:
        """The filters as their flags, for the message when nothing matches."""
        parts = [f"--{flag} {','.join(values)}" for flag, values in
                 (("status", self.statuses), ("workload", self.workloads), ("hardware", self.hardware),
                  ("mode", self.modes)) if values]
        return " ".join(parts)

    @classmethod
    def of(cls, statuses=(), workloads=(), hardware=(), modes=()) -> "RunFilter":
        def normal(values) -> Tuple[str, ...]:
            return tuple(v.strip().lower() for item in values or () for v in str(item).split(",") if v.strip())
        return cls(normal(statuses), normal(workloads), normal(hardware), normal(modes))


@dataclass
class ListingRow:
    """One line of `membench ls`: a run, or a sweep / suite over the points that matched."""
    id: str
    kind: str  # run | sweep | suite | group
    started_at: str  # ISO time the (first) run started
    workloads: List[str]
    hardware: List[str]
    world_sizes: List[int]
    statuses: Dict[str, int]  # status -> number of runs
    max_peak_bytes: Optional[int]
    max_utilization: Optional[float]
    path: Path
    runs: int = 1  # runs listed (that matched)
    emulated_ranks: List[int] = field(default_factory=list)  # emulate.*: the ranks its runs played
    total_runs: int = 1  # runs the sweep holds
    run_ids: List[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """The worst status; a sweep's with its count per status ("oom (3 ok, 1 oom)")."""
        known = [s for s in self.statuses if s in {v.value for v in Status}]
        worst = max(known, key=lambda s: SEVERITY.index(Status(s))) if known else next(iter(self.statuses), "?")
        if self.kind == "run":
            return worst
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items(),
                                                          key=lambda item: _severity(item[0])))
        return f"{worst} ({counts})"


def _severity(status: str) -> int:
    try:
        return SEVERITY.index(Status(status))
    except ValueError:
        return len(SEVERITY)


def started(text: str) -> datetime:
    """The run's start time for ordering; one without a readable time sorts oldest."""
    try:
        moment = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return datetime.min
    return moment.replace(tzinfo=None) - (moment.utcoffset() or timedelta(0))  # as UTC


def group_of(run: Run) -> Optional[Tuple[str, str, Path]]:
    """(id, kind, directory) of the sweep or suite session the run belongs to; None for a lone run."""
    if run.sweep is not None:
        return run.sweep.sweep_id, "sweep", run.sweep.dir
    if run.summary.sweep_id:
        return run.summary.sweep_id, "sweep", run.dir.parent
    if "/" in run.summary.run_id:  # the regression harness: suite-<time>/<entry>
        group = run.summary.run_id.split("/")[0]
        return group, "suite" if group.startswith("suite-") else "group", run.dir.parent
    return None


def _run_peak(run: Run) -> Tuple[Optional[int], Optional[float]]:
    ranks = run.summary.per_rank
    if not ranks:
        return None, None
    return max(r.peak_bytes for r in ranks), max(r.utilization for r in ranks)


def _max(values) -> Optional[float]:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def row_of(runs: List[Run], ident: str, kind: str, path: Path, total_runs: int) -> ListingRow:
    statuses: Dict[str, int] = {}
    for run in runs:
        statuses[run.summary.status] = statuses.get(run.summary.status, 0) + 1
    peaks = [_run_peak(run) for run in runs]
    first = min(runs, key=lambda r: started(r.summary.started_at))

    def distinct(values) -> list:
        return list(dict.fromkeys(values))

    return ListingRow(
        id=ident, kind=kind, started_at=first.summary.started_at,
        workloads=distinct(r.summary.workload for r in runs), hardware=distinct(r.summary.hardware for r in runs),
        world_sizes=sorted({r.summary.world_size for r in runs if r.summary.world_size}), statuses=statuses,
        max_peak_bytes=_max(p for p, _ in peaks), max_utilization=_max(u for _, u in peaks), path=path,
        runs=len(runs), total_runs=total_runs, run_ids=[r.summary.run_id for r in runs],
        emulated_ranks=sorted({r.summary.emulated["rank"] for r in runs if r.summary.emulated}))


def listing_rows(runs: Sequence[Run], selection: RunFilter = RunFilter(), flat: bool = False) -> List[ListingRow]:
    """The rows to list, newest first: lone runs and sweeps (every run on its own with `flat`)."""
    totals: Dict[str, int] = {}
    for run in runs:
        group = group_of(run)
        if group:
            totals[group[0]] = totals.get(group[0], 0) + 1
    rows: List[ListingRow] = []
    grouped: Dict[str, Tuple[str, Path, List[Run]]] = {}
    for run in runs:
        if not selection.matches(run):
            continue
        group = None if flat else group_of(run)
        if group is None:
            rows.append(row_of([run], run.summary.run_id, "run", run.dir, 1))
            continue
        ident, kind, path = group
        grouped.setdefault(ident, (kind, path, []))[2].append(run)
    for ident, (kind, path, members) in grouped.items():
        rows.append(row_of(members, ident, kind, path, totals.get(ident, len(members))))
    rows.sort(key=lambda row: (started(row.started_at), row.id), reverse=True)
    return rows
