"""The regression gate's comparison of a run against its baseline, without launching (bench.harness.baseline:
tolerances, the failure table, version changes, OOM sites; baseline and suite files), and the repository's own
suites and CI workflow. The gate end to end, through pytest: test_harness.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness.baseline import (
    BaselineError,
    compare,
    describe_update,
    format_comparison,
    format_rows,
    load_baseline,
    make_baseline,
    moved_most,
    version_changes,
)
from bench.results.schema import JobStats, RankResult, RunSummary
from bench.harness.suite import SuiteEntry, SuiteError, load_suite

ENTRY = SuiteEntry(name="w", hardware="cpu", overrides=["workload=tiny"])


def summary(status="ok", peaks=(100, 100), capacity=1000, oom_rank=None, imbalance=1.0, breakdowns=None,
            versions=None) -> RunSummary:
    ranks = []
    for rank, peak in enumerate(peaks):
        oom = {"rank": rank, "step": 2, "phase": "backward", "requested_bytes": 10, "message": "m"} \
            if rank == oom_rank else None
        breakdown = breakdowns[rank] if breakdowns else {"activations": peak}
        ranks.append(RankResult(rank=rank, status="oom" if oom else "ok", device="cpu", capacity_bytes=capacity,
                                peak_bytes=peak, utilization=peak / capacity, oom=oom, breakdown=breakdown))
    return RunSummary(run_id="r", status=status, mode="train", workload="tiny", hardware="cpu",
                      world_size=len(peaks), device_type="cpu", device_name="cpu", model_backend="torchrec",
                      config_hash="h", versions=versions or {"torch": "2.13.0"}, started_at="", wall_s=0.0,
                      exit_code=0, per_rank=ranks, job=JobStats(imbalance=imbalance))


def failed(result):
    return [(row.rank, row.metric) for row in result.failed_rows]


def test_within_tolerance_passes_and_beyond_fails():
    baseline = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.05)
    assert compare(ENTRY, baseline, summary(peaks=(104, 100))).ok
    result = compare(ENTRY, baseline, summary(peaks=(106, 100)))
    assert failed(result) == [("0", "peak_bytes")]
    table = format_rows(result.rows)
    assert "+6.00%" in table and "+6" in table
    # every rank is in the table, the failing one marked
    assert [(row.rank, row.failed) for row in result.rows] == [("0", True), ("1", False)]


def test_table_names_the_category_that_moved_most():
    base = summary(peaks=(1000,), breakdowns=[{"activations": 600, "comm_buffers": 400}])
    now = summary(peaks=(1300,), breakdowns=[{"activations": 650, "comm_buffers": 650}])
    result = compare(ENTRY, make_baseline(ENTRY, base, rtol=0.0), now)
    (row,) = result.rows
    assert (row.delta, row.delta_pct, row.moved_most) == ("+300", "+30.00%", "comm_buffers +250")
    assert moved_most(None, {"activations": 1}) == "n/a (baseline has no breakdown)"
    assert moved_most({"a": 5}, {"a": 5}) == ""


def test_version_changes_are_named():
    assert version_changes({"torch": "2.13.0", "fbgemm-gpu-cpu": "1.8.0"},
                           {"torch": "2.14.1", "fbgemm-gpu": "1.8.0"}) == [
        "torch 2.13.0 -> 2.14.1", "fbgemm-gpu (absent) -> 1.8.0", "fbgemm-gpu-cpu 1.8.0 -> (absent)"]
    baseline = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.0)
    result = compare(ENTRY, baseline, summary(peaks=(120, 100), versions={"torch": "2.14.1"}))
    assert "versions differ from the baseline's: torch 2.13.0 -> 2.14.1" in format_comparison(result)


def test_utilization_drop_is_an_under_utilization_regression():
    baseline = make_baseline(ENTRY, summary(peaks=(500, 500)), rtol=0.0)
    result = compare(ENTRY, baseline, summary(peaks=(500, 400)))
    assert failed(result) == [("1", "utilization")]
    assert any("peak shrank" in note for note in result.notes)


def test_oom_baseline_now_ok_is_an_improvement_not_a_failure():
    baseline = make_baseline(ENTRY, summary(status="oom", oom_rank=1), rtol=0.0)
    result = compare(ENTRY, baseline, summary())
    assert result.ok and any("improved" in note for note in result.notes)


def test_ok_to_oom_names_rank_step_and_phase():
    baseline = make_baseline(ENTRY, summary(), rtol=0.0)
    result = compare(ENTRY, baseline, summary(status="oom", oom_rank=1))
    assert not result.ok
    assert result.reasons == ["w: status ok -> oom at rank 1 step 2 backward"]


def test_expected_oom_that_moves_fails():
    baseline = make_baseline(ENTRY, summary(status="oom", oom_rank=1), rtol=0.0)
    assert compare(ENTRY, baseline, summary(status="oom", oom_rank=1)).ok
    moved = compare(ENTRY, baseline, summary(status="oom", oom_rank=0))
    assert [r.metric for r in moved.failed_rows] == ["oom site"]


def test_rtol_override_and_update_description():
    baseline = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.0)
    assert compare(ENTRY, baseline, summary(peaks=(110, 110), imbalance=1.0), rtol_override=0.2).ok
    new = make_baseline(ENTRY, summary(peaks=(120, 100)), rtol=0.0)
    assert describe_update(baseline, new) == "w: rank 0 peak 100 -> 120 (+20.00%)"
    assert describe_update(baseline, baseline) == "w: unchanged"


def test_version_1_baselines_without_breakdown_are_still_read(tmp_path):
    old = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.0)
    old["schema_version"] = 1
    for rank in old["per_rank"]:
        del rank["breakdown"]
    path = tmp_path / "w.json"
    path.write_text(json.dumps(old))
    result = compare(ENTRY, load_baseline(path, ENTRY), summary(peaks=(110, 100)))
    assert failed(result) == [("0", "peak_bytes")]
    assert result.rows[0].moved_most == "n/a (baseline has no breakdown)"


def test_baseline_schema_and_suite_errors_are_one_line(tmp_path):
    path = tmp_path / "b.json"
    path.write_text(json.dumps({"schema_version": 99}))
    with pytest.raises(BaselineError, match="schema_version 99") as info:
        load_baseline(path, ENTRY)
    assert "\n" not in str(info.value)
    good = make_baseline(ENTRY, summary(), rtol=0.0)
    good["tolerances"]["peak_bytes"] = 15_000_000
    path.write_text(json.dumps(good))
    with pytest.raises(BaselineError, match="tolerances.peak_bytes=15000000"):
        load_baseline(path, ENTRY)
    suite = tmp_path / "s.yaml"
    suite.write_text("name: s\nhardware: cpu\nentries:\n  - {name: 'Bad Name'}\n")
    with pytest.raises(SuiteError, match="lower-case"):
        load_suite(suite)


def test_ci_suite_covers_what_ci_needs():
    suite = load_suite(Path(__file__).resolve().parent.parent / "conf" / "suite" / "ci_cpu.yaml")
    assert 4 <= len(suite.entries) <= 11  # each about 10 s of CI (the emulated one, one process, about 5)
    text = " ".join(" ".join(e.overrides) for e in suite.entries)
    for needle in ("sharding=table_wise", "sharding=column_wise", "sharding=data_parallel", "dlrm_dcn", "zipf",
                   "model=native", "pipeline=base", "pipeline=sparse_dist", "pipeline=sparse_dist_lite",
                   "emulate.world_size=64"):
        assert needle in text
    assert [e.expect for e in suite.entries].count("oom") == 1
    baselines = Path(__file__).resolve().parent.parent / "results" / "baselines" / "cpu"
    for entry in suite.entries:
        assert (baselines / f"{entry.name}.json").exists(), entry.name


def test_workflow_runs_ci_on_push_and_gpu_suite_nightly():
    import yaml

    root = Path(__file__).resolve().parent.parent
    workflow = yaml.safe_load((root / ".github" / "workflows" / "nightly.yml").read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as True
    assert {"push", "schedule"} <= set(triggers)
    cpu_steps = " ".join(step.get("run", "") for step in workflow["jobs"]["cpu"]["steps"])
    assert "bash .ci/run" in cpu_steps
    gpu = workflow["jobs"]["gpu-nightly"]
    assert "gpu" in gpu["runs-on"] and "schedule" in gpu["if"]
    gpu_steps = " ".join(step.get("run", "") for step in gpu["steps"])
    assert "scripts/gpu_check.sh" in gpu_steps and "conf/suite/nightly_gpu.yaml" in gpu_steps
    # audit N20: the check validates the venv's torch (the suite's), and a FAIL there does not skip the suite
    (check,) = [step for step in gpu["steps"] if "gpu_check.sh" in step.get("run", "")]
    assert check["run"].startswith("PYTHON=.venv/bin/python ")
    assert gpu_steps.index("scripts/install.sh") < gpu_steps.index("gpu_check.sh")
    (suite_step,) = [step for step in gpu["steps"] if "nightly_gpu.yaml" in step.get("run", "")]
    assert suite_step.get("if") == "always()"
    assert any(step.get("uses", "").startswith("actions/upload-artifact") for step in gpu["steps"])
    for suite in ("ci_cpu", "nightly_gpu"):
        load_suite(root / "conf" / "suite" / f"{suite}.yaml")


def test_estimate_error_growth_fails_beyond_one_point():
    measured = summary(peaks=(100, 100))
    measured.estimate = {"error_pct": [0.5, -1.0]}
    baseline = make_baseline(ENTRY, measured, rtol=0.0)
    assert baseline["estimate_error_pct"] == 1.0
    measured.estimate = {"error_pct": [1.9, -1.0]}
    assert compare(ENTRY, baseline, measured).ok
    measured.estimate = {"error_pct": [2.5, -1.0]}
    assert [r.metric for r in compare(ENTRY, baseline, measured).failed_rows] == ["estimate |error| %"]
