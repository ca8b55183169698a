"""The columns of a tables file (workloads.tables_file), and reading one value: a CSV cell or a JSON key's.

Every problem is a `Refused` naming where it stands (line and column or key) and the fix;
workloads.tables_file.load_tables adds the file's name and raises it as one ConfigError line.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

COLUMNS = ("name", "rows", "dim", "pooling_mean", "pooling_distribution", "pooling_min", "pooling_max",
           "pareto_alpha", "id_distribution", "zipf_alpha", "id_histogram")
REQUIRED = ("name", "rows")
# One table as read (workloads.tables_parse): (line of the table, {column: (raw value, where)})
RawTable = Tuple[int, Dict[str, Tuple[Any, str]]]
# in CSV an id_histogram is one cell: its weights separated by spaces or ';' (',' inside a quoted cell)
_WEIGHT_SEPARATORS = re.compile(r"[\s;,]+")


class Refused(Exception):
    """One problem of a tables file, at `where` ("line 4, column rows"; "" when it is the whole file's)."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}" if where else message)


def integer_cell(raw: Any, where: str, what: str, minimum: int) -> int:
    """`raw` as an integer >= `minimum`: an int, or a float or string that holds one exactly (``4e7``,
    ``40_000_000``); a bool is no integer here."""
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
        raise Refused(where, f"{raw!r} is not {kind}; give {what}")
    return value


def number_cell(raw: Any, where: str, what: str) -> float:
    """`raw` as a finite float (a number, or a string that reads as one)."""
    value: Optional[float] = None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        value = float(raw)
    elif isinstance(raw, str):
        try:
            value = float(raw)
        except ValueError:
            value = None
    if value is None or not math.isfinite(value):
        raise Refused(where, f"{raw!r} is not a number; give {what}")
    return value


def choice_cell(raw: Any, where: str, allowed: Sequence[str]) -> str:
    """`raw`, one of the distributions `allowed` (surrounding spaces dropped)."""
    if not isinstance(raw, str) or raw.strip() not in allowed:
        raise Refused(where, f"unknown distribution {raw!r}; use one of {', '.join(allowed)}")
    return raw.strip()


def weights_cell(raw: Any, where: str) -> Tuple[float, ...]:
    """An id_histogram's bucket weights: >= 0, with a positive sum (CSV: one cell; JSON: a list)."""
    if isinstance(raw, str):
        items: List[Any] = [item for item in _WEIGHT_SEPARATORS.split(raw.strip()) if item]
    elif isinstance(raw, list):
        items = list(raw)
    else:
        raise Refused(where, f"{raw!r} is not a list of bucket weights; give numbers >= 0 (CSV: separated by "
                             f"spaces or ';', JSON: a list)")
    if not items:
        raise Refused(where, "no bucket weights; give at least one number > 0")
    weights = []
    for k, item in enumerate(items):
        weight = number_cell(item, f"{where}, bucket {k + 1}", "bucket weights >= 0") \
            if not isinstance(item, (list, dict)) else None
        if weight is None or weight < 0:
            raise Refused(f"{where}, bucket {k + 1}", f"{item!r} is not a weight >= 0; give numbers >= 0")
        weights.append(weight)
    if not sum(weights) > 0:
        raise Refused(where, f"the {len(weights)} bucket weights sum to 0; give at least one weight > 0")
    return tuple(weights)
