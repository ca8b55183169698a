"""Workloads from per-table statistics: ``workload.tables_file=PATH`` (CSV or JSON).

One table per CSV line (after a header line) or per JSON object. Columns (JSON keys):

==================== ======== ===============================================================================
column               required value (an empty CSV cell / JSON null takes the workload's value)
==================== ======== ===============================================================================
name                 yes      table name, unique: letters, digits, ``_``, ``-`` (not starting with a digit or
                              ``-``), not a torch ModuleDict attribute (``items``, ``keys``, ...);
                              TableSpec.name, so ``sharding.per_table.<name>`` names it
rows                 yes      virtual rows, an integer >= 1 (``40000000``, ``4e7`` and ``40_000_000`` all read)
dim                  no       embedding dim, a multiple of 4                       (workload.embedding_dim)
pooling_mean         no       mean ids per sample, > 0                             (workload.pooling.mean)
pooling_distribution no       fixed | uniform | poisson | pareto           (workload.pooling.distribution)
pooling_min          no       integer >= 0                                          (workload.pooling.min)
pooling_max          no       integer >= max(1, pooling_min)                        (workload.pooling.max)
pareto_alpha         no       > 1, for pareto pooling                      (workload.pooling.pareto_alpha)
id_distribution      no       uniform | zipf | histogram; ``histogram`` when id_histogram is given
                                                                                   (workload.ids.distribution)
zipf_alpha           no       Zipf exponent in (0, 5]                               (workload.ids.zipf_alpha)
id_histogram         no       bucket weights >= 0 (sum > 0), at most ``rows`` buckets: in CSV one cell of
                              numbers separated by spaces or ``;``; in JSON a list of numbers
==================== ======== ===============================================================================

``id_histogram`` (``w_0 ... w_{K-1}``): the table's popularity ranks ``0 .. rows-1`` are cut into K
equal-width buckets (bucket j holds ranks ``[j*rows//K, (j+1)*rows//K)``, bucket 0 the most popular);
an id falls in bucket j with probability ``w_j / sum(w)``, uniformly within it. Ranks are then scattered
over the id space as for ``zipf`` (``workloads.zipf_law.zipf_rank_to_id``) and mapped to physical rows by the
same ``to_physical``; the draw is a pure function of the batch's stream, like the other laws.

Precedence: the file defines the tables. ``workload.num_tables``, ``rows``, ``rows_list``,
``rows_distribution``, ``rows_min``/``rows_max``, ``embedding_dims`` and ``pooling.per_table_mean`` are
ignored; ``workload.embedding_dim``, ``pooling.*`` and ``ids.*`` are the defaults of the columns a file
leaves out (or cells it leaves empty). Everything else (arch, batch, materialize, optimizers) stays the
workload's.

CSV: UTF-8; blank lines and lines starting with ``#`` are skipped (line numbers in errors count them);
a cell may be quoted, but not span lines. JSON: ``[{...}, ...]`` or ``{"tables": [...]}`` (an optional
``"description"`` string next to ``"tables"`` is ignored).

A relative path is looked up in the working directory, then in the repository's ``conf/tables/``. Every
problem is one ``ConfigError`` line naming the file, the line and the column (or JSON key), and the fix.
"""
from __future__ import annotations

import csv
import difflib
import json
import json.decoder
import json.scanner
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from workloads.config import IdsConfig, PoolingConfig, WorkloadConfig
from workloads.zipf_law import zipf_multiplier, zipf_rank_to_id
from workloads.rules import FBGEMM_DIM_ALIGNMENT, HISTOGRAM, ID_DISTRIBUTIONS, POOLING_DISTRIBUTIONS, ConfigError, \
    pooling_law_problem

FIELD = "workload.tables_file"
# workloads.rules.pooling_law_problem's fields -> this file's columns
_POOLING_COLUMNS = {"distribution": "pooling_distribution", "min": "pooling_min", "max": "pooling_max",
                    "mean": "pooling_mean", "pareto_alpha": "pareto_alpha"}
TABLES_DIR = Path(__file__).resolve().parent.parent / "conf" / "tables"
COLUMNS = ("name", "rows", "dim", "pooling_mean", "pooling_distribution", "pooling_min", "pooling_max",
           "pareto_alpha", "id_distribution", "zipf_alpha", "id_histogram")
REQUIRED = ("name", "rows")
FILE_ID_DISTRIBUTIONS = (*ID_DISTRIBUTIONS, HISTOGRAM)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
_WEIGHT_SEPARATORS = re.compile(r"[\s;,]+")


@dataclass
class HistogramIdsConfig(IdsConfig):
    """A table's ids drawn from a histogram of bucket weights over equal-width popularity-rank buckets."""

    distribution: str = HISTOGRAM
    histogram: Tuple[float, ...] = ()


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


class _Refused(Exception):
    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}" if where else message)


# --------------------------------------------------------------------------------------------------
# Locating and reading the file
# --------------------------------------------------------------------------------------------------


def resolve_path(given: str) -> Path:
    """The file `given` names: as is when absolute, else in the working directory, then in conf/tables/."""
    path = Path(given).expanduser()
    candidates = [path] if path.is_absolute() else [Path.cwd() / path, TABLES_DIR / path]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    for candidate in candidates:
        if candidate.exists():
            raise ConfigError(FIELD, given, f"{candidate} is not a file; give a .csv or .json tables file")
    looked = " and ".join(str(c) for c in candidates)
    raise ConfigError(FIELD, given, f"no such file (looked for {looked}); give an existing .csv or .json "
                                    f"tables file, or the name of one in {TABLES_DIR}")


def load_tables(cfg: WorkloadConfig) -> List[FileTable]:
    """The tables `cfg.tables_file` defines, columns it leaves out taken from `cfg`; ConfigError (one line:
    file, line, column, fix) for the first problem."""
    given = str(cfg.tables_file)
    path = resolve_path(given)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(FIELD, given, f"byte {err.start} is not UTF-8 text; save the file as UTF-8") from None
    except OSError as err:
        raise ConfigError(FIELD, given, f"cannot read {path}: {err.strerror or err}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            raw = _read_csv(text)
        elif suffix == ".json":
            raw = _read_json(text)
        else:
            raise _Refused("", f"unknown format {suffix or '(no extension)'!r}; name the file .csv or .json")
        return _resolve(raw, cfg)
    except _Refused as err:
        raise ConfigError(FIELD, given, str(err)) from None


# One table as read: (line of the table, {column: (raw value, where)})
_RawTable = Tuple[int, Dict[str, Tuple[Any, str]]]


def _unknown_column(column: str, where: str) -> _Refused:
    close = difflib.get_close_matches(column, COLUMNS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return _Refused(where, f"unknown column {column!r}; {hint}columns are {', '.join(COLUMNS)}")


def _read_csv(text: str) -> List[_RawTable]:
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise _Refused("", f"the file is empty; give a header line ({','.join(REQUIRED)},...) and one line "
                           f"per table")
    header_line, header_text = lines[0]
    header = [cell.strip() for cell in _csv_cells(header_text, header_line)]
    for i, column in enumerate(header):
        where = f"line {header_line}, column {i + 1}"
        if not column:
            raise _Refused(where, "empty column name in the header; name every column")
        if column not in COLUMNS:
            raise _unknown_column(column, f"line {header_line}, column {column}")
        if header.index(column) != i:
            raise _Refused(f"line {header_line}, column {column}", "the column appears twice; keep one")
    for column in REQUIRED:
        if column not in header:
            raise _Refused(f"line {header_line}", f"no {column!r} column in the header; add it (required "
                                                  f"columns: {', '.join(REQUIRED)})")
    if len(lines) == 1:
        raise _Refused(f"line {header_line}", "a header but no tables; add one line per table")
    tables: List[_RawTable] = []
    for number, line in lines[1:]:
        cells = [cell.strip() for cell in _csv_cells(line, number)]
        if len(cells) != len(header):
            raise _Refused(f"line {number}", f"{len(cells)} cells for the {len(header)} columns of the header "
                                             f"(line {header_line}); give one cell per column (an empty cell "
                                             f"takes the workload's value)")
        tables.append((number, {column: (cell, f"line {number}, column {column}")
                                for column, cell in zip(header, cells) if cell != ""}))
    return tables


def _csv_cells(line: str, number: int) -> List[str]:
    try:
        return next(csv.reader([line], strict=True))
    except csv.Error as err:
        raise _Refused(f"line {number}", f"not a CSV line ({err}); quote cells that hold commas") from None


class _Located(dict):
    """A JSON object and where it sits in the text."""

    start = 0
    end = 0
    duplicates: Tuple[str, ...] = ()


class _LocatingDecoder(json.JSONDecoder):
    """json's pure-Python decoder, recording the span of every object (to name lines in errors)."""

    def __init__(self) -> None:
        super().__init__(object_pairs_hook=self._pairs)
        self.parse_object = self._parse_object
        self.scan_once = json.scanner.py_make_scanner(self)

    @staticmethod
    def _pairs(pairs):
        obj = _Located()
        duplicates = []
        for key, value in pairs:
            if key in obj:
                duplicates.append(key)
            obj[key] = value
        obj.duplicates = tuple(duplicates)
        return obj

    @staticmethod
    def _parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        obj, end = json.decoder.JSONObject(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo)
        obj.start, obj.end = s_and_end[1] - 1, end
        return obj, end


def _line_col(text: str, pos: int) -> Tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def _key_where(text: str, obj: _Located, key: str, occurrence: int = 1) -> str:
    pos = obj.start
    for _ in range(occurrence):
        found = text.find(json.dumps(key), pos + 1, obj.end)
        if found < 0:
            break
        pos = found
    line, _ = _line_col(text, pos)
    return f"line {line}, key {key}"


def _read_json(text: str) -> List[_RawTable]:
    if not text.strip():
        raise _Refused("", 'the file is empty; give a JSON list of tables, e.g. [{"name": "t0", "rows": 1000}]')
    try:
        doc = _LocatingDecoder().decode(text)
    except json.JSONDecodeError as err:
        raise _Refused(f"line {err.lineno}, column {err.colno}", f"JSON syntax error: {err.msg}; fix the JSON "
                                                                 f"there") from None
    if isinstance(doc, _Located):
        where = f"line {_line_col(text, doc.start)[0]}"
        extra = [key for key in doc if key not in ("tables", "description")]
        if extra:
            raise _Refused(_key_where(text, doc, extra[0]), f"unknown key {extra[0]!r}; the top-level object "
                                                            f"holds \"tables\" (and an optional \"description\")")
        if "tables" not in doc:
            raise _Refused(where, 'no "tables" key; give {"tables": [{"name": ..., "rows": ...}, ...]}')
        doc = doc["tables"]
    if not isinstance(doc, list):
        raise _Refused("line 1", 'expected a list of tables ([{"name": ..., "rows": ...}, ...]) or '
                                 '{"tables": [...]}')
    if not doc:
        raise _Refused("", "the list of tables is empty; add one object per table")
    tables: List[_RawTable] = []
    for index, obj in enumerate(doc):
        if not isinstance(obj, _Located):
            raise _Refused("", f"table {index + 1} is {json.dumps(obj)[:40]}, not an object; give each table as "
                               f"{{\"name\": ..., \"rows\": ...}}")
        line = _line_col(text, obj.start)[0]
        if obj.duplicates:
            key = obj.duplicates[0]
            raise _Refused(_key_where(text, obj, key, occurrence=2), f"key {key!r} appears twice in this table; "
                                                                     f"keep one")
        for key in obj:
            if key not in COLUMNS:
                raise _unknown_column(key, _key_where(text, obj, key))
        for key in REQUIRED:
            if key not in obj:
                raise _Refused(f"line {line}", f"table {index + 1} has no {key!r} key; add it (required keys: "
                                               f"{', '.join(REQUIRED)})")
        tables.append((line, {key: (value, _key_where(text, obj, key)) for key, value in obj.items()
                              if value is not None and value != ""}))
    return tables


# --------------------------------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------------------------------


def _integer(raw: Any, where: str, what: str, minimum: int) -> int:
    value: Optional[int] = None
    if isinstance(raw, bool):
        value = None
    elif isinstance(raw, int):
        value = raw
    elif isinstance(raw, float):
        value = int(raw) if math.isfinite(raw) and raw.is_integer() else None
    elif isinstance(raw, str):
        try:
            value = int(raw)
        except ValueError:
            try:
                number = float(raw)
                value = int(number) if math.isfinite(number) and number.is_integer() and abs(number) < 2**63 \
                    else None
            except ValueError:
                value = None
    if value is None or value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise _Refused(where, f"{raw!r} is not {kind}; give {what}")
    return value


def _number(raw: Any, where: str, what: str) -> float:
    value: Optional[float] = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise _Refused(where, f"{raw!r} is not a number; give {what}")
    return value


def _choice(raw: Any, where: str, allowed: Sequence[str]) -> str:
    if not isinstance(raw, str) or raw.strip() not in allowed:
        raise _Refused(where, f"unknown distribution {raw!r}; use one of {', '.join(allowed)}")
    return raw.strip()


def _weights(raw: Any, where: str) -> Tuple[float, ...]:
    if isinstance(raw, str):
        items: List[Any] = [item for item in _WEIGHT_SEPARATORS.split(raw.strip()) if item]
    elif isinstance(raw, list):
        items = list(raw)
    else:
        raise _Refused(where, f"{raw!r} is not a list of bucket weights; give numbers >= 0 (CSV: separated by "
                              f"spaces or ';', JSON: a list)")
    if not items:
        raise _Refused(where, "no bucket weights; give at least one number > 0")
    weights = []
    for k, item in enumerate(items):
        weight = _number(item, f"{where}, bucket {k + 1}", "bucket weights >= 0") \
            if not isinstance(item, (list, dict)) else None
        if weight is None or weight < 0:
            raise _Refused(f"{where}, bucket {k + 1}", f"{item!r} is not a weight >= 0; give numbers >= 0")
        weights.append(weight)
    if not sum(weights) > 0:
        raise _Refused(where, f"the {len(weights)} bucket weights sum to 0; give at least one weight > 0")
    return tuple(weights)


@lru_cache(maxsize=1)
def _reserved_names() -> frozenset:
    import torch

    return frozenset(dir(torch.nn.ModuleDict()))


def _resolve(raw_tables: List[_RawTable], cfg: WorkloadConfig) -> List[FileTable]:
    tables: List[FileTable] = []
    first_line_of: Dict[str, int] = {}
    for line, cells in raw_tables:
        table = _resolve_one(line, cells, cfg)
        if table.name in first_line_of:
            raise _Refused(table.where["name"], f"{table.name!r} is also the name on line "
                                                f"{first_line_of[table.name]}; give every table its own name")
        first_line_of[table.name] = line
        tables.append(table)
    return tables


def _resolve_one(line: int, cells: Dict[str, Tuple[Any, str]], cfg: WorkloadConfig) -> FileTable:
    pool, ids = cfg.pooling, cfg.ids
    defaults = {"dim": (cfg.embedding_dim, "workload.embedding_dim"),
                "pooling_mean": (pool.mean, "workload.pooling.mean"),
                "pooling_distribution": (pool.distribution, "workload.pooling.distribution"),
                "pooling_min": (pool.min, "workload.pooling.min"),
                "pooling_max": (pool.max, "workload.pooling.max"),
                "pareto_alpha": (pool.pareto_alpha, "workload.pooling.pareto_alpha"),
                "id_distribution": (ids.distribution, "workload.ids.distribution"),
                "zipf_alpha": (ids.zipf_alpha, "workload.ids.zipf_alpha")}
    where = {column: cells[column][1] if column in cells else defaults.get(column, (None, ""))[1]
             for column in COLUMNS}

    def get(column: str) -> Any:
        return cells[column][0] if column in cells else defaults[column][0]

    raw_name = cells["name"][0]
    if not isinstance(raw_name, str) or not _NAME.match(raw_name.strip()):
        raise _Refused(where["name"], f"{raw_name!r} is not a table name; use letters, digits, '_' and '-', "
                                      f"starting with a letter or '_'")
    name = raw_name.strip()
    if name in _reserved_names():
        raise _Refused(where["name"], f"{name!r} is taken by torch (torchrec keeps tables in a ModuleDict, whose "
                                      f"attributes cannot be keys); rename the table, e.g. '{name}_table'")
    rows = _integer(cells["rows"][0], where["rows"], "the table's row count (e.g. 40000000 or 4e7)", 1)
    dim = _integer(get("dim"), where["dim"], "the embedding dim (e.g. 128)", 1)
    if dim % FBGEMM_DIM_ALIGNMENT:
        raise _Refused(where["dim"], f"{dim} is not a multiple of {FBGEMM_DIM_ALIGNMENT} (fbgemm's embedding "
                                     f"kernels need it); use e.g. {dim + (-dim) % FBGEMM_DIM_ALIGNMENT}")

    distribution = _choice(get("pooling_distribution"), where["pooling_distribution"], POOLING_DISTRIBUTIONS)
    low = _integer(get("pooling_min"), where["pooling_min"], "the smallest pooling factor (e.g. 1)", 0)
    high = _integer(get("pooling_max"), where["pooling_max"], "the largest pooling factor (e.g. 64)", 1)
    mean = _number(get("pooling_mean"), where["pooling_mean"], "the mean ids per sample (e.g. 4)")
    alpha = _number(get("pareto_alpha"), where["pareto_alpha"], "the Pareto shape (> 1)")
    problem = pooling_law_problem(distribution, low, high, mean, alpha, _POOLING_COLUMNS)
    if problem:
        column, value, fix = problem
        raise _Refused(where[_POOLING_COLUMNS[column]], f"{value:g}: {fix}")
    pooling = replace(pool, distribution=distribution, mean=mean, min=low, max=high, pareto_alpha=alpha,
                      per_table_mean=[])

    histogram = _weights(*cells["id_histogram"]) if "id_histogram" in cells else None
    if "id_distribution" in cells:
        id_distribution = _choice(cells["id_distribution"][0], where["id_distribution"], FILE_ID_DISTRIBUTIONS)
    else:
        id_distribution = HISTOGRAM if histogram is not None else _choice(
            ids.distribution, where["id_distribution"], ID_DISTRIBUTIONS)
    zipf_alpha = _number(get("zipf_alpha"), where["zipf_alpha"], "the Zipf exponent, in (0, 5]")
    if id_distribution == "zipf" and not 0 < zipf_alpha <= 5:
        raise _Refused(where["zipf_alpha"], f"{zipf_alpha:g} is not in (0, 5]; give a Zipf exponent in (0, 5] "
                                            f"(~1.05 is typical)")
    if id_distribution == HISTOGRAM:
        if histogram is None:
            raise _Refused(where["id_distribution"], "histogram ids need an id_histogram cell; give the bucket "
                                                     "weights there (or another id_distribution)")
        if len(histogram) > rows:
            raise _Refused(where["id_histogram"], f"{len(histogram)} buckets for {rows} rows; give at most one "
                                                  f"bucket per row")
        table_ids: IdsConfig = HistogramIdsConfig(distribution=HISTOGRAM, zipf_alpha=zipf_alpha,
                                                  histogram=histogram)
    else:
        if histogram is not None:
            raise _Refused(where["id_histogram"], f"a histogram for a table whose id_distribution is "
                                                  f"{id_distribution!r}; leave id_distribution empty or set it "
                                                  f"to histogram (or drop the histogram)")
        table_ids = replace(ids, distribution=id_distribution, zipf_alpha=zipf_alpha)
    return FileTable(name=name, rows=rows, dim=dim, pooling=pooling, ids=table_ids, line=line, where=where)


# --------------------------------------------------------------------------------------------------
# Drawing ids from a histogram
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=256)
def _histogram_buckets(weights: Tuple[float, ...], virtual_rows: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cdf, first rank, width) of each bucket."""
    cdf = np.cumsum(np.asarray(weights, dtype=np.float64))
    cdf /= cdf[-1]
    bounds = _bucket_bounds(virtual_rows, len(weights))
    return cdf, bounds[:-1], np.diff(bounds)


def _bucket_bounds(virtual_rows: int, buckets: int) -> np.ndarray:
    """The first rank (0-based) of each of ``buckets`` near-equal buckets of ranks, then ``virtual_rows``."""
    return np.array([j * virtual_rows // buckets for j in range(buckets + 1)], dtype=np.int64)


def has_id_histograms(tables) -> bool:
    """Does any of these tables (TableSpec or FileTable) draw its ids from a histogram (host generator only)?"""
    return any(t.ids.distribution == HISTOGRAM for t in tables)


def draw_histogram_ids(rng: np.random.Generator, ids_cfg: HistogramIdsConfig, virtual_rows: int,
                       n: int) -> np.ndarray:
    """``n`` ids in ``[0, virtual_rows)`` (int64) whose popularity ranks follow ``ids_cfg.histogram``.

    Per id: one uniform picks the bucket by inverse CDF (a zero-weight bucket is never picked), one
    integer the rank within it; ranks are scattered over the id space by ``zipf_rank_to_id``, as Zipf
    ranks are. Same signature as ``workloads.ids.draw_virtual_ids``.
    """
    virtual_rows = int(virtual_rows)
    weights = tuple(float(w) for w in ids_cfg.histogram)
    if not weights or len(weights) > virtual_rows or not sum(weights) > 0 or min(weights) < 0:
        raise ValueError(f"a histogram needs 1..{virtual_rows} weights >= 0 with a positive sum, got {weights}")
    cdf, first, width = _histogram_buckets(weights, virtual_rows)
    bucket = np.searchsorted(cdf, rng.random(n), side="right")
    np.minimum(bucket, len(weights) - 1, out=bucket)
    ranks = first[bucket] + rng.integers(0, width[bucket], dtype=np.int64)
    return zipf_rank_to_id(ranks + 1, virtual_rows)


def histogram_bucket_of(virtual_ids: np.ndarray, virtual_rows: int, buckets: int) -> np.ndarray:
    """The bucket of each virtual id (inverse of the scatter in `draw_histogram_ids`; for tests and
    checks)."""
    m = zipf_multiplier(int(virtual_rows))
    inverse = pow(m, -1, int(virtual_rows))
    ranks = np.array([(int(v) * inverse) % virtual_rows for v in np.asarray(virtual_ids).tolist()], dtype=np.int64)
    return np.searchsorted(_bucket_bounds(virtual_rows, buckets), ranks, side="right") - 1
