"""Suites: named lists of workloads (Hydra overrides) on one hardware profile, run one torchrun each.

    # conf/suite/ci_cpu.yaml
    name: ci_cpu
    hardware: cpu
    rtol: 0.0            # default tolerance of this suite's baselines (CPU accounting is exact)
    entries:
      - name: tiny_table_wise
        overrides: [workload=tiny, sharding=table_wise]
        expect: ok       # or oom: the status the baseline should hold
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import yaml


ENTRY_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-")


class SuiteError(ValueError):
    """A suite file that cannot be used: one line naming the file, the field and the fix."""


@dataclass(frozen=True)
class SuiteEntry:
    name: str
    hardware: str
    overrides: List[str] = field(default_factory=list)
    expect: str = "ok"

    def all_overrides(self) -> List[str]:
        return [f"hardware={self.hardware}", *self.overrides]

    @property
    def definition_hash(self) -> str:
        """Identity of what the entry asks for; a baseline recorded for another definition is stale."""
        payload = json.dumps({"hardware": self.hardware, "overrides": self.overrides}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Suite:
    name: str
    hardware: str
    rtol: float
    entries: List[SuiteEntry]
    path: Path


def load_suite(path: Path) -> Suite:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SuiteError(f"{path}: suite file not found; pass --membench-suite conf/suite/<name>.yaml") from None
    except yaml.YAMLError as err:
        raise SuiteError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: expected a mapping with name, hardware, entries")
    for key in ("name", "hardware", "entries"):
        if key not in data:
            raise SuiteError(f"{path}: missing `{key}`")
    rtol = data.get("rtol", 0.05)
    if not isinstance(rtol, (int, float)) or rtol < 0:
        raise SuiteError(f"{path}: rtol={rtol!r}: use a number >= 0 (relative tolerance, 0.05 = 5%)")
    entries, seen = [], set()
    for index, raw in enumerate(data["entries"] or []):
        where = f"{path}: entries[{index}]"
        if not isinstance(raw, dict) or "name" not in raw:
            raise SuiteError(f"{where}: each entry needs a `name` (and `overrides`)")
        name = str(raw["name"])
        if not name or set(name) - ENTRY_NAME_CHARS:
            raise SuiteError(f"{where}: name={name!r}: use lower-case letters, digits, '_' and '-' only")
        if name in seen:
            raise SuiteError(f"{where}: name={name!r} is used twice; entry names key the baseline files")
        seen.add(name)
        overrides = raw.get("overrides") or []
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise SuiteError(f"{where}: overrides must be a list of Hydra overrides like 'sharding=table_wise'")
        expect = raw.get("expect", "ok")
        if expect not in ("ok", "oom"):
            raise SuiteError(f"{where}: expect={expect!r}: use ok or oom")
        entries.append(SuiteEntry(name=name, hardware=str(raw.get("hardware", data["hardware"])),
                                  overrides=list(overrides), expect=expect))
    if not entries:
        raise SuiteError(f"{path}: `entries` is empty")
    return Suite(name=str(data["name"]), hardware=str(data["hardware"]), rtol=float(rtol), entries=entries,
                 path=path)
