"""A tables file's raw tables (workloads.tables_parse) checked and resolved: every value the file's, else
the workload's, as FileTables.

Each table's checks run in the order of its columns (name, rows, dim, pooling, ids), so the first problem
of a line is the one reported.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Dict, List, Mapping, Optional, Tuple

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.id_histogram import HistogramIdsConfig
from workloads.rules import FBGEMM_DIM_ALIGNMENT, HISTOGRAM, ID_DISTRIBUTIONS, POOLING_DISTRIBUTIONS, \
    pooling_law_problem
from workloads.tables_cells import COLUMNS, RawTable, Refused, choice_cell, integer_cell, number_cell, \
    weights_cell

# workloads.rules.pooling_law_problem's fields -> this file's columns
_POOLING_COLUMNS = {"distribution": "pooling_distribution", "min": "pooling_min", "max": "pooling_max",
                    "mean": "pooling_mean", "pareto_alpha": "pareto_alpha"}
FILE_ID_DISTRIBUTIONS = (*ID_DISTRIBUTIONS, HISTOGRAM)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


@dataclass(frozen=True)
class FileTable:
    """One table of a tables file, every value resolved (the file's, else the workload's)."""

    name: str
    rows: int
    dim: int
    pooling: PoolingConfig  # per table: `mean` is its mean, per_table_mean is empty
    ids: IdsConfig  # IdsConfig, or HistogramIdsConfig
    line: int
    # column -> where its value came from: "line 4, column rows" or "workload.embedding_dim"
    where: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)


def resolve_tables(raw_tables: List[RawTable], cfg: WorkloadConfig) -> List[FileTable]:
    """The file's tables, in its order, each checked; names unique across the file."""
    tables: List[FileTable] = []
    first_line_of: Dict[str, int] = {}
    for line, cells in raw_tables:
        table = _resolve_table(line, cells, cfg)
        if table.name in first_line_of:
            raise Refused(table.where["name"], f"{table.name!r} is also the name on line "
                                               f"{first_line_of[table.name]}; give every table its own name")
        first_line_of[table.name] = line
        tables.append(table)
    return tables


class _TableCells:
    """One table's cells as read, the workload's value of each column the file leaves out, and where each
    column's value comes from (for errors, and FileTable.where)."""

    def __init__(self, cells: Dict[str, Tuple[Any, str]], cfg: WorkloadConfig):
        pool, ids = cfg.pooling, cfg.ids
        self.given = cells
        self.defaults = {"dim": (cfg.embedding_dim, "workload.embedding_dim"),
                         "pooling_mean": (pool.mean, "workload.pooling.mean"),
                         "pooling_distribution": (pool.distribution, "workload.pooling.distribution"),
                         "pooling_min": (pool.min, "workload.pooling.min"),
                         "pooling_max": (pool.max, "workload.pooling.max"),
                         "pareto_alpha": (pool.pareto_alpha, "workload.pooling.pareto_alpha"),
                         "id_distribution": (ids.distribution, "workload.ids.distribution"),
                         "zipf_alpha": (ids.zipf_alpha, "workload.ids.zipf_alpha")}
        self.where = {column: cells[column][1] if column in cells else self.defaults.get(column, (None, ""))[1]
                      for column in COLUMNS}

    def value(self, column: str) -> Any:
        return self.given[column][0] if column in self.given else self.defaults[column][0]


def _resolve_table(line: int, cells: Dict[str, Tuple[Any, str]], cfg: WorkloadConfig) -> FileTable:
    table = _TableCells(cells, cfg)
    name = _name(table)
    rows = integer_cell(cells["rows"][0], table.where["rows"], "the table's row count (e.g. 40000000 or 4e7)", 1)
    dim = _dim(table)
    pooling = _pooling(table, cfg.pooling)
    table_ids = _ids(table, cfg.ids, rows)
    return FileTable(name=name, rows=rows, dim=dim, pooling=pooling, ids=table_ids, line=line, where=table.where)


@lru_cache(maxsize=1)
def _reserved_names() -> frozenset:
    import torch

    return frozenset(dir(torch.nn.ModuleDict()))


def _name(table: _TableCells) -> str:
    where, raw_name = table.where["name"], table.given["name"][0]
    if not isinstance(raw_name, str) or not _NAME.match(raw_name.strip()):
        raise Refused(where, f"{raw_name!r} is not a table name; use letters, digits, '_' and '-', "
                             f"starting with a letter or '_'")
    name = raw_name.strip()
    if name in _reserved_names():
        raise Refused(where, f"{name!r} is taken by torch (torchrec keeps tables in a ModuleDict, whose "
                             f"attributes cannot be keys); rename the table, e.g. '{name}_table'")
    return name


def _dim(table: _TableCells) -> int:
    where = table.where["dim"]
    dim = integer_cell(table.value("dim"), where, "the embedding dim (e.g. 128)", 1)
    if dim % FBGEMM_DIM_ALIGNMENT:
        raise Refused(where, f"{dim} is not a multiple of {FBGEMM_DIM_ALIGNMENT} (fbgemm's embedding "
                             f"kernels need it); use e.g. {dim + (-dim) % FBGEMM_DIM_ALIGNMENT}")
    return dim


def _pooling(table: _TableCells, pool: PoolingConfig) -> PoolingConfig:
    where, value = table.where, table.value
    distribution = choice_cell(value("pooling_distribution"), where["pooling_distribution"], POOLING_DISTRIBUTIONS)
    low = integer_cell(value("pooling_min"), where["pooling_min"], "the smallest pooling factor (e.g. 1)", 0)
    high = integer_cell(value("pooling_max"), where["pooling_max"], "the largest pooling factor (e.g. 64)", 1)
    mean = number_cell(value("pooling_mean"), where["pooling_mean"], "the mean ids per sample (e.g. 4)")
    alpha = number_cell(value("pareto_alpha"), where["pareto_alpha"], "the Pareto shape (> 1)")
    problem = pooling_law_problem(distribution, low, high, mean, alpha, _POOLING_COLUMNS)
    if problem:
        column, bad, fix = problem
        raise Refused(where[_POOLING_COLUMNS[column]], f"{bad:g}: {fix}")
    return replace(pool, distribution=distribution, mean=mean, min=low, max=high, pareto_alpha=alpha,
                   per_table_mean=[])


def _ids(table: _TableCells, ids: IdsConfig, rows: int) -> IdsConfig:
    where, given = table.where, table.given
    histogram = weights_cell(*given["id_histogram"]) if "id_histogram" in given else None
    distribution = _id_distribution(table, ids, histogram)
    zipf_alpha = number_cell(table.value("zipf_alpha"), where["zipf_alpha"], "the Zipf exponent, in (0, 5]")
    if distribution == "zipf" and not 0 < zipf_alpha <= 5:
        raise Refused(where["zipf_alpha"], f"{zipf_alpha:g} is not in (0, 5]; give a Zipf exponent in (0, 5] "
                                           f"(~1.05 is typical)")
    if distribution == HISTOGRAM:
        if histogram is None:
            raise Refused(where["id_distribution"], "histogram ids need an id_histogram cell; give the bucket "
                                                    "weights there (or another id_distribution)")
        if len(histogram) > rows:
            raise Refused(where["id_histogram"], f"{len(histogram)} buckets for {rows} rows; give at most one "
                                                 f"bucket per row")
        return HistogramIdsConfig(distribution=HISTOGRAM, zipf_alpha=zipf_alpha, histogram=histogram)
    if histogram is not None:
        raise Refused(where["id_histogram"], f"a histogram for a table whose id_distribution is "
                                             f"{distribution!r}; leave id_distribution empty or set it "
                                             f"to histogram (or drop the histogram)")
    return replace(ids, distribution=distribution, zipf_alpha=zipf_alpha)


def _id_distribution(table: _TableCells, ids: IdsConfig, histogram: Optional[Tuple[float, ...]]) -> str:
    """The table's id law: its cell's, else histogram when it gives one, else the workload's."""
    where = table.where["id_distribution"]
    if "id_distribution" in table.given:
        return choice_cell(table.given["id_distribution"][0], where, FILE_ID_DISTRIBUTIONS)
    return HISTOGRAM if histogram is not None else choice_cell(ids.distribution, where, ID_DISTRIBUTIONS)
