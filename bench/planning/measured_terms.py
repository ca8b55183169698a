"""What a run measured, handed back to torchrec's planner: the static base, the per-sample activation term and
the runtime overhead of a rank, as `torchrec_reservation.json` (docs/torchrec-planner.md, "Measured terms").

A rank's peak breakdown (bench.results.schema.CATEGORIES) splits in four: the tables' storage (what torchrec's
shard estimator prices per shard), a static base resident for the whole run (dense parameters, DDP's gradient
buckets, the dense optimizer: torchrec's `model_base_bytes`), terms that grow with the batch (activations,
communication buffers, the batches a pipeline holds), and runtime overhead (allocator caching, non-torch
memory, the rest). Each term is the largest over the measured ranks, so a reservation built from them holds
every rank's non-table memory. The file is JSON: written by `membench reservation RUN`, read back with
one-line errors naming the field.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Dict, List

from bench.results.schema import RunSummary
from bench.results.store import ResultsError, atomic_write_json, load_summary

RESERVATION_FILE = "torchrec_reservation.json"
FORMAT = "membench.torchrec_reservation/1"
TABLE_CATEGORIES = ("embedding_weights", "embedding_optimizer", "embedding_cache", "embedding_cache_state",
                    "embedding_grads")
STATIC_CATEGORIES = ("dense_params", "dense_grads", "dense_optimizer")
BATCH_CATEGORIES = ("activations", "comm_buffers", "inputs_in_flight")
OVERHEAD_CATEGORIES = ("allocator_overhead", "non_torch", "other")


@dataclass(frozen=True)
class MeasuredTerms:
    """Per rank, in bytes: what a run measured outside its tables, the largest term over its ranks."""
    run_id: str
    workload: str
    config_hash: str
    device_type: str  # the ranks' device: terms measured on one device type plan only that type
    world_size: int
    batch_size: int  # per rank, as torchrec's planner takes it
    static_base_bytes: int  # dense parameters, gradient buckets, dense optimizer (torchrec: model_base_bytes)
    # activations + communication buffers + pipelined batches at `batch_size`; they scale with the batch
    activation_bytes: int
    runtime_overhead_bytes: int  # allocator overhead, non-torch memory, the rest
    table_bytes: int  # the highest rank's table storage (weights, optimizer state, caches): not reserved
    format: str = FORMAT

    @property
    def activation_bytes_per_sample(self) -> float:
        return self.activation_bytes / self.batch_size

    def activation_bytes_at(self, batch_size: int) -> int:
        """The activation term at another per-rank batch, in proportion (rounded up; exact at the measured one)."""
        return -(-self.activation_bytes * batch_size // self.batch_size)

    def reserved_bytes(self, batch_size: int) -> int:
        """What a rank sets aside for everything but its shards at a per-rank batch of `batch_size`."""
        return self.static_base_bytes + self.runtime_overhead_bytes + self.activation_bytes_at(batch_size)

    def write(self, path: Path) -> Path:
        atomic_write_json(Path(path), asdict(self))
        return Path(path)


def category_sum(breakdown: Dict[str, int], categories) -> int:
    return sum(int(breakdown.get(category, 0)) for category in categories)


def measured_terms(summary: RunSummary, batch_size: int) -> MeasuredTerms:
    """The terms of a finished run (every measured rank ok); a run without one gets a ResultsError."""
    ranks = [rank for rank in summary.per_rank if rank.status == "ok" and rank.breakdown]
    if summary.status != "ok" or not ranks:
        raise ResultsError(f"{summary.run_id}: status {summary.status!r}; measured terms come from a run whose "
                           f"ranks all finished (status ok): re-run it with more capacity")
    if batch_size <= 0:
        raise ResultsError(f"{summary.run_id}: workload.batch_size={batch_size}; the per-sample term needs a "
                           f"positive batch")

    def largest(categories) -> int:  # ("other" may be below 0 where the breakdown overcounts: none reserved)
        return max(0, max(category_sum(rank.breakdown, categories) for rank in ranks))

    return MeasuredTerms(
        run_id=summary.run_id, workload=summary.workload, config_hash=summary.config_hash,
        device_type=summary.device_type, world_size=summary.world_size, batch_size=batch_size,
        static_base_bytes=largest(STATIC_CATEGORIES),
        activation_bytes=largest(BATCH_CATEGORIES),
        runtime_overhead_bytes=largest(OVERHEAD_CATEGORIES), table_bytes=largest(TABLE_CATEGORIES))


def run_batch_size(run_dir: Path) -> int:
    """workload.batch_size from a run directory's resolved config.yaml."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    try:
        batch_size = (yaml.safe_load(path.read_text()) or {})["workload"]["batch_size"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as err:
        raise ResultsError(f"{path}: no readable workload.batch_size ({err.__class__.__name__}); pass a run "
                           f"directory written by `membench run`") from None
    return int(batch_size)


def terms_of_run(run_dir: Path) -> MeasuredTerms:
    return measured_terms(load_summary(run_dir), run_batch_size(run_dir))


def field_checks() -> List[tuple]:
    """(name, lower bound) of every number a reservation file must hold: all are whole bytes or counts."""
    return [(f.name, 1 if f.name in ("world_size", "batch_size") else 0)
            for f in fields(MeasuredTerms) if f.type == "int"]


def load_terms(path: Path) -> MeasuredTerms:
    """A reservation file back, each bad field named in one line (ResultsError)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ResultsError(f"{path}: unreadable reservation file ({err.__class__.__name__}); write it with "
                           f"`membench reservation RUN_DIR`") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else data
        raise ResultsError(f"{path}: format must be {FORMAT!r} (found {found!r}); write it with "
                           f"`membench reservation RUN_DIR`")
    known = {f.name for f in fields(MeasuredTerms)}
    if set(data) - known:
        raise ResultsError(f"{path}: unknown fields {sorted(set(data) - known)}; remove them")
    if known - set(data):
        raise ResultsError(f"{path}: missing fields {sorted(known - set(data))}; write it with "
                           f"`membench reservation RUN_DIR`")
    for name, lowest in field_checks():
        value = data[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value) or value < lowest:
            raise ResultsError(f"{path}: {name}={value!r}: expected int >= {lowest}; write the file "
                               f"again with `membench reservation RUN_DIR`")
        data[name] = int(value)
    return MeasuredTerms(**data)


def check_reservation_file(plan, device_type: str) -> None:
    """plan.reservation_file: readable, for torchrec's own memory model, measured on `device_type` ranks
    (ConfigError naming the field otherwise)."""
    from workloads.validate import ConfigError

    path = plan.reservation_file
    if path is None:
        return
    if plan.memory_model != "torchrec":
        raise ConfigError("plan.reservation_file", path, "membench's memory model has its own reservation: drop "
                          "plan.reservation_file or set plan.memory_model=torchrec")
    try:
        terms = load_terms(Path(path))
    except ResultsError as err:
        raise ConfigError("plan.reservation_file", path, str(err)) from None
    if terms.device_type != device_type:
        raise ConfigError("plan.reservation_file", path, f"its terms were measured on {terms.device_type} ranks "
                          f"and this plan is for {device_type} ranks: measure a run on the hardware you plan")
