"""torchrec's planner under its own memory model and under membench's, each plan run for real at a tight
capacity (docs/plan.md, "torchrec's planner with membench's memory model").

For each random workload (the space of `membench calibrate --validate`, torchrec backend only) the capacity
per rank is set to a factor (drawn from the seed, CAPACITY_FACTORS) of a reference: membench's prediction of the
highest rank of torchrec's default plan at the workload's own, loose capacity. At that capacity each memory
model plans (in this process, as the launcher does: `predict_run`); a plan the planner refuses is not run,
the others run with `membench run` (CPU ranks: an allocation past the emulated capacity is a real OOM; with
an emulated world size, the rank predicted highest is trained in one process). Per model and workload:
refused, ok (and the capacity left unused at the highest measured rank) or oom. A refusal counts as
"refused although a plan fits" when the other model's plan ran without OOM at the same capacity.
"""
from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from bench.planning.types import MEMORY_MODELS
from workloads.units import GIB

CAPACITY_FACTORS = (0.9, 1.5)  # the capacity drawn in [low, high] x the reference peak
REFUSED, OK = "refused", "ok"
RESULT_FILE = "planner_comparison.json"
# --measured: torchrec's own model with the reservation a run of the workload at its own capacity measured
MEASURED = "torchrec+measured"
RANK_GROUPS = (("cpu", False), ("emulated", True))  # the table's parts: CPU runs, and emulated ones apart


@dataclass
class ModelOutcome:
    memory_model: str
    verdict: str  # refused | ok | oom | failed (a run that ended otherwise)
    planner_bytes: Optional[int] = None  # the planner's own figure for its highest rank
    predicted_bytes: Optional[int] = None  # membench's prediction of the plan's highest rank
    measured_bytes: Optional[int] = None  # the highest measured peak (ok runs)
    unused_bytes: Optional[int] = None  # capacity - measured_bytes (ok runs)
    run_dir: Optional[str] = None
    error: Optional[str] = None


@dataclass
class WorkloadComparison:
    index: int
    overrides: List[str]
    world_size: int
    emulated: bool
    capacity_bytes: int
    reference_bytes: int
    outcomes: Dict[str, ModelOutcome] = field(default_factory=dict)
    wall_s: float = 0.0

    def refused_although_fits(self, model: str) -> bool:
        return self.outcomes[model].verdict == REFUSED and any(
            other.verdict == OK for name, other in self.outcomes.items() if name != model)


def capacity_overrides(capacity_bytes: int, ranks_per_node: int) -> List[str]:
    """A rank of `capacity_bytes`, and the same for torchrec's planner: on CPU it plans a rank's tables in DDR,
    the node's host memory per rank (hardware.host_memory_gib / ranks per node)."""
    return [f"hardware.capacity_gib={capacity_bytes / GIB:.12f}",
            f"hardware.host_memory_gib={capacity_bytes * ranks_per_node / GIB:.12f}"]


def checked(overrides: List[str]):
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import checked_run

    return checked_run(compose_run_config(overrides), cuda_devices=0)


def planned(overrides: List[str]):
    """(the pre-launch estimate of `membench run overrides`, None) or (None, the planner's refusal)."""
    from torchrec.distributed.planner.types import PlannerError

    from bench.planning.predict import predict_run
    from bench.planning.torchrec_adapter import quiet_planner

    cfg, launch = checked(overrides)
    try:
        with quiet_planner():
            return predict_run(cfg, launch), None
    except PlannerError as err:
        return None, str(err).strip().splitlines()[0]


def reference_bytes(overrides: List[str]) -> int:
    estimate, error = planned(overrides + ["plan.memory_model=torchrec"])
    if estimate is None:
        raise RuntimeError(f"torchrec's planner refused the workload at its own capacity: {error}")
    return max(estimate["per_rank_peak"])


def model_overrides(model: str, reservation_file: Optional[Path]) -> List[str]:
    if model == MEASURED:
        return ["plan.memory_model=torchrec", f"plan.reservation_file={reservation_file}"]
    return [f"plan.memory_model={model}"]


def run_model(overrides: List[str], model: str, capacity_bytes: int, ranks_per_node: int, run_dir: Path,
              run_id: str, reservation_file: Optional[Path] = None) -> ModelOutcome:
    from bench.run.execute import run_overrides

    overrides = (overrides + capacity_overrides(capacity_bytes, ranks_per_node)
                 + model_overrides(model, reservation_file))
    estimate, error = planned(overrides)
    if estimate is None:
        return ModelOutcome(model, REFUSED, error=error)
    outcome = ModelOutcome(model, "", planner_bytes=max(estimate["torchrec_per_rank_peak"]),
                           predicted_bytes=max(estimate["per_rank_peak"]), run_dir=str(run_dir))
    summary = run_overrides(overrides, run_dir, run_id)
    outcome.verdict, outcome.error = summary.status, summary.error
    measured = [r.peak_bytes for r in summary.per_rank if r.status == OK]
    if summary.status == OK and measured:
        outcome.measured_bytes = max(measured)
        outcome.unused_bytes = capacity_bytes - outcome.measured_bytes
    return outcome


def measured_reservation(overrides: List[str], run_dir: Path, run_id: str) -> Path:
    """The reservation file of a run of torchrec's default plan at the workload's own capacity (what a user
    measured before planning tighter); RuntimeError when that run did not finish."""
    from bench.planning.measured_terms import RESERVATION_FILE, terms_of_run
    from bench.run.execute import run_overrides

    summary = run_overrides(overrides + model_overrides("torchrec", None), run_dir, run_id)
    if summary.status != OK:
        raise RuntimeError(f"the measuring run at the workload's own capacity ended {summary.status}")
    return terms_of_run(run_dir).write(run_dir / RESERVATION_FILE)


def compare_workload(index: int, overrides: List[str], seed: int, out_dir: Path,
                     emulated_world_size: Optional[int] = None, measured: bool = False) -> WorkloadComparison:
    started = time.perf_counter()
    if emulated_world_size:
        overrides = overrides + [f"emulate.world_size={emulated_world_size}"]
    _, launch = checked(overrides)
    reference = reference_bytes(overrides)
    factor = random.Random(f"capacity:{seed}:{index}:{emulated_world_size}").uniform(*CAPACITY_FACTORS)
    _, at_capacity = checked(overrides + capacity_overrides(int(reference * factor), launch.ranks_per_node))
    capacity = at_capacity.capacity_bytes  # as the launch reads hardware.capacity_gib back
    comparison = WorkloadComparison(index, overrides, launch.world_size, bool(emulated_world_size), capacity,
                                    reference)
    name = f"{index:02d}" + (f"-n{emulated_world_size}" if emulated_world_size else "")
    for model in MEMORY_MODELS:
        comparison.outcomes[model] = run_model(overrides, model, capacity, launch.ranks_per_node,
                                               out_dir / f"{name}-{model}", f"{out_dir.name}/{name}-{model}")
    if measured:
        comparison.outcomes[MEASURED] = measured_outcome(overrides, capacity, launch.ranks_per_node, out_dir, name)
    comparison.wall_s = round(time.perf_counter() - started, 2)
    return comparison


def measured_outcome(overrides: List[str], capacity: int, ranks_per_node: int, out_dir: Path,
                     name: str) -> ModelOutcome:
    try:
        reservation = measured_reservation(overrides, out_dir / f"{name}-measuring", f"{out_dir.name}/{name}-measuring")
    except RuntimeError as err:
        return ModelOutcome(MEASURED, "failed", error=str(err))
    return run_model(overrides, MEASURED, capacity, ranks_per_node, out_dir / f"{name}-measured",
                     f"{out_dir.name}/{name}-measured", reservation_file=reservation)


def model_summary(comparisons: List[WorkloadComparison], model: str) -> dict:
    """Per memory model: plans, OOMs, refusals (and those where a plan fits), and the capacity left unused at
    the highest measured rank of the plans that ran (fractions of capacity)."""
    import statistics

    outcomes = [c.outcomes[model] for c in comparisons]
    unused = [o.unused_bytes / c.capacity_bytes for c, o in zip(comparisons, outcomes) if o.unused_bytes is not None]
    return {
        "workloads": len(outcomes),
        "ok": sum(o.verdict == OK for o in outcomes),
        "oom": sum(o.verdict == "oom" for o in outcomes),
        "failed": sum(o.verdict not in (OK, "oom", REFUSED) for o in outcomes),
        "refused": sum(o.verdict == REFUSED for o in outcomes),
        "refused_although_fits": sum(c.refused_although_fits(model) for c in comparisons),
        "unused_median": round(statistics.median(unused), 4) if unused else None,
        "unused_mean": round(statistics.fmean(unused), 4) if unused else None,
    }


def models_of(comparisons: List[WorkloadComparison]) -> List[str]:
    """The memory models compared, torchrec's default first (MEMORY_MODELS, then the measured arm if run)."""
    found = {name for c in comparisons for name in c.outcomes}
    return [m for m in (*MEMORY_MODELS, MEASURED) if m in found]


def summarize(comparisons: List[WorkloadComparison]) -> Dict[str, dict]:
    """The table, per memory model, for the CPU runs and the emulated ones apart."""
    out = {}
    for label, emulated in RANK_GROUPS:
        chosen = [c for c in comparisons if c.emulated == emulated]
        if chosen:
            out[label] = {model: model_summary(chosen, model) for model in models_of(chosen)}
    return out


def to_json(seed: int, comparisons: List[WorkloadComparison]) -> dict:
    return {"seed": seed, "capacity_factors": list(CAPACITY_FACTORS), "memory_models": models_of(comparisons),
            "summary": summarize(comparisons), "workloads": [asdict(c) for c in comparisons]}


def load_comparison(path: Path) -> List[WorkloadComparison]:
    """A written comparison's workloads (JSON, from RESULT_FILE)."""
    import json

    data = json.loads(Path(path).read_text())
    comparisons = []
    for raw in data["workloads"]:
        outcomes = {name: ModelOutcome(**value) for name, value in raw.pop("outcomes").items()}
        comparisons.append(WorkloadComparison(**raw, outcomes=outcomes))
    return comparisons
