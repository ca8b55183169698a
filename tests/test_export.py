"""`membench export` and `load_frame`: runs as one table (bench/report/frame.py, bench/apps/export.py)."""
from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from bench.apps import export
from bench.report.frame import load_frame, load_timelines
from bench.results.schema import CATEGORIES, Status

from conftest import REPO_ROOT
from results_factory import GRID, MIB, make_run, make_sweep


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """A results root: a 2 x 2 sweep (batch x seed, one point OOM) and a lone run."""
    root = tmp_path_factory.mktemp("results")
    make_sweep(root / "sweep-20260102-100000-abcdef", GRID, statuses=["ok", "ok", "ok", "oom"])
    make_run(root / "20260101-100000-aaaaaa", ["workload=small", "sharding=column_wise"])
    return root


def test_sweep_frame_has_a_row_per_rank_and_the_swept_axes_as_columns(results):
    frame = load_frame(results / "sweep-20260102-100000-abcdef")
    assert len(frame) == 4 * 2
    assert sorted(frame["workload.batch_size"].unique()) == [8, 16]
    assert sorted(frame["workload.seed"].unique()) == [0, 1]
    assert frame.groupby(["workload.batch_size", "workload.seed"]).size().eq(2).all()
    assert set(frame["sweep_id"]) == {"sweep-20260102-100000-abcdef"}
    assert frame["sweep_axes"].iloc[0] == "workload.batch_size,workload.seed"
    for column in ("run_id", "status", "rank", "peak_bytes", "peak_allocated_bytes", "peak_reserved_bytes",
                   "peak_device_used_bytes", "utilization", "headroom_bytes", "job.step_time_ms_p50",
                   "predicted_peak_bytes", "prediction_error_pct", "version.python", "sharding", "hardware",
                   "model", "allocator.expandable_segments", *(f"breakdown.{c}" for c in CATEGORIES)):
        assert column in frame.columns, column
    breakdown = frame[[f"breakdown.{c}" for c in CATEGORIES]].sum(axis=1)
    assert (breakdown == frame["peak_bytes"]).all()  # the schema's promise holds in the table
    assert frame["peak_bytes"].dtype == "Int64"  # bytes stay integers, also where a value is missing
    # the load_frame example's lines (docs/reports.md)
    by_batch = frame.groupby("workload.batch_size")["peak_bytes"].max()
    assert by_batch[16] == 23 * MIB
    assert set(frame.loc[frame["status"] == "oom", "workload.batch_size"]) == {16}


def test_every_run_under_a_results_root_with_its_groups_as_columns(results):
    frame = load_frame([results])
    assert frame["run_id"].nunique() == 5
    lone = frame[frame["run_id"] == "20260101-100000-aaaaaa"]
    assert set(lone["workload"]) == {"small"} and set(lone["sharding"]) == {"column_wise"}
    assert set(lone["model"]) == {"torchrec"} and set(lone["hardware"]) == {"cpu"}
    assert lone["sweep_id"].isna().all() and lone["sweep_axes"].isna().all()


def test_export_writes_csv_and_jsonl_that_pandas_reads_back(results, tmp_path, capsys):
    csv_path, jsonl_path = tmp_path / "runs.csv", tmp_path / "out" / "runs.jsonl"
    assert export.main([str(results), "--out", str(csv_path)]) == 0
    assert "10 rows (run x rank) of 5 runs, " in capsys.readouterr().out
    assert export.main([str(results), "-o", str(jsonl_path)]) == 0
    from_csv = pd.read_csv(csv_path)
    from_jsonl = pd.read_json(jsonl_path, lines=True)
    assert len(from_csv) == len(from_jsonl) == 10
    assert list(from_csv.columns) == list(from_jsonl.columns)
    assert from_csv["peak_bytes"].dtype.kind == "i"  # written as integers, not 2.1e7
    first = json.loads(jsonl_path.read_text().splitlines()[0])
    assert first["run_id"] and "breakdown.activations" in first


def test_timelines_are_one_long_table(results, tmp_path):
    frame = load_timelines(results / "sweep-20260102-100000-abcdef")
    assert list(frame.columns[:4]) == ["run_id", "sweep_id", "point", "rank"]
    assert {"time_s", "step", "phase", "in_use_bytes", "phase_peak_bytes"} <= set(frame.columns)
    assert len(frame) == 4 * 2 * (1 + 3 * 4)  # points x ranks x (build + steps x phases)
    out = tmp_path / "timelines.csv"
    assert export.main([str(results / "sweep-20260102-100000-abcdef"), "--timelines", "--out", str(out)]) == 0
    assert len(pd.read_csv(out)) == len(frame)


def test_unreadable_and_foreign_files_are_named_and_skipped(tmp_path, capsys):
    make_run(tmp_path / "good")
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "summary.json").write_text("{not json")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "summary.json").write_text(json.dumps({"title": "someone else's summary"}))
    (tmp_path / "good" / "timeline_rank1.csv").write_text("")  # torn
    notes = tmp_path / "notes.txt"
    notes.write_text("not results")
    out = tmp_path / "runs.csv"
    assert export.main([str(tmp_path), str(notes), str(tmp_path / "missing"), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for named in ("corrupt/summary.json", "foreign/summary.json", "notes.txt", "missing"):
        assert f"{named}" in err and "membench export: warning:" in err, named
    assert pd.read_csv(out)["run_id"].tolist() == ["good", "good"]
    assert export.main([str(tmp_path / "good"), "--timelines", "--out", str(tmp_path / "t.csv")]) == 0
    err = capsys.readouterr().err
    assert "timeline_rank1.csv" in err
    assert set(pd.read_csv(tmp_path / "t.csv")["rank"]) == {0}


def test_an_empty_selection_says_so_and_exits_non_zero(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert export.main([str(tmp_path / "empty"), "--out", str(tmp_path / "x.csv")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"membench export: no summary.json under {tmp_path / 'empty'}; run `membench run` first"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("[]")
    assert export.main([str(tmp_path / "bad"), "--out", str(tmp_path / "x.csv")]) == 2
    assert "no readable summary.json" in capsys.readouterr().err
    assert not (tmp_path / "x.csv").exists()


def test_parquet_without_pyarrow_and_unknown_formats_are_one_line(results, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if not installed
    assert export.main([str(results), "--out", str(tmp_path / "runs.parquet")]) == 2
    assert capsys.readouterr().err.strip() == ("membench export: .parquet needs pyarrow (`pip install pyarrow`); "
                                               "or write .csv or .jsonl")
    assert export.main([str(results), "--out", str(tmp_path / "runs.xlsx")]) == 2
    assert "name the file .csv, .jsonl or .parquet" in capsys.readouterr().err


def test_a_run_without_ranks_is_one_row(tmp_path):
    make_run(tmp_path / "invalid", peaks=(), status=Status.INVALID)
    frame = load_frame(tmp_path)
    assert len(frame) == 1 and frame["rank"].isna().all() and frame["status"].iloc[0] == "invalid"


def test_cli_lists_and_dispatches_export_and_ls(results, tmp_path):
    usage = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert "export" in usage.stdout and "  ls " in usage.stdout
    out = tmp_path / "runs.csv"
    proc = subprocess.run([sys.executable, "-m", "bench", "export", str(results), "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert len(pd.read_csv(out)) == 10
