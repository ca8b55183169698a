"""One rich table for the benchmarks' results."""
from __future__ import annotations

from typing import Collection, List, Sequence

from rich.console import Console
from rich.table import Table


def print_table(title: str, columns: Sequence[str], rows: List[Sequence[str]], left: Collection[str] = (),
                width: int = 200) -> None:
    """Columns named in `left` are left-aligned (labels), the rest right-aligned (numbers)."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="left" if column in left else "right", overflow="fold")
    for row in rows:
        table.add_row(*row)
    Console(width=width).print(table)
