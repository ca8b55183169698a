"""membench's exact CPU accounting against PyTorch's own tracker (torch.distributed._tools.mem_tracker).

Each case is a CI suite entry, trained by the same worker (model, batches, step order) once with
membench's recorder and twice with MemTracker counting instead (`record.cpu_mode=memtracker`). MemTracker
applies a gloo thread's release whenever it lands, so it is compared at its lowest peak over the runs
(the run without a late off-thread free). membench must agree with it: the peak within 0.5 % and in the
same step and phase, and the live bytes at the end of every phase exactly. And the gradients at the
peak are DDP's buckets of the measured steps (the size of what they hold), not those it rebuilt once.
"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, run_here

SUITE = REPO_ROOT / "conf" / "suite" / "ci_cpu.yaml"
CASES = ("tiny_table_wise", "tiny_column_wise_dcn", "tiny_data_parallel", "tiny_native")
MEMTRACKER_RUNS = 2
PEAK_RTOL = 0.005


def suite_overrides(name: str) -> list:
    entries = {entry["name"]: entry for entry in yaml.safe_load(SUITE.read_text())["entries"]}
    return ["hardware=cpu", *entries[name]["overrides"]]


def phase_ends(run_dir: Path, rank: int) -> list:
    with open(run_dir / f"timeline_rank{rank}.csv") as handle:
        return [(row["step"], row["phase"], int(row["in_use_bytes"])) for row in csv.DictReader(handle)]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_exact_accounting_agrees_with_memtracker(case, tmp_path):
    overrides = suite_overrides(case)
    exact_dir = tmp_path / "exact"
    exact = run_here(exact_dir, *overrides)
    references = []
    for attempt in range(MEMTRACKER_RUNS):
        run_dir = tmp_path / f"memtracker{attempt}"
        references.append((run_here(run_dir, *overrides, "record.cpu_mode=memtracker"), run_dir))
    assert exact["status"] == "ok" and all(summary["status"] == "ok" for summary, _ in references)
    for rank in exact["per_rank"]:
        r = rank["rank"]
        assert rank["recorder"] == "cpu_exact"
        lowest = min((summary["per_rank"][r] for summary, _ in references), key=lambda theirs: theirs["peak_bytes"])
        assert lowest["recorder"] == "memtracker"
        error = rank["peak_bytes"] / lowest["peak_bytes"] - 1
        assert abs(error) <= PEAK_RTOL, (case, r, rank["peak_bytes"], lowest["peak_bytes"])
        # the phase (steady-state steps tie, so the step of the first of equal peaks is not compared)
        assert rank["peak_phase"] == lowest["peak_phase"], (case, r, rank["peak_phase"], lowest["peak_phase"])
        # every phase end exactly, against a MemTracker run without a late off-thread free there
        mine = phase_ends(exact_dir, r)
        theirs = [phase_ends(run_dir, r) for _, run_dir in references]
        assert mine in theirs, (case, r, [[(a, b) for a, b in zip(mine, other) if a != b] for other in theirs])
        breakdown = rank["breakdown"]
        assert breakdown["dense_grads"] == breakdown["dense_params"], (case, r, breakdown)
        if case == "tiny_data_parallel":  # every table data-parallel: its gradients as large as its weights
            assert breakdown["embedding_grads"] == breakdown["embedding_weights"], (case, r, breakdown)
