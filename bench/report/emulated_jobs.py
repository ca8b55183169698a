"""A sweep over emulate.rank read as the job it emulates: `membench run -m emulate.rank=0,1,2,3
emulate.world_size=4` measures each rank of one 4-rank job in a process of its own; the report and the
export see one run whose ranks are the points' ranks (imbalance, utilization and P10/P50/P90 over them).
"""
from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from typing import Any, Dict, List, Tuple

from bench.planning.predict import score
from bench.report.loading import Run, natural_key
from bench.results.schema import Status, exit_code, job_stats, worst_status

RANK_KEY = "emulate.rank"


@dataclasses.dataclass
class EmulatedJob(Run):
    """The job a set of emulated ranks measured: its timelines are its members' (one rank's each)."""
    members: List[Run] = dataclasses.field(default_factory=list)

    def timelines(self) -> Dict[int, Any]:
        if self._timelines is None:
            self._timelines = {rank: frame for member in self.members for rank, frame in member.timelines().items()}
        return self._timelines


def _job_key(run: Run) -> Tuple:
    """What the ranks of one job share: everything in its config but the rank (and the run id)."""
    config = {key: value for key, value in run.config.items() if key not in (RANK_KEY, "run_id")}
    sweep = run.sweep.dir if run.sweep is not None else run.dir.parent
    return (str(sweep), run.summary.world_size, tuple(sorted(config.items())))


def merge_emulated_ranks(runs: List[Run]) -> List[Run]:
    """`runs` with each set of emulated runs of distinct ranks of one job (two or more) replaced by one run."""
    groups: Dict[Tuple, List[Run]] = defaultdict(list)
    kept: List[Run] = []
    for run in runs:
        (groups[_job_key(run)] if run.summary.emulated and run.config else kept).append(run)
    for members in groups.values():
        ranks = [member.summary.emulated["rank"] for member in members]
        if len(members) < 2 or len(set(ranks)) < len(ranks):
            kept.extend(members)  # one rank, or the same rank measured twice: not one job's ranks
        else:
            kept.append(merged_job(members))
    return sorted(kept, key=lambda run: natural_key(str(run.dir)))


def merged_job(members: List[Run]) -> Run:
    """One run of the job whose ranks `members` measured one each."""
    members = sorted(members, key=lambda member: member.summary.emulated["rank"])
    first = members[0].summary
    per_rank = sorted((rank for member in members for rank in member.summary.per_rank), key=lambda r: r.rank)
    status = worst_status(member.summary.status for member in members)  # a job's status: its worst rank's
    config = members[0].config
    job = job_stats(per_rank, int(config.get("workload.batch_size", 0)), int(config.get("workload.warmup_steps", 0)))
    ranks = [rank.rank for rank in per_rank]
    summary = dataclasses.replace(
        first, run_id=f"{first.sweep_id or first.run_id}/ranks-{ranks[0]}-{ranks[-1]}", status=status,
        exit_code=exit_code(status), per_rank=per_rank, job=job,
        oom_ranks=sorted(rank.rank for rank in per_rank if rank.status == Status.OOM),
        wall_s=sum(member.summary.wall_s for member in members),
        estimate=score(copy.deepcopy(first.estimate), per_rank),
        emulated={**first.emulated, "rank": None, "ranks": ranks,
                  "exact": all(member.summary.emulated.get("exact") for member in members)})
    overrides = {key: value for key, value in members[0].overrides.items() if key != RANK_KEY}
    base = members[0]
    return EmulatedJob(dir=base.dir, summary=summary, config=base.config, sweep=base.sweep, overrides=overrides,
                       label=f"{base.label} ranks {ranks[0]}-{ranks[-1]}".strip(), log=base.log, members=members)
