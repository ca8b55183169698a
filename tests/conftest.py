"""Shared helpers: run the real CLI in a subprocess against a temporary results directory, or launch a run
from this process (no CLI start-up: Hydra, torch and torchrec are imported once per test session)."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import List

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
# a rank result's fields that repeat to the byte for a fixed config and seed (CPU accounting is exact)
DETERMINISTIC_FIELDS = ("peak_bytes", "breakdown", "peak_step", "peak_phase", "build_peak_bytes",
                        "warmup_peak_bytes", "capacity_bytes")


@dataclass
class CliRun:
    returncode: int
    output: str
    results_dir: Path

    def run_dirs(self) -> List[Path]:
        return sorted(p.parent for p in self.results_dir.rglob("summary.json"))

    def summaries(self) -> List[dict]:
        return [json.loads((d / "summary.json").read_text()) for d in self.run_dirs()]

    def only_summary(self) -> dict:
        summaries = self.summaries()
        assert len(summaries) == 1, self.output
        return summaries[0]


def run_cli(results_dir: Path, *args: str, timeout: float = 300) -> CliRun:
    # Hydra's flags (-m, --cfg) must come before the overrides
    flags = [a for a in args if a.startswith("-")]
    overrides = [a for a in args if not a.startswith("-")]
    cmd = [sys.executable, "-m", "bench", "run", *flags, f"results_dir={results_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    return CliRun(proc.returncode, proc.stdout + proc.stderr, results_dir)


@pytest.fixture
def cli(tmp_path):
    """Run `membench run ARGS`; each call gets its own results directory."""
    calls = []

    def _run(*args: str, timeout: float = 300) -> CliRun:
        calls.append(None)
        return run_cli(tmp_path / f"runs{len(calls)}", *args, timeout=timeout)
    return _run


def pytest_configure(config):
    # registered here too, so `-m "not slow"` is understood even when pytest misses the project's ini file
    config.addinivalue_line("markers", "slow: launches torchrun (seconds each)")


def run_here(run_dir: Path, *overrides: str) -> dict:
    """Compose, validate and launch one run from the test process, as `membench run OVERRIDES` would;
    returns its summary.json."""
    from bench.run.execute import run_overrides

    run_overrides(list(overrides), run_dir, run_dir.name)
    return json.loads((run_dir / "summary.json").read_text())


def membench_here(capsys, *argv: str):
    """`membench ARGV` from this process, as the CLI runs it (its argument parsing, Hydra app, printing and
    exit status) without an interpreter's start and torch's import: (exit status, stdout, stderr)."""
    from bench.apps.cli import main

    saved_argv = sys.argv[:]
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        sys.argv = saved_argv
    out, err = capsys.readouterr()
    return code, out, err
