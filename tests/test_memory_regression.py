"""The memory regression gate: the suite named by `membench_suite` in pyproject.toml (conf/suite/ci_cpu.yaml).

Each entry launches its workload once under torchrun and is compared with its committed baseline in
results/baselines/<hardware>/<entry>.json; `pytest -m membench --update-baselines` rewrites them.
"""
import pytest

pytestmark = pytest.mark.slow  # every entry launches torchrun


def test_memory_matches_baseline(membench_entry, membench_check):
    membench_check(membench_entry)
