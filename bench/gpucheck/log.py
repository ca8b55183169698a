"""The outcome of every check: one PASS / FAIL / SKIP line each, printed as it happens and kept for JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import List


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # PASS | FAIL | SKIP
    detail: str


class CheckLog:
    def __init__(self) -> None:
        self.checks: List[Check] = []

    def add(self, name: str, verdict: str, detail: str) -> None:
        self.checks.append(Check(name, verdict, detail))
        print(f"{verdict} {name}: {detail}", flush=True)

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.add(name, "PASS" if ok else "FAIL", detail)

    def skip(self, name: str, why: str) -> None:
        self.add(name, "SKIP", why)

    def count(self, verdict: str) -> int:
        return sum(check.verdict == verdict for check in self.checks)

    @property
    def failed(self) -> List[str]:
        return [check.name for check in self.checks if check.verdict == "FAIL"]

    def to_json(self) -> List[dict]:
        return [asdict(check) for check in self.checks]
