"""scripts/gpu_check.sh: the GPU validation flow. Here (no GPU) its dry run, with fakes for every CUDA/NVML
call, and the one-line refusal without a GPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT


@pytest.mark.slow
def test_gpu_check_dry_run_passes_every_check(tmp_path):
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run", "--out", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert not any(line.startswith("FAIL ") for line in lines)
    for name in ("allocator peaks", "breakdown sums to peak", "forced OOM recorded", "native workload",
                 "native: timeline", "forced OOM run", "watchdog drill", "torchrec workload",
                 "prediction vs measured"):
        assert any(line.startswith(f"PASS {name}:") for line in lines), name
    assert [line.split(":")[0] for line in lines if line.startswith("SKIP ")] == ["SKIP API probes",
                                                                                 "SKIP recorder overhead"]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] and report["failed"] == [] and len(report["checks"]) == 14
    assert lines[-1] == "gpu check (dry run): 12 passed, 0 failed, 2 skipped"


def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from bench.apps.gpu_check import main

    assert main(["--out", str(tmp_path)]) == 2
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--out", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpu check: no CUDA device visible")
    assert not (tmp_path / "gpu_check.json").exists()
