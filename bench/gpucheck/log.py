"""The outcome of every check: one PASS / FAIL / SKIP line each, printed as it happens and kept for JSON."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional


def one_line(err: BaseException) -> str:
    """An exception as one line for a check's detail: its type and its message's first line."""
    text = str(err)
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"


@dataclass(frozen=True)
class Check:
    name: str
    verdict: str  # PASS | FAIL | SKIP
    detail: str


class CheckLog:
    def __init__(self, json_path: Optional[Path] = None, simulated: bool = False) -> None:
        self.checks: List[Check] = []
        self.json_path, self.simulated = json_path, simulated

    def add(self, name: str, verdict: str, detail: str) -> None:
        self.checks.append(Check(name, verdict, detail))
        print(f"{verdict} {name}: {detail}", flush=True)
        self.write()

    def write(self) -> None:
        """gpu_check.json as it stands (atomically: a kill mid-write leaves the previous one)."""
        if self.json_path is None:
            return
        from bench.results.store import atomic_write_json

        atomic_write_json(self.json_path, {"simulated": self.simulated, "checks": self.to_json(),
                                           "failed": self.failed})

    def check(self, name: str, ok: bool, detail: str) -> None:
        self.add(name, "PASS" if ok else "FAIL", detail)

    def verdict(self, name: str, verdict) -> None:
        """A check decided by bench.gpucheck.verdicts."""
        self.check(name, verdict.ok, verdict.detail)

    def skip(self, name: str, why: str) -> None:
        self.add(name, "SKIP", why)

    def count(self, verdict: str) -> int:
        return sum(check.verdict == verdict for check in self.checks)

    @property
    def failed(self) -> List[str]:
        return [check.name for check in self.checks if check.verdict == "FAIL"]

    def to_json(self) -> List[dict]:
        return [asdict(check) for check in self.checks]
