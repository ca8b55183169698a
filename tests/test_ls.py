"""`membench ls`: past runs and sweeps, newest first, with filters (bench/report/listing.py, bench/apps/ls.py)."""
from __future__ import annotations

import pytest

from bench.apps import ls
from bench.report.listing import RunFilter, listing_rows
from bench.report.loading import load_runs
from bench.report.messages import WarningLog

from results_factory import GRID, MIB, make_run, make_sweep

SWEEP = "sweep-20260102-100000-abcdef"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Oldest to newest: a lone OOM run, a 4-point sweep with one OOM point, a lone ok run on `small`."""
    root = tmp_path_factory.mktemp("results")
    make_run(root / "20260101-100000-aaaaaa", peaks=(70 * MIB, 20 * MIB), status="oom",
             started_at="2026-01-01T10:00:00+00:00")
    make_sweep(root / SWEEP, GRID, statuses=["ok", "ok", "ok", "oom"], started_at="2026-01-02T10:00:00+00:00")
    make_run(root / "20260103-100000-cccccc", ["workload=small"], started_at="2026-01-03T10:00:00+00:00")
    return root


def table_rows(output: str):
    """The data rows of the printed table: the first cell (id) of each."""
    return [line.split("│")[1].strip() for line in output.splitlines() if line.startswith("│")]


def test_runs_and_sweeps_newest_first(results, capsys):
    assert ls.main([str(results)]) == 0
    out = capsys.readouterr().out
    assert table_rows(out) == ["20260103-100000-cccccc", SWEEP, "20260101-100000-aaaaaa"]
    sweep_line = next(line for line in out.splitlines() if SWEEP in line)
    for cell in ("2026-01-02 10:00", "│    4 │", "tiny", "cpu", "oom (3 ok, 1 oom)", "23.0 MiB"):
        assert cell in sweep_line, cell
    lone = next(line for line in out.splitlines() if "aaaaaa" in line)
    assert "70.0 MiB" in lone and "109.4" in lone  # max peak and utilization (70 of 64 MiB)


def test_filters_select_runs_and_a_sweep_stands_for_its_matching_points(results, capsys):
    assert ls.main([str(results), "--status", "oom"]) == 0
    out = capsys.readouterr().out
    assert table_rows(out) == [SWEEP, "20260101-100000-aaaaaa"]
    assert "1/4" in next(line for line in out.splitlines() if SWEEP in line)
    assert ls.main([str(results), "--workload", "small,tiny", "--status", "ok", "--limit", "1"]) == 0
    assert table_rows(capsys.readouterr().out) == ["20260103-100000-cccccc"]
    assert ls.main([str(results), "--flat", "--status", "OOM"]) == 0
    assert table_rows(capsys.readouterr().out) == [f"{SWEEP}/3", "20260101-100000-aaaaaa"]


def test_no_match_and_no_results_exit_non_zero_with_one_line(results, tmp_path, capsys):
    assert ls.main([str(results), "--status", "timeout"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == f"membench ls: no run matches --status timeout among the 6 runs under {results}"
    assert ls.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"membench ls: no summary.json under {tmp_path}; run `membench run` first"
    assert ls.main([str(results), "--limit", "0"]) == 2


def test_a_corrupt_summary_is_named_and_the_rest_listed(tmp_path, capsys):
    make_run(tmp_path / "good")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "summary.json").write_text("{")
    assert ls.main([str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert table_rows(captured.out) == ["good"]
    assert "membench ls: warning: skipping" in captured.err and "broken/summary.json" in captured.err


def test_listing_rows_aggregate_a_sweep(results):
    runs, _ = load_runs([results], skip=None, log=WarningLog("membench ls"))
    rows = listing_rows(runs, RunFilter.of(modes=["train"]))
    sweep = next(row for row in rows if row.kind == "sweep")
    assert sweep.statuses == {"ok": 3, "oom": 1} and sweep.status == "oom (3 ok, 1 oom)"
    assert sweep.world_sizes == [2] and sweep.max_peak_bytes == 23 * MIB
    assert sweep.path == results / SWEEP and len(sweep.run_ids) == 4
    assert listing_rows(runs, RunFilter.of(modes=["plan"])) == []


def test_an_emulated_run_shows_the_rank_it_played_of_its_world():
    from bench.report.listing import ListingRow

    def row(ranks):
        return ListingRow(id="x", kind="run", started_at="", workloads=["tiny"], hardware=["cpu"],
                          world_sizes=[1024], statuses={"ok": 1}, max_peak_bytes=1, max_utilization=0.1,
                          path=None, emulated_ranks=ranks)

    assert ls.world_sizes(row([])) == "1024"
    assert ls.world_sizes(row([5])) == "1024 (rank 5)"
    assert ls.world_sizes(row([0, 1, 2])) == "1024 (3 ranks emulated)"
