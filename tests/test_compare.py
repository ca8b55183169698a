"""`membench compare RUN_A RUN_B`: the regression table for two runs, or two sweeps point by point."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.apps.compare import main
from bench.results.schema import JobStats, RankResult, RunSummary
from bench.results.store import atomic_write_json, write_summary

from conftest import REPO_ROOT


def write_run(run_dir: Path, peaks=(1000, 1000), activations_extra=0, torch_version="2.13.0", config_hash="h",
              run_id=None):
    ranks = [RankResult(rank=r, status="ok", device="cpu", capacity_bytes=10_000, peak_bytes=peak + activations_extra,
                        utilization=(peak + activations_extra) / 10_000,
                        breakdown={"embedding_weights": peak - 100, "activations": 100 + activations_extra})
             for r, peak in enumerate(peaks)]
    mean = sum(r.peak_bytes for r in ranks) / len(ranks)
    write_summary(run_dir, RunSummary(
        run_id=run_id or run_dir.name, status="ok", mode="train", workload="tiny", hardware="cpu", world_size=len(ranks),
        device_type="cpu", device_name="cpu", model_backend="torchrec", config_hash=config_hash,
        versions={"torch": torch_version}, started_at="", wall_s=1.0, exit_code=0, per_rank=ranks,
        job=JobStats(imbalance=max(r.peak_bytes for r in ranks) / mean)))
    return run_dir


def write_sweep(sweep_dir: Path, points):
    """points: [(overrides, kwargs for write_run)]"""
    runs = []
    for index, (overrides, kwargs) in enumerate(points):
        write_run(sweep_dir / str(index), run_id=f"{sweep_dir.name}/{index}", **kwargs)
        runs.append({"run_id": f"{sweep_dir.name}/{index}", "status": "ok", "overrides": overrides, "dir": str(index),
                     "error": None})
    atomic_write_json(sweep_dir / "sweep.json", {"sweep_id": sweep_dir.name, "runs": runs})
    return sweep_dir


def test_identical_runs_exit_0_with_every_rank_listed(tmp_path, capsys):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b")
    assert main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "tiny: a -> b: same within rtol 0" in out
    assert sum(line.startswith("tiny ") and "peak_bytes" in line for line in out.splitlines()) == 2
    assert "2 compared" not in out and "1 compared: all within rtol 0" in out


def test_growth_fails_with_delta_percent_and_the_category_that_moved(tmp_path, capsys):
    a = write_run(tmp_path / "a")
    b = write_run(tmp_path / "b", activations_extra=50, torch_version="2.14.1", config_hash="other")
    assert main([str(a), str(b / "summary.json")]) == 1
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("tiny ") and "peak_bytes" in line]
    assert len(rows) == 2
    for row in rows:
        assert row.split()[3:7] == ["1,000", "1,050", "+50", "+5.00%"] and "activations +50" in row
        assert row.rstrip().endswith("FAIL")
    assert "versions differ from the baseline's: torch 2.13.0 -> 2.14.1" in out
    assert "the resolved configs differ (h -> other)" in out
    assert main([str(a), str(b), "--rtol", "0.05"]) == 0


def test_sweeps_are_compared_point_by_point(tmp_path, capsys):
    points = [(["workload.batch_size=256"], {}), (["workload.batch_size=1024"], {"peaks": (2000, 2000)})]
    a = write_sweep(tmp_path / "sweep-a", points)
    # the same points in another order, the second one grown by 2%
    b = write_sweep(tmp_path / "sweep-b", [(["workload.batch_size=1024"], {"peaks": (2000, 2000),
                                                                          "activations_extra": 40}),
                                          (["workload.batch_size=256"], {})])
    assert main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "points matched by overrides" in out
    assert "tiny[0]: sweep-a/0 -> sweep-b/1 (workload.batch_size=256): same" in out
    assert "tiny[1]: sweep-a/1 -> sweep-b/0 (workload.batch_size=1024): DIFFERENT" in out
    assert "1 of 2 compared differ beyond rtol 0" in out
    assert main([str(a), str(b), "--rtol", "0.03"]) == 0


def test_a_point_missing_from_one_sweep_is_a_difference(tmp_path, capsys):
    a = write_sweep(tmp_path / "sweep-a", [(["x=1"], {}), (["x=2"], {})])
    b = write_sweep(tmp_path / "sweep-b", [(["y=1"], {})])
    assert main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "matched by position" in out and "point 1 x=2 has no counterpart in B" in out


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    run = write_run(tmp_path / "run")
    sweep = write_sweep(tmp_path / "sweep-a", [(["x=1"], {})])
    (tmp_path / "empty").mkdir()
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "summary.json").write_text("{ nope")
    for args, needle in (([str(run), str(tmp_path / "missing")], "no such run or sweep directory"),
                         ([str(run), str(tmp_path / "empty")], "neither a run directory"),
                         ([str(run), str(sweep)], "cannot compare a run"),
                         ([str(run), str(tmp_path / "corrupt")], "not valid JSON"),
                         ([str(run), str(run), "--rtol", "-1"], "--rtol=-1.0")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err


def test_cli_entry_point(tmp_path):
    a, b = write_run(tmp_path / "a"), write_run(tmp_path / "b", peaks=(1000, 1100))
    proc = subprocess.run([sys.executable, "-m", "bench", "compare", str(a), str(b)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DIFFERENT within rtol 0" in proc.stdout
    help_text = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=60).stdout
    assert "compare" in help_text
    assert json.loads((a / "summary.json").read_text())["run_id"] == "a"
