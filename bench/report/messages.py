"""What `membench report` tells its user: progress on stdout, warnings on stderr, one-line errors."""
from __future__ import annotations

import sys
from typing import List

PROG = "membench report"


class ReportError(Exception):
    """No report can be written; the message is the one line printed on stderr."""


class NoResults(ReportError):
    """Nothing to report; the message is the one line printed on stderr."""


def info(message: str) -> None:
    print(f"[report] {message}", flush=True)


class WarningLog:
    """The warnings of one report: printed on stderr as they happen and kept, because report.md lists them.
    `prog` names the command in them (the loaders also serve `membench export` and `membench ls`)."""

    def __init__(self, prog: str = PROG) -> None:
        self.prog = prog
        self.items: List[str] = []

    def warn(self, message: str) -> None:
        self.items.append(message)
        print(f"{self.prog}: warning: {message}", file=sys.stderr, flush=True)
