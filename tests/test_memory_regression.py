"""The memory regression suite (conf/suite/ci_cpu.yaml by default, see pyproject's addopts).

Each entry launches its workload once under torchrun and is compared with its committed baseline in
results/baselines/<hardware>/<entry>.json; `pytest -m membench --update-baselines` rewrites them.
"""


def test_memory_matches_baseline(membench_entry, membench_check):
    membench_check(membench_entry)
