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

Here: finding and reading the file. The text is parsed by workloads.tables_parse, each table checked and
resolved by workloads.tables_resolve (a cell's value read by workloads.tables_cells); histogram ids are
drawn by workloads.id_histogram.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from workloads.config import WorkloadConfig
from workloads.rules import ConfigError
from workloads.tables_cells import Refused
from workloads.tables_parse import read_csv, read_json
from workloads.tables_resolve import FileTable, resolve_tables

FIELD = "workload.tables_file"
TABLES_DIR = Path(__file__).resolve().parent.parent / "conf" / "tables"


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
            raw = read_csv(text)
        elif suffix == ".json":
            raw = read_json(text)
        else:
            raise Refused("", f"unknown format {suffix or '(no extension)'!r}; name the file .csv or .json")
        return resolve_tables(raw, cfg)
    except Refused as err:
        raise ConfigError(FIELD, given, str(err)) from None
