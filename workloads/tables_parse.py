"""A tables file's text, CSV or JSON, as raw tables: each table's line and its cells as written, each with
where it stands ("line 4, column rows" / "line 4, key rows"), for workloads.tables_resolve to check.

Cells a table leaves empty (CSV "", JSON null or "") are left out: they take the workload's value.
"""
from __future__ import annotations

import csv
import difflib
import json
import json.decoder
import json.scanner
from typing import Any, List, Tuple

from workloads.tables_cells import COLUMNS, REQUIRED, RawTable, Refused


def _unknown_column(column: str, where: str) -> Refused:
    close = difflib.get_close_matches(column, COLUMNS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return Refused(where, f"unknown column {column!r}; {hint}columns are {', '.join(COLUMNS)}")


# --------------------------------------------------------------------------------------------------
# CSV
# --------------------------------------------------------------------------------------------------


def read_csv(text: str) -> List[RawTable]:
    """The tables of a CSV text: a header line, then one line per table (blank and ``#`` lines skipped)."""
    lines = [(number, line) for number, line in enumerate(text.splitlines(), start=1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise Refused("", f"the file is empty; give a header line ({','.join(REQUIRED)},...) and one line "
                          f"per table")
    header_line, header_text = lines[0]
    header = _csv_header(header_text, header_line)
    if len(lines) == 1:
        raise Refused(f"line {header_line}", "a header but no tables; add one line per table")
    tables: List[RawTable] = []
    for number, line in lines[1:]:
        cells = [cell.strip() for cell in _csv_cells(line, number)]
        if len(cells) != len(header):
            raise Refused(f"line {number}", f"{len(cells)} cells for the {len(header)} columns of the header "
                                            f"(line {header_line}); give one cell per column (an empty cell "
                                            f"takes the workload's value)")
        tables.append((number, {column: (cell, f"line {number}, column {column}")
                                for column, cell in zip(header, cells) if cell != ""}))
    return tables


def _csv_header(text: str, number: int) -> List[str]:
    """The header line's columns: each known, none twice, the required ones there."""
    header = [cell.strip() for cell in _csv_cells(text, number)]
    for i, column in enumerate(header):
        where = f"line {number}, column {i + 1}"
        if not column:
            raise Refused(where, "empty column name in the header; name every column")
        if column not in COLUMNS:
            raise _unknown_column(column, f"line {number}, column {column}")
        if header.index(column) != i:
            raise Refused(f"line {number}, column {column}", "the column appears twice; keep one")
    for column in REQUIRED:
        if column not in header:
            raise Refused(f"line {number}", f"no {column!r} column in the header; add it (required "
                                            f"columns: {', '.join(REQUIRED)})")
    return header


def _csv_cells(line: str, number: int) -> List[str]:
    try:
        return next(csv.reader([line], strict=True))
    except csv.Error as err:
        raise Refused(f"line {number}", f"not a CSV line ({err}); quote cells that hold commas") from None


# --------------------------------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------------------------------


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


def read_json(text: str) -> List[RawTable]:
    """The tables of a JSON text: ``[{...}, ...]`` or ``{"tables": [...]}`` (and an optional
    ``"description"``)."""
    if not text.strip():
        raise Refused("", 'the file is empty; give a JSON list of tables, e.g. [{"name": "t0", "rows": 1000}]')
    try:
        doc = _LocatingDecoder().decode(text)
    except json.JSONDecodeError as err:
        raise Refused(f"line {err.lineno}, column {err.colno}", f"JSON syntax error: {err.msg}; fix the JSON "
                                                                f"there") from None
    return [_json_table(text, index, obj) for index, obj in enumerate(_json_table_list(text, doc))]


def _json_table_list(text: str, doc: Any) -> list:
    """The document's list of tables (the top-level list, or its "tables"), not empty."""
    if isinstance(doc, _Located):
        where = f"line {_line_col(text, doc.start)[0]}"
        extra = [key for key in doc if key not in ("tables", "description")]
        if extra:
            raise Refused(_key_where(text, doc, extra[0]), f"unknown key {extra[0]!r}; the top-level object "
                                                           f"holds \"tables\" (and an optional \"description\")")
        if "tables" not in doc:
            raise Refused(where, 'no "tables" key; give {"tables": [{"name": ..., "rows": ...}, ...]}')
        doc = doc["tables"]
    if not isinstance(doc, list):
        raise Refused("line 1", 'expected a list of tables ([{"name": ..., "rows": ...}, ...]) or '
                                '{"tables": [...]}')
    if not doc:
        raise Refused("", "the list of tables is empty; add one object per table")
    return doc


def _json_table(text: str, index: int, obj: Any) -> RawTable:
    """Table `index` (0-based) of the list: an object with known keys, each once, the required ones there."""
    if not isinstance(obj, _Located):
        raise Refused("", f"table {index + 1} is {json.dumps(obj)[:40]}, not an object; give each table as "
                          f"{{\"name\": ..., \"rows\": ...}}")
    line = _line_col(text, obj.start)[0]
    if obj.duplicates:
        key = obj.duplicates[0]
        raise Refused(_key_where(text, obj, key, occurrence=2), f"key {key!r} appears twice in this table; "
                                                                f"keep one")
    for key in obj:
        if key not in COLUMNS:
            raise _unknown_column(key, _key_where(text, obj, key))
    for key in REQUIRED:
        if key not in obj:
            raise Refused(f"line {line}", f"table {index + 1} has no {key!r} key; add it (required keys: "
                                          f"{', '.join(REQUIRED)})")
    return line, {key: (value, _key_where(text, obj, key)) for key, value in obj.items()
                  if value is not None and value != ""}
