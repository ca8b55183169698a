"""membench's memory model inside torchrec's own `EmbeddingShardingPlanner`, through its two plug points.

torchrec's planner sums, per rank, a storage reservation (what is not a shard) and the storage of the shards
it places there. membench's prediction of a rank (bench/planning/estimate.py) is split the same way:

* `MembenchStorageReservation` (a torchrec `StorageReservation`): membench's prediction for a rank that
  holds no shard: the dense part with DDP's gradient buckets and its optimizer (the dry run), the pooled
  embeddings and ids of the rank's own batch, the train pipeline's batches in flight, the calibrated
  constant, and on a GPU the caching allocator's overhead and the memory outside it (non_torch).
* `MembenchShardEstimator` (a torchrec `ShardEstimator`): per shard, what the shard adds to that: its
  weights and optimizer state (workloads/storage.py, per dtype and optimizer; data-parallel tables their
  gradients and dense-optimizer state), and the sparse buffers of the global batch it serves (the pooled
  embeddings it sends, the ids it receives: the dry run with the shard, less the dry run without it).

The sum a planner makes from them is membench's prediction where that prediction is additive in shards
(on CPU: exactly, docs/plan.md measures it); the prediction of the chosen plan is then made whole
(`bench.planning.estimate.predict`). Kernels membench does not model (UVM, key-value) keep torchrec's own
estimate. A torchrec user adds it to their planner in two lines (docs/plan.md):

    memory = MembenchMemoryModel.from_config(compose_run_config(["workload=my_model", "hardware=h100_80g"]))
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, **memory.planner_kwargs(topology))

This module imports torchrec (import it only where torchrec is installed).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.partitioners import GreedyPerfPartitioner
from torchrec.distributed.planner.types import (ParameterConstraints, Partitioner, PlannerError, PlannerErrorType,
                                                ShardEstimator, ShardingOption, Storage, StorageReservation, Topology)

from bench.planning.calibration import prediction_interval
from bench.planning.dry_run import DryRunModel
from bench.planning.estimate import (add_device_overheads, add_replicated_table, add_sharded_table, predict,
                                     shares_from_plan)
from bench.planning.types import DATA_PARALLEL, RankShare
from workloads.spec import WorkloadSpec

# kernels whose storage membench models: fused (fbgemm, optimizer in the backward) and dense (data-parallel);
# the others (fused_uvm, fused_uvm_caching, key_value) keep torchrec's estimate
MODELLED_KERNELS = ("fused", "dense")
HBM_DEVICES = ("cuda", "mtia")


@dataclass
class MembenchMemoryModel:
    """membench's per-rank prediction for one workload on one device type, as torchrec's planner asks it."""
    MODEL_NAME = "membench"  # (a class attribute: no dataclass field)
    spec: WorkloadSpec
    dry_run: DryRunModel
    coefficients: Dict[str, float] = field(default_factory=dict)
    device_type: str = "cpu"  # membench's: cpu, cuda or cuda_simulated
    allocator_settings: object = None  # a GPU's caching allocator settings (None: no allocator model)
    non_torch_bytes: int = 0
    # the half-width of the interval given beside membench's predictions (calibration, torchrec backend): the
    # planner plans each rank at the interval's upper end, what the measured peak may be
    interval_pct: float = 0.0
    caching_ratio: Optional[float] = None  # sharding.caching_ratio: the HBM cache of UVM-cached shards
    _cache: Dict[tuple, int] = field(default_factory=dict, repr=False)
    _reservation: Optional["MembenchStorageReservation"] = field(default=None, repr=False)

    @classmethod
    def from_config(cls, cfg, spec: Optional[WorkloadSpec] = None, device_type: Optional[str] = None):
        """The model `membench plan` predicts with for run config `cfg` (its workload, pipeline, allocator and
        the hardware's calibration)."""
        from bench.accounting.allocator_config import allocator_settings_for
        from bench.planning.calibration import CALIBRATION_DIR, calibration_key, load_calibration
        from bench.planning.dry_run import dry_run_for
        from workloads.spec import build_spec
        from workloads.units import MIB

        spec = spec or build_spec(cfg.workload)
        device_type = device_type or cfg.hardware.device
        calibration = load_calibration(CALIBRATION_DIR, calibration_key(device_type, cfg.hardware.name))
        return cls(spec, dry_run_for(cfg, spec), calibration.coefficients, device_type,
                   allocator_settings_for(cfg.allocator, device_type), cfg.hardware.non_torch_reserve_mib * MIB,
                   calibration.interval_pct.get("torchrec", 0.0), cfg.sharding.caching_ratio)

    # -- the two halves of a rank's prediction ---------------------------------------------------------
    def predicted_bytes(self, share: RankShare, world_size: int) -> int:
        """membench's prediction of one rank of `world_size` holding `share`, device overheads included."""
        def prediction() -> int:
            rank = predict(self.spec, [share], self.coefficients, self.dry_run,
                           allocator_settings=self.allocator_settings, world_size=world_size)[0]
            return add_device_overheads(rank, self.device_type, self.non_torch_bytes).total_bytes

        return self._cached(("rank", world_size, repr(share)), prediction)

    def rank_bytes(self, share: RankShare, world_size: int) -> int:
        """What the planner plans that rank with: the upper end of the prediction's interval."""
        return prediction_interval(self.predicted_bytes(share, world_size), self.interval_pct)[1]

    def reserved_bytes(self, world_size: int) -> int:
        """A rank with no shard: what torchrec's planner must keep off every rank before placing shards."""
        return self.rank_bytes(RankShare(), world_size)

    def shard_bytes(self, table_name: str, sharding_type: str, rows: int, cols: int, world_size: int) -> int:
        """What a `rows` x `cols` shard of `table_name` adds to its rank's prediction."""
        def added() -> int:
            table = self._table(table_name)
            share = RankShare()
            if sharding_type == DATA_PARALLEL:
                add_replicated_table(share, table, self.spec.config.dense_optimizer)
            else:
                add_sharded_table(share, table, rows, cols, self.spec.config.embedding_optimizer)
            return self.rank_bytes(share, world_size) - self.reserved_bytes(world_size)

        return self._cached((table_name, sharding_type, rows, cols, world_size), added)

    # -- torchrec's plug points ------------------------------------------------------------------------
    def storage_reservation(self) -> "MembenchStorageReservation":
        """The reservation (one per model: after a plan, its `reserved_bytes` is what it kept off each rank)."""
        if self._reservation is None:
            self._reservation = MembenchStorageReservation(self)
        return self._reservation

    def shard_estimator(self, topology: Topology,
                        constraints: Optional[Dict[str, ParameterConstraints]] = None) -> "MembenchShardEstimator":
        return MembenchShardEstimator(topology, constraints, memory=self)

    def planner_kwargs(self, topology: Topology, batch_size: Optional[int] = None,
                       constraints: Optional[Dict[str, ParameterConstraints]] = None) -> dict:
        """`EmbeddingShardingPlanner` keyword arguments: an enumerator whose estimators are torchrec's perf
        estimator and membench's storage estimator, membench's storage reservation, and a partitioner that
        accepts a placement only when membench's prediction of each whole rank fits. `batch_size` and
        `constraints` must be the planner's own (default: the workload's batch, no constraints)."""
        batch_size = batch_size or self.spec.config.batch_size
        self.check_batch_size(batch_size)
        estimators = [EmbeddingPerfEstimator(topology=topology, constraints=constraints),
                      self.shard_estimator(topology, constraints)]
        enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch_size, constraints=constraints,
                                         estimator=estimators)
        return {"enumerator": enumerator, "storage_reservation": self.storage_reservation(),
                "partitioner": MembenchPartitioner(self)}

    def plan_bytes(self, options: List[ShardingOption], world_size: int) -> List[int]:
        """Each rank's planned bytes (the interval's upper end) for a placement: every rank whole, one dry run
        per distinct rank, as `membench run` predicts that plan."""
        rows = [{"table": o.name, "sharding_type": o.sharding_type, "compute_kernel": o.compute_kernel,
                 "shards": [{"rank": s.rank, "sizes": list(s.size)} for s in o.shards]} for o in options]
        return [self.rank_bytes(share, world_size) for share in shares_from_plan(rows, self.spec, world_size,
                                                                                        self.caching_ratio)]

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size != self.spec.config.batch_size:
            raise ValueError(f"batch_size={batch_size}: membench's memory model was built for the workload's "
                             f"per-rank batch {self.spec.config.batch_size}; set workload.batch_size={batch_size}")

    def _table(self, name: str):
        for table in self.spec.tables:
            if table.name == name:
                return table
        raise KeyError(f"table {name!r} is not in workload {self.spec.config.name!r}: build the memory model "
                       f"from the workload the planner plans")

    def _cached(self, key: tuple, compute) -> int:
        if key not in self._cache:
            self._cache[key] = int(compute())
        return self._cache[key]


def tier_bytes(topology: Topology, storage: Storage) -> int:
    """The bytes of `storage` in the tier a rank's own memory is planned in (`device_storage`'s)."""
    return int(storage.hbm if topology.compute_device in HBM_DEVICES else storage.ddr)


def device_storage(topology: Topology, num_bytes: int) -> Storage:
    """`num_bytes` in the tier torchrec plans a rank's own memory in: HBM on GPUs, DDR on CPUs."""
    on_hbm = topology.compute_device in HBM_DEVICES
    return Storage(hbm=num_bytes if on_hbm else 0, ddr=0 if on_hbm else num_bytes)


class MembenchShardEstimator(ShardEstimator):
    """Each shard's storage by membench's model (`MembenchMemoryModel.shard_bytes`); shards of kernels it does
    not model keep torchrec's `EmbeddingStorageEstimator`'s."""

    def __init__(self, topology: Topology, constraints: Optional[Dict[str, ParameterConstraints]] = None,
                 memory: Optional[MembenchMemoryModel] = None) -> None:
        if memory is None:
            raise ValueError("MembenchShardEstimator needs memory=MembenchMemoryModel(...)")
        self._topology, self._memory = topology, memory
        self._fallback = EmbeddingStorageEstimator(topology=topology, constraints=constraints)

    def estimate(self, sharding_options: List[ShardingOption], sharder_data_map=None) -> None:
        others = [option for option in sharding_options if option.compute_kernel not in MODELLED_KERNELS]
        if others:
            self._fallback.estimate(others, sharder_data_map)
        world_size = self._topology.world_size
        for option in sharding_options:
            if option.compute_kernel not in MODELLED_KERNELS:
                continue
            for shard in option.shards:
                rows, cols = shard.size
                added = self._memory.shard_bytes(option.name, option.sharding_type, rows, cols, world_size)
                shard.storage = device_storage(self._topology, added)


class AbsoluteStorageReservation(StorageReservation):
    """Every rank's storage less a number of bytes (`reserved_per_rank`), in the tier its own memory is planned
    in; after reserve(), `reserved_bytes` is what it kept off each rank."""

    def __init__(self) -> None:
        self._last_reserved_topology: Optional[Topology] = None
        self.reserved_bytes: Optional[int] = None  # per rank, at the last reserve()
        # torchrec 1.8's planner reads `_percentage` off any other reservation when it explains a failed plan
        # (planners.py); none of capacity is held back as a percentage here
        self._percentage = 0.0

    def reserved_per_rank(self, topology: Topology, batch_size: int) -> int:
        raise NotImplementedError

    def reserve(self, topology: Topology, batch_size: int, module, sharders, constraints=None) -> Topology:
        reserved = copy.deepcopy(topology)
        self.reserved_bytes = self.reserved_per_rank(topology, batch_size)
        for device in reserved.devices:
            device.storage -= device_storage(topology, self.reserved_bytes)
        self._last_reserved_topology = copy.deepcopy(reserved)
        return reserved

    @property
    def last_reserved_topology(self) -> Optional[Topology]:
        return self._last_reserved_topology


class MembenchStorageReservation(AbsoluteStorageReservation):
    """Every rank's storage less membench's prediction for a rank that holds no shard."""

    def __init__(self, memory: MembenchMemoryModel) -> None:
        super().__init__()
        self._memory = memory

    def reserved_per_rank(self, topology: Topology, batch_size: int) -> int:
        self._memory.check_batch_size(batch_size)
        return self._memory.reserved_bytes(topology.world_size)


class MembenchPartitioner(Partitioner):
    """torchrec's greedy partitioner, then membench's prediction of each whole rank of the placement it made:
    a placement whose rank would not fit is refused (to the proposer, as torchrec's partitioner refuses one).
    The sum of shards is exact only where the prediction is additive (docs/torchrec-planner.md); where the sum
    is above the whole rank (data-parallel tables), a placement the sum refuses is tried again against
    RELAXED_FRACTION more of each rank, and kept if every whole rank fits."""

    RELAXED_FRACTION = 0.15

    def __init__(self, memory: MembenchMemoryModel) -> None:
        self._memory, self._greedy = memory, GreedyPerfPartitioner()

    def partition(self, proposal: List[ShardingOption], storage_constraint: Topology) -> List[ShardingOption]:
        try:
            plan = self._greedy.partition(proposal, storage_constraint)
        except PlannerError:
            plan = self._greedy.partition(proposal, self._relaxed(storage_constraint))
        self._check(plan, storage_constraint)
        return plan

    def _capacities(self, storage_constraint: Topology) -> List[int]:
        """Each rank's memory: what the reservation left of it, and what it reserved."""
        reserved = self._memory.storage_reservation().reserved_bytes or 0
        return [tier_bytes(storage_constraint, device.storage) + reserved for device in storage_constraint.devices]

    def _relaxed(self, storage_constraint: Topology) -> Topology:
        relaxed = copy.deepcopy(storage_constraint)
        for device, capacity in zip(relaxed.devices, self._capacities(storage_constraint)):
            device.storage += device_storage(relaxed, int(capacity * self.RELAXED_FRACTION))
        return relaxed

    def _check(self, plan: List[ShardingOption], storage_constraint: Topology) -> None:
        planned_bytes = self._memory.plan_bytes(plan, storage_constraint.world_size)
        for rank, (planned, capacity) in enumerate(zip(planned_bytes, self._capacities(storage_constraint))):
            if planned > capacity:
                raise PlannerError(f"membench: rank {rank} would need {planned} bytes of {capacity} (its whole "
                                   f"prediction, at the upper end of the interval)",
                                   PlannerErrorType.PARTITION)
