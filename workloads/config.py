"""Hydra structured config of a workload: what `conf/workload/*.yaml` and `workload.*=` overrides set.

Every field is typed, so Hydra refuses an unknown key or a wrong type by name before anything runs.
Semantic checks (ranges, divisibility, device support) live in `workloads.validate`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class PoolingConfig:
    """Ids per sample per table (the pooling factor)."""

    # fixed | uniform | poisson | pareto
    distribution: str = "fixed"
    # mean pooling factor; for `uniform` the range is [min, max]
    mean: float = 4.0
    min: int = 1
    max: int = 64
    # Pareto shape (> 1 for a finite mean); heavier tail as it approaches 1
    pareto_alpha: float = 2.0
    # Optional per-table means (e.g. MLPerf multi-hot sizes); overrides `mean` when given
    per_table_mean: List[float] = field(default_factory=list)


@dataclass
class IdsConfig:
    """How ids are drawn over each table's virtual id space."""

    # uniform | zipf (a tables_file may also give a table an id histogram: workloads.tables_file)
    distribution: str = "zipf"
    # Zipf exponent alpha (> 0); ~1.05 is typical of recommendation traffic
    zipf_alpha: float = 1.05


@dataclass
class WorkloadConfig:
    name: str = "tiny"
    num_tables: int = 8
    # Virtual (logical) rows per table. `rows` applies when `rows_distribution=fixed` and `rows_list` is
    # empty; `rows_list` gives one value per table; log_uniform / log_normal draw between rows_min/max.
    rows: int = 10_000
    rows_list: List[int] = field(default_factory=list)
    rows_distribution: str = "fixed"
    rows_min: int = 1_000
    rows_max: int = 100_000
    # full: physical == virtual; scaled: all tables shrunk by one factor so the total fits
    # `scaled_max_gib` (relative sizes kept); plan_only: nothing materialized (plan mode only).
    materialize: str = "full"
    scaled_max_gib: float = 1.0
    embedding_dim: int = 64
    embedding_dims: List[int] = field(default_factory=list)
    # fp32 | fp16
    data_type: str = "fp32"
    num_dense_features: int = 13
    pooling: PoolingConfig = field(default_factory=PoolingConfig)
    ids: IdsConfig = field(default_factory=IdsConfig)
    # dlrm (dot interaction) | dlrm_dcn (DCNv2 interaction)
    arch: str = "dlrm"
    dense_arch: List[int] = field(default_factory=lambda: [128, 64])
    over_arch: List[int] = field(default_factory=lambda: [128, 1])
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 64
    # sgd | rowwise_adagrad | adam (fused into backward by fbgemm on the torchrec backend)
    embedding_optimizer: str = "rowwise_adagrad"
    embedding_lr: float = 0.01
    # sgd | adagrad | adam
    dense_optimizer: str = "adam"
    dense_lr: float = 0.001
    # per rank
    batch_size: int = 512
    # Optional global batch: when set, it must divide evenly by the world size and sets batch_size
    global_batch_size: Optional[int] = None
    warmup_steps: int = 3  # at least bench.run.config.SETUP_STEPS are run
    steps: int = 5
    seed: int = 0
    # Seeds the table sizes drawn from a distribution (kept apart from `seed` so a data-seed sweep keeps
    # the same tables).
    table_seed: int = 0
    # Optional CSV / JSON file of per-table statistics (workloads/tables_file.py): when set, it defines
    # the tables (names, rows, dims, pooling and id laws) and num_tables, rows*, embedding_dims and
    # pooling.per_table_mean are ignored; embedding_dim, pooling.* and ids.* fill the columns it leaves
    # out. A relative path is looked up in the working directory, then in conf/tables/.
    tables_file: Optional[str] = None
    # Where batches are drawn: auto (on the rank's GPU when it has one, by torch ops: no host-to-device copy
    # per batch; on the host otherwise) | host (numpy, workloads.data) | device (workloads.device_data, also
    # on CPU ranks). The two draw the same laws, not the same values; id histograms are host only.
    generator: str = "auto"
