"""Resolved workload description: concrete tables with virtual and physical sizes.

`WorkloadConfig` says how to generate tables; `build_spec` resolves it into a `WorkloadSpec`, shared by
the model builder, the data generator and the planner so they agree on every table: virtual row counts
from a size distribution, physical rows from `materialize`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import List

import numpy as np

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.pooling_mean import expected_pooling
from workloads.tables_file import load_tables
from workloads.units import GIB

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
    # this table's pooling law (`mean` == pooling_mean, no per_table_mean) and id law (IdsConfig, or
    # workloads.id_histogram.HistogramIdsConfig): the workload's, or its line of workload.tables_file
    pooling: PoolingConfig = field(default_factory=PoolingConfig, hash=False)
    ids: IdsConfig = field(default_factory=IdsConfig, hash=False)

    @property
    def expected_pooling(self) -> float:
        """The ids per sample its pooling law draws on average (not always `pooling_mean`, the law's
        parameter: workloads.pooling_mean)."""
        return expected_pooling(self.pooling, self.pooling_mean)

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



def virtual_rows(cfg: WorkloadConfig) -> List[int]:
    if cfg.rows_list:
        return [int(r) for r in cfg.rows_list]
    if cfg.rows_distribution == "fixed":
        return [int(cfg.rows)] * cfg.num_tables
    rng = np.random.default_rng(cfg.table_seed)
    log_min, log_max = math.log(cfg.rows_min), math.log(cfg.rows_max)
    if cfg.rows_distribution == "log_uniform":
        logs = rng.uniform(log_min, log_max, size=cfg.num_tables)
    else:  # log_normal: centred between min and max, +-2 sigma spans the range, clipped to it
        logs = rng.normal((log_min + log_max) / 2, (log_max - log_min) / 4, size=cfg.num_tables)
        logs = np.clip(logs, log_min, log_max)
    return [int(round(math.exp(v))) for v in logs]


def embedding_dims(cfg: WorkloadConfig) -> List[int]:
    return [int(d) for d in cfg.embedding_dims] if cfg.embedding_dims else [cfg.embedding_dim] * cfg.num_tables


def pooling_means(cfg: WorkloadConfig) -> List[float]:
    if cfg.pooling.per_table_mean:
        return [float(m) for m in cfg.pooling.per_table_mean]
    return [float(cfg.pooling.mean)] * cfg.num_tables


def physical_rows(cfg: WorkloadConfig, rows: List[int], dims: List[int]) -> List[int]:
    if cfg.materialize == "full":
        return list(rows)
    if cfg.materialize == "plan_only":
        return [0] * len(rows)
    # scaled: one factor for every table keeps relative sizes (up to rounding and the 1-row floor)
    bytes_per_element = BYTES_PER_ELEMENT[cfg.data_type]
    total = sum(r * d * bytes_per_element for r, d in zip(rows, dims))
    factor = min(1.0, cfg.scaled_max_gib * GIB / total)
    return [max(1, int(r * factor)) for r in rows]


def build_spec(cfg: WorkloadConfig) -> WorkloadSpec:
    """Resolve a (validated) workload config into concrete tables: from `cfg.tables_file` when it is set
    (ConfigError for a bad file), else from the table fields."""
    if cfg.tables_file:
        return _spec_from_file(cfg)
    rows = virtual_rows(cfg)
    dims = embedding_dims(cfg)
    means = pooling_means(cfg)
    physical = physical_rows(cfg, rows, dims)
    bytes_per_element = BYTES_PER_ELEMENT[cfg.data_type]
    tables = [
        TableSpec(
            name=f"t{i}",
            feature_name=f"f{i}",
            virtual_rows=rows[i],
            physical_rows=physical[i],
            embedding_dim=dims[i],
            pooling_mean=means[i],
            bytes_per_element=bytes_per_element,
            pooling=replace(cfg.pooling, mean=means[i], per_table_mean=[]),
            ids=replace(cfg.ids),
        )
        for i in range(len(rows))
    ]
    return WorkloadSpec(config=cfg, tables=tables)


def _spec_from_file(cfg: WorkloadConfig) -> WorkloadSpec:
    file_tables = load_tables(cfg)
    rows = [t.rows for t in file_tables]
    physical = physical_rows(cfg, rows, [t.dim for t in file_tables])
    bytes_per_element = BYTES_PER_ELEMENT[cfg.data_type]
    tables = [
        TableSpec(
            name=t.name,
            feature_name=f"f{i}",
            virtual_rows=t.rows,
            physical_rows=physical[i],
            embedding_dim=t.dim,
            pooling_mean=float(t.pooling.mean),
            bytes_per_element=bytes_per_element,
            pooling=t.pooling,
            ids=t.ids,
        )
        for i, t in enumerate(file_tables)
    ]
    return WorkloadSpec(config=cfg, tables=tables)
