"""Semantic checks of a composed run config, run before anything is launched.

Each problem becomes one `ConfigError` line naming the field, the value and the fix, so a sweep point
with a bad value is refused as `invalid` instead of crashing inside torchrec minutes later.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional

from workloads.config import WorkloadConfig
from workloads.storage import DENSE_OPTIMIZERS, EMBEDDING_OPTIMIZERS
from workloads.rules import (  # noqa: F401 (re-exported: the names every check and its callers use)
    ARCHS, COMPUTE_KERNELS, DATA_TYPES, GENERATORS, EMBEDDING_OPTIMIZERS_CPU_FUSED, FBGEMM_DIM_ALIGNMENT, ID_DISTRIBUTIONS,
    MATERIALIZE, POOLING_DISTRIBUTIONS, ROWS_DISTRIBUTIONS, SHARDING_TYPES_CPU, SHARDING_TYPES_CUDA_ONLY,
    ConfigError, pooling_law_problem)
from workloads.id_histogram import has_id_histograms
from workloads.tables_file import load_tables
from workloads.tables_resolve import FileTable
from workloads.units import GIB


def _one_of(field: str, value: str, allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(field, value, f"use one of {', '.join(allowed)}")


def _positive(field: str, value: float, what: str = "must be > 0") -> None:
    if not value > 0:
        raise ConfigError(field, value, what)


def _length(field: str, values: List[Any], num_tables: int) -> None:
    if values and len(values) != num_tables:
        raise ConfigError(
            field, list(values), f"give one value per table ({num_tables}, workload.num_tables) or none"
        )


def validate_workload(cfg: WorkloadConfig, prefix: str = "workload") -> None:
    """Raise ConfigError for the first problem of a workload config; the config is not changed."""
    # a tables file is read once here (each line checked as it is read: workloads.tables_file)
    file_tables = load_tables(cfg) if cfg.tables_file else None
    if file_tables is not None:
        _validate_tables_file(cfg, prefix, file_tables)
    else:
        _validate_tables(cfg, prefix)
    _validate_inputs(cfg, prefix, file_tables)
    _validate_arch(cfg, prefix, file_tables)
    _validate_training(cfg, prefix)


def _dims(cfg: WorkloadConfig, p: str, file_tables: Optional[List[FileTable]]):
    """The embedding dims and the field that sets them."""
    if file_tables is not None:
        return [t.dim for t in file_tables], f"{p}.tables_file"
    dims = list(cfg.embedding_dims) or [cfg.embedding_dim]
    return dims, (f"{p}.embedding_dims" if cfg.embedding_dims else f"{p}.embedding_dim")


def _validate_tables_file(cfg: WorkloadConfig, p: str, tables: List[FileTable]) -> None:
    """What the workload adds to the tables of `cfg.tables_file`: materialization, data type, and one dim for
    all tables (DLRM's interactions)."""
    _one_of(f"{p}.materialize", cfg.materialize, MATERIALIZE)
    _positive(f"{p}.scaled_max_gib", cfg.scaled_max_gib)
    _one_of(f"{p}.data_type", cfg.data_type, DATA_TYPES)
    first = tables[0]
    for t in tables[1:]:
        if t.dim != first.dim:
            raise ConfigError(f"{p}.tables_file", cfg.tables_file,
                              f"{t.where['dim']}: dim {t.dim} differs from {first.where['dim']}'s {first.dim}; "
                              f"DLRM interactions need one embedding dim for all tables")


def _validate_tables(cfg: WorkloadConfig, p: str) -> None:
    if cfg.rows_list:
        if cfg.num_tables != len(cfg.rows_list):
            raise ConfigError(f"{p}.rows_list", list(cfg.rows_list),
                              f"give one row count per table ({cfg.num_tables}, {p}.num_tables)")
    _positive(f"{p}.num_tables", cfg.num_tables, "need at least one table (>= 1)")
    _one_of(f"{p}.rows_distribution", cfg.rows_distribution, ROWS_DISTRIBUTIONS)
    for i, rows in enumerate(cfg.rows_list):
        _positive(f"{p}.rows_list[{i}]", rows, "row counts must be >= 1")
    if not cfg.rows_list:
        if cfg.rows_distribution == "fixed":
            _positive(f"{p}.rows", cfg.rows, "row count must be >= 1")
        else:
            _positive(f"{p}.rows_min", cfg.rows_min, "row count must be >= 1")
            if cfg.rows_max < cfg.rows_min:
                raise ConfigError(f"{p}.rows_max", cfg.rows_max, f"must be >= {p}.rows_min ({cfg.rows_min})")
    _one_of(f"{p}.materialize", cfg.materialize, MATERIALIZE)
    _positive(f"{p}.scaled_max_gib", cfg.scaled_max_gib)
    _one_of(f"{p}.data_type", cfg.data_type, DATA_TYPES)
    _length(f"{p}.embedding_dims", cfg.embedding_dims, cfg.num_tables)
    dims, dim_field = _dims(cfg, p, None)
    for dim in dims:
        _positive(dim_field, dim, "embedding dims must be >= 1")
        if dim % FBGEMM_DIM_ALIGNMENT:
            raise ConfigError(dim_field, dim, f"fbgemm needs embedding dims that are multiples of "
                                              f"{FBGEMM_DIM_ALIGNMENT}; use e.g. {dim + (-dim) % 4}")


def _validate_inputs(cfg: WorkloadConfig, p: str, file_tables: Optional[List[FileTable]]) -> None:
    _positive(f"{p}.num_dense_features", cfg.num_dense_features, "need at least one dense feature")
    _one_of(f"{p}.generator", cfg.generator, GENERATORS)
    if file_tables is not None:
        if cfg.generator == "device" and has_id_histograms(file_tables):
            raise ConfigError(f"{p}.generator", cfg.generator, "the device generator draws uniform and Zipf ids; "
                                                               "tables with an id histogram need generator=host")
        return  # each table's pooling and id law were checked where its line was read
    pool = cfg.pooling
    _length(f"{p}.pooling.per_table_mean", pool.per_table_mean, cfg.num_tables)
    names = {name: f"{p}.pooling.{name}" for name in ("distribution", "min", "max", "mean", "pareto_alpha")}
    if pool.per_table_mean:
        names["mean"] = f"{p}.pooling.per_table_mean"
    for mean in list(pool.per_table_mean) or [pool.mean]:
        problem = pooling_law_problem(pool.distribution, pool.min, pool.max, mean, pool.pareto_alpha, names)
        if problem:
            field, value, fix = problem
            raise ConfigError(names[field], value, fix)
    _one_of(f"{p}.ids.distribution", cfg.ids.distribution, ID_DISTRIBUTIONS)
    if cfg.ids.distribution == "zipf" and not (0 < cfg.ids.zipf_alpha <= 5):
        raise ConfigError(f"{p}.ids.zipf_alpha", cfg.ids.zipf_alpha, "Zipf exponent must be in (0, 5]")


def _validate_arch(cfg: WorkloadConfig, p: str, file_tables: Optional[List[FileTable]]) -> None:
    _one_of(f"{p}.arch", cfg.arch, ARCHS)
    for name in ("dense_arch", "over_arch"):
        layers = list(getattr(cfg, name))
        if not layers or any(size < 1 for size in layers):
            raise ConfigError(f"{p}.{name}", layers, "give a non-empty list of layer sizes >= 1")
    if cfg.over_arch[-1] != 1:
        raise ConfigError(f"{p}.over_arch", list(cfg.over_arch), "the last layer must be 1 (the logit)")
    dims, dim_field = _dims(cfg, p, file_tables)
    if len(set(dims)) != 1:
        raise ConfigError(dim_field, dims, "DLRM interactions need one embedding dim for all tables")
    if cfg.dense_arch[-1] != dims[0]:
        raise ConfigError(f"{p}.dense_arch", list(cfg.dense_arch),
                          f"the last layer must equal the embedding dim ({dims[0]}"
                          f"{', from ' + p + '.tables_file' if cfg.tables_file else ''})")
    if cfg.arch == "dlrm_dcn":
        _positive(f"{p}.dcn_num_layers", cfg.dcn_num_layers, "need at least one DCN layer")
        _positive(f"{p}.dcn_low_rank_dim", cfg.dcn_low_rank_dim, "must be >= 1")


def _validate_training(cfg: WorkloadConfig, p: str) -> None:
    _one_of(f"{p}.embedding_optimizer", cfg.embedding_optimizer, EMBEDDING_OPTIMIZERS)
    _one_of(f"{p}.dense_optimizer", cfg.dense_optimizer, DENSE_OPTIMIZERS)
    _positive(f"{p}.embedding_lr", cfg.embedding_lr)
    _positive(f"{p}.dense_lr", cfg.dense_lr)
    _positive(f"{p}.batch_size", cfg.batch_size, "per-rank batch size must be >= 1")
    _positive(f"{p}.steps", cfg.steps, "need at least one measured step")
    if cfg.warmup_steps < 0:
        raise ConfigError(f"{p}.warmup_steps", cfg.warmup_steps, "must be >= 0")


def validate_sharding_type(field: str, value: str, device_type: str, allow_auto: bool) -> None:
    allowed = (("auto",) if allow_auto else ()) + SHARDING_TYPES_CPU + SHARDING_TYPES_CUDA_ONLY
    _one_of(field, value, allowed)
    if device_type == "cpu" and value in SHARDING_TYPES_CUDA_ONLY:
        raise ConfigError(field, value, f"torchrec shards {value} only on CUDA; on CPU use one of "
                                        f"{', '.join(SHARDING_TYPES_CPU)}")


# Share of the available host RAM that materialized tables may take (the rest: the model, the
# interpreter, the other ranks' processes)
USABLE_HOST_FRACTION = 0.8


def check_host_memory(needed_bytes: int, available_bytes: int, field: str, value: Any, needs: str = "",
                      fix: str = "use workload.materialize=scaled workload.scaled_max_gib=<GiB>") -> None:
    """Refuse what would not fit in this machine's RAM: by default a workload whose materialized tables
    (weights and optimizer state, every replica) alone would not; `needs` says what else needs the bytes."""
    usable = USABLE_HOST_FRACTION * available_bytes
    if needed_bytes > usable:
        needs = needs or f"materialized tables need about {needed_bytes / GIB:.1f} GiB"
        raise ConfigError(field, value, f"{needs} of host RAM but only {usable / GIB:.1f} GiB is usable here; {fix}")
