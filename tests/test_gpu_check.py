"""scripts/gpu_check.sh --dry-run: the GPU validation flow, with fakes for every CUDA/NVML call."""
from __future__ import annotations

import subprocess

import pytest

from conftest import REPO_ROOT


@pytest.mark.slow
def test_gpu_check_dry_run_passes_every_check():
    proc = subprocess.run(["bash", "scripts/gpu_check.sh", "--dry-run"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("PASS ") for line in lines) == 8
    assert not any(line.startswith("FAIL ") for line in lines)
    assert any(line.startswith("SKIP recorder overhead: dry run") for line in lines)
    assert any(line.startswith("PASS native workload on 2 rank(s)") for line in lines)
    assert lines[-1] == "gpu check (dry run): 8 passed, 0 failed"


def test_gpu_check_without_cuda_fails_clearly():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    from bench.apps.gpu_check import main

    assert main(["--steps", "1"]) == 1
