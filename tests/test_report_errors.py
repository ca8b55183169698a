"""`membench report` (bench.report) on input it cannot use: corrupt or unreadable summaries, an empty or
missing directory, a bad --format; each a warning or a one-line error with exit code 2."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.report import loading

from conftest import REPO_ROOT
from report_results import CAP, MIB, make_rank, make_run, run_report


def test_corrupt_summary_is_skipped_with_warning(tmp_path, capsys):
    root = tmp_path / "runs"
    make_run(root / "good", [make_rank(0, 20 * MIB, CAP), make_rank(1, 21 * MIB, CAP)])
    bad = root / "bad" / "summary.json"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    code, _, err = run_report(capsys, root, "--format", "png")
    assert code == 0
    warnings = [line for line in err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and str(bad) in warnings[0]
    md = (root / "report" / "report.md").read_text()
    assert str(bad) in md  # listed under Warnings


def one_line_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_empty_directory(tmp_path, capsys):
    code, _, err = run_report(capsys, tmp_path)
    assert code == 2
    assert one_line_error(err) == f"membench report: no summary.json under {tmp_path}; run `membench run` first"
    assert not (tmp_path / "report").exists()


def test_missing_and_unreadable_directory(tmp_path, capsys, monkeypatch):
    code, _, err = run_report(capsys, tmp_path / "nope")
    assert code == 2 and "does not exist" in one_line_error(err)

    locked = tmp_path / "locked"
    locked.mkdir()
    real_listdir = os.listdir

    def listdir(path="."):
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(loading.os, "listdir", listdir)
    code, _, err = run_report(capsys, locked)
    assert code == 2 and "cannot read" in one_line_error(err) and "Permission denied" in err


def test_only_corrupt_summaries(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "summary.json").write_text(json.dumps({"schema_version": 999}))
    code, _, err = run_report(capsys, tmp_path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 2 and "schema_version 999" in lines[0]
    assert lines[1].startswith("membench report: no readable summary.json under")


def test_bad_format(tmp_path, capsys):
    make_run(tmp_path / "a", [make_rank(0, MIB, CAP)])
    code, _, err = run_report(capsys, tmp_path, "--format", "gif")
    assert code == 2 and "--format" in one_line_error(err)


def test_module_entry_point_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench.report", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"membench report: no summary.json under {tmp_path}; run `membench run` first"
