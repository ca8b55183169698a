"""Proof that the regression harness catches regressions: plant one, run the plugin (pytester), and
check that it fails with the right message; plus the baseline comparison logic on its own."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.baseline import BaselineError, compare, describe_update, format_rows, load_baseline, make_baseline
from bench.results import JobStats, RankResult, RunSummary
from bench.suite import SuiteEntry, SuiteError, load_suite

pytest_plugins = ["pytester"]

TEST_FILE = """
def test_memory(membench_entry, membench_check):
    membench_check(membench_entry)
"""
BASE = ["workload=tiny", "sharding=table_wise", "workload.steps=2", "workload.num_tables=4"]


def write_suite(directory: Path, overrides, name="planted") -> Path:
    suite = directory / "suite.yaml"
    suite.write_text(json.dumps({"name": "t", "hardware": "cpu", "rtol": 0.0,
                                 "entries": [{"name": name, "overrides": list(overrides)}]}))
    return suite


def inner_args(directory: Path, suite: Path, *extra: str):
    return ["-p", "no:cacheprovider", f"--membench-suite={suite}", f"--baseline-dir={directory / 'baselines'}",
            f"--membench-results-dir={directory / 'runs'}", *extra]


def make_baseline_dir(directory: Path, overrides) -> Path:
    """A baseline recorded by the plugin itself (--update-baselines), in a fresh directory."""
    directory.mkdir(parents=True)
    (directory / "test_mem.py").write_text(TEST_FILE)
    suite = write_suite(directory, overrides)
    proc = subprocess.run([sys.executable, "-m", "pytest", *inner_args(directory, suite, "--update-baselines")],
                          cwd=directory, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "updated baseline: planted: new baseline (status ok)" in proc.stdout
    return directory / "baselines"


@pytest.fixture(scope="module")
def tiny_baseline(tmp_path_factory) -> Path:
    return make_baseline_dir(tmp_path_factory.mktemp("harness") / "base", BASE)


def run_planted(pytester, baselines: Path, overrides):
    shutil.copytree(baselines, pytester.path / "baselines")
    pytester.makepyfile(test_mem=TEST_FILE)
    suite = write_suite(pytester.path, overrides)
    return pytester.runpytest_subprocess(*inner_args(pytester.path, suite), timeout=300)


# -- planted regressions -------------------------------------------------------------------------
@pytest.mark.slow
def test_unchanged_run_passes_with_zero_tolerance(pytester, tiny_baseline):
    result = run_planted(pytester, tiny_baseline, BASE)
    result.assert_outcomes(passed=1)


@pytest.mark.slow
def test_larger_batch_fails_on_peak_growth(pytester, tiny_baseline):
    result = run_planted(pytester, tiny_baseline, [*BASE, "workload.batch_size=2048"])
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "workload  rank  metric" in output  # the failure table
    assert any(line.startswith("planted   0     peak_bytes") for line in output.splitlines()), output
    assert "another definition of this entry" in output


@pytest.mark.slow
def test_lower_capacity_turns_ok_into_oom(pytester, tiny_baseline):
    result = run_planted(pytester, tiny_baseline, [*BASE, "hardware.capacity_gib=0.005"])
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "planted: status ok -> oom at rank" in output



@pytest.mark.slow
def test_sharding_change_that_worsens_imbalance(pytester, tmp_path):
    one_table = ["workload=tiny", "workload.num_tables=1", "workload.rows=100000", "workload.steps=2"]
    baselines = make_baseline_dir(tmp_path / "dp", [*one_table, "sharding=data_parallel"])  # replicated: balanced
    result = run_planted(pytester, baselines, [*one_table, "sharding=table_wise"])
    result.assert_outcomes(failed=1)
    assert any(line.startswith("planted   job   imbalance") for line in result.stdout.lines), result.stdout.str()


def test_corrupt_baseline_fails_in_one_line_without_running(pytester, tmp_path):
    baselines = tmp_path / "b"
    (baselines / "cpu").mkdir(parents=True)
    (baselines / "cpu" / "planted.json").write_text("{ not json")
    result = run_planted(pytester, baselines, BASE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*corrupt baseline*planted.json (not valid JSON*regenerate with: pytest -m membench "
                                 "--update-baselines*"])
    assert not (pytester.path / "runs").exists()  # nothing was launched


def test_missing_baseline_says_how_to_create_it(pytester, tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_planted(pytester, tmp_path / "empty", BASE)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*no baseline for planted at*regenerate with*--update-baselines*"])


def test_bad_suite_file_is_a_usage_error(pytester):
    pytester.makepyfile(test_mem=TEST_FILE)
    (pytester.path / "suite.yaml").write_text("name: x\nhardware: cpu\nentries:\n  - overrides: []\n")
    result = pytester.runpytest_subprocess("--membench-suite=suite.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entries[[]0[]]: each entry needs a `name`*"])


# -- comparison logic without launching ----------------------------------------------------------
ENTRY = SuiteEntry(name="w", hardware="cpu", overrides=["workload=tiny"])


def summary(status="ok", peaks=(100, 100), capacity=1000, oom_rank=None, imbalance=1.0) -> RunSummary:
    ranks = []
    for rank, peak in enumerate(peaks):
        oom = {"rank": rank, "step": 2, "phase": "backward", "requested_bytes": 10, "message": "m"} \
            if rank == oom_rank else None
        ranks.append(RankResult(rank=rank, status="oom" if oom else "ok", device="cpu", capacity_bytes=capacity,
                                peak_bytes=peak, utilization=peak / capacity, oom=oom))
    return RunSummary(run_id="r", status=status, mode="train", workload="tiny", hardware="cpu",
                      world_size=len(peaks), device_type="cpu", device_name="cpu", model_backend="torchrec",
                      config_hash="h", versions={}, started_at="", wall_s=0.0, exit_code=0, per_rank=ranks,
                      job=JobStats(imbalance=imbalance))


def test_within_tolerance_passes_and_beyond_fails():
    baseline = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.05)
    assert compare(ENTRY, baseline, summary(peaks=(104, 100))).ok
    result = compare(ENTRY, baseline, summary(peaks=(106, 100)))
    assert [(r.rank, r.metric) for r in result.rows] == [("0", "peak_bytes")]
    assert "+6.00%" in format_rows(result.rows)


def test_utilization_drop_is_an_under_utilization_regression():
    baseline = make_baseline(ENTRY, summary(peaks=(500, 500)), rtol=0.0)
    result = compare(ENTRY, baseline, summary(peaks=(500, 400)))
    assert [(r.rank, r.metric) for r in result.rows] == [("1", "utilization")]
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
    assert [r.metric for r in moved.rows] == ["oom site"]


def test_rtol_override_and_update_description():
    baseline = make_baseline(ENTRY, summary(peaks=(100, 100)), rtol=0.0)
    assert compare(ENTRY, baseline, summary(peaks=(110, 110), imbalance=1.0), rtol_override=0.2).ok
    new = make_baseline(ENTRY, summary(peaks=(120, 100)), rtol=0.0)
    assert describe_update(baseline, new) == "w: rank 0 peak 100 -> 120 (+20.00%)"
    assert describe_update(baseline, baseline) == "w: unchanged"


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
    assert 4 <= len(suite.entries) <= 8
    text = " ".join(" ".join(e.overrides) for e in suite.entries)
    for needle in ("sharding=table_wise", "sharding=column_wise", "sharding=data_parallel", "dlrm_dcn", "zipf",
                   "model=native"):
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
    assert [r.metric for r in compare(ENTRY, baseline, measured).rows] == ["estimate |error| %"]
