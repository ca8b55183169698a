"""The vocabulary of a valid workload (allowed values, kernel constraints) and the error every check raises.

Kept apart from workloads.validate so that what validation reads (the tables file loader) can use them
without importing validation back.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Tuple

ROWS_DISTRIBUTIONS = ("fixed", "log_uniform", "log_normal")
MATERIALIZE = ("full", "scaled", "plan_only")
DATA_TYPES = ("fp32", "fp16")
POOLING_DISTRIBUTIONS = ("fixed", "uniform", "poisson", "pareto")
ID_DISTRIBUTIONS = ("uniform", "zipf")
GENERATORS = ("auto", "host", "device")
# the id law only a tables file can give (bucket weights over popularity ranks), drawn by the host generator only
HISTOGRAM = "histogram"
ARCHS = ("dlrm", "dlrm_dcn")
SHARDING_TYPES_CPU = ("data_parallel", "table_wise", "column_wise", "table_column_wise")
SHARDING_TYPES_CUDA_ONLY = ("row_wise", "table_row_wise", "grid_shard")
COMPUTE_KERNELS = ("auto", "fused", "dense", "fused_uvm", "fused_uvm_caching")
# fbgemm's CPU table-batched kernels implement only these fused optimizers (exact SGD / row-wise Adagrad)
EMBEDDING_OPTIMIZERS_CPU_FUSED = ("sgd", "rowwise_adagrad")
# fbgemm's table-batched embedding kernels need every dim to be a multiple of 4 (vectorized rows)
FBGEMM_DIM_ALIGNMENT = 4


class ConfigError(ValueError):
    """An invalid config value: one line with field, value and how to fix it."""

    def __init__(self, field: str, value: Any, fix: str):
        self.field, self.value, self.fix = field, value, fix
        super().__init__(f"invalid config: {field}={value!r}: {fix}")


def pooling_law_problem(distribution: str, low: int, high: int, mean: float, pareto_alpha: float,
                        names: Mapping[str, str]) -> Optional[Tuple[str, Any, str]]:
    """The first rule a configured pooling law breaks -- as (the field: distribution | min | max | mean |
    pareto_alpha, its value, how to fix it, naming fields as ``names`` does) -- or None. The one set of rules for
    workload.pooling (workloads.validate) and a tables file's pooling columns (workloads.tables_file)."""
    if distribution not in POOLING_DISTRIBUTIONS:
        return "distribution", distribution, f"must be one of {' | '.join(POOLING_DISTRIBUTIONS)}"
    if low < 0:
        return "min", low, "must be >= 0"
    if high < max(low, 1):
        return "max", high, f"must be >= max(1, {names['min']}) = {max(low, 1)}"
    if mean <= 0 or not low <= mean <= high:
        return "mean", mean, (f"must be > 0 and within [{names['min']}, {names['max']}] = [{low}, "
                              f"{high}]; give a mean in that range, or widen it")
    if distribution == "pareto" and not pareto_alpha > 1:
        return "pareto_alpha", pareto_alpha, "must be > 1 for a finite mean (a Pareto law's shape)"
    return None
