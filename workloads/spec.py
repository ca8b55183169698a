"""Resolved workload description: concrete tables with virtual and physical sizes.

`WorkloadConfig` says how to generate tables; `WorkloadSpec` is the result, shared by the model
builder, the data generator and the planner so they agree on every table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

from workloads.config import WorkloadConfig

BYTES_PER_ELEMENT = {"fp32": 4, "fp16": 2}


@dataclass(frozen=True)
class TableSpec:
    name: str
    feature_name: str
    # logical id space (may be 1e10); ids are drawn here, then hashed into physical rows
    virtual_rows: int
    # rows materialized on this machine (0 when plan_only)
    physical_rows: int
    embedding_dim: int
    pooling_mean: float
    bytes_per_element: int

    @property
    def virtual_bytes(self) -> int:
        return self.virtual_rows * self.embedding_dim * self.bytes_per_element

    @property
    def physical_bytes(self) -> int:
        return self.physical_rows * self.embedding_dim * self.bytes_per_element


@dataclass(frozen=True)
class WorkloadSpec:
    config: WorkloadConfig
    tables: List[TableSpec]

    @property
    def virtual_bytes(self) -> int:
        return sum(t.virtual_bytes for t in self.tables)

    @property
    def physical_bytes(self) -> int:
        return sum(t.physical_bytes for t in self.tables)

    @property
    def is_plan_only(self) -> bool:
        return self.config.materialize == "plan_only"
