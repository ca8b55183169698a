"""A measured run's terms (bench/planning/measured_terms.py) as torchrec's storage reservation: the next plan of
the model starts from what its last run measured, not from HeuristicalStorageReservation's 15 % of HBM, 6x the
dense parameters and 20x the KJT bytes. In two lines (docs/torchrec-planner.md):

    reservation = MeasuredStorageReservation.from_file("results/runs/<run>/torchrec_reservation.json")
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, storage_reservation=reservation)

Shards keep torchrec's own `EmbeddingStorageEstimator`, which still adds its own estimate of each shard's
input and output buffers: with these terms a plan counts the batch's buffers twice (the safe side).

This module imports torchrec (import it only where torchrec is installed).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from torchrec.distributed.planner.types import Topology

from bench.planning.measured_terms import MeasuredTerms, load_terms
from bench.planning.torchrec_memory_model import AbsoluteStorageReservation
from bench.results.schema import kernel_device


class MeasuredStorageReservation(AbsoluteStorageReservation):
    """Every rank's storage less a measured rank's static base, runtime overhead and per-sample activation term
    at the planner's batch."""
    MODEL_NAME = "torchrec+measured_reservation"

    def __init__(self, terms: MeasuredTerms) -> None:
        super().__init__()
        self.terms = terms

    @classmethod
    def from_file(cls, path) -> "MeasuredStorageReservation":
        return cls(load_terms(Path(path)))

    def reserved_per_rank(self, topology: Topology, batch_size: int) -> int:
        check_device(self.terms, topology.compute_device)
        return self.terms.reserved_bytes(batch_size)

    def planner_kwargs(self, topology: Optional[Topology] = None, batch_size: Optional[int] = None,
                       constraints=None) -> dict:
        """`EmbeddingShardingPlanner` keyword arguments (the shape `MembenchMemoryModel.planner_kwargs` has)."""
        return {"storage_reservation": self}


def check_device(terms: MeasuredTerms, compute_device: str) -> None:
    """Terms measured on one kind of device plan only that kind: a CPU rank has no allocator overhead or
    non-torch memory to measure, a GPU's would not fit a CPU plan."""
    measured_on = kernel_device(terms.device_type)
    if measured_on != compute_device:
        raise ValueError(f"measured terms of run {terms.run_id} come from {terms.device_type} ranks "
                         f"(torchrec compute device {measured_on}), the planner plans {compute_device}: measure a "
                         f"run on the device you plan")
