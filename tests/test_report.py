"""`membench report` (bench.report) on synthetic results written with bench.results (tests/report_results.py):
its figures and the numbers in report.md; no torchrun. Unreadable input: test_report_errors.py."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from bench import report
from bench.results.schema import CATEGORIES
from bench.results.store import load_summary

from report_results import CAP, MIB, make_rank, make_run, make_sweep, oom_event, run_report


def table(markdown: str, first_header: str, second_header: str) -> List[List[str]]:
    """Rows of every markdown table whose header starts with these two columns."""
    rows, inside = [], False
    for line in markdown.splitlines():
        if line.startswith(f"| {first_header} | {second_header} |"):
            inside = True
            continue
        if inside and line.startswith("|---"):
            continue
        if inside and line.startswith("| "):
            rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
        else:
            inside = False
    return rows


def assert_figure(out: Path, stem: str, formats=("png",)) -> None:
    for fmt in formats:
        path = out / f"{stem}.{fmt}"
        assert path.is_file() and path.stat().st_size > 1000, path
        head = path.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if fmt == "png" else b"<?xml" in head or b"<svg" in head


def test_full_report_figures_and_numbers(tmp_path, capsys):
    root = tmp_path / "results"
    made = make_sweep(root)
    made["tw"] = make_run(root / "20260101-000001-aaaaaa", [make_rank(0, 40 * MIB, CAP), make_rank(1, 20 * MIB, CAP)],
                          sharding="table_wise", rows=30000)
    made["cw"] = make_run(root / "20260101-000002-bbbbbb", [make_rank(0, 31 * MIB, CAP), make_rank(1, 30 * MIB, CAP)],
                          sharding="column_wise", rows=30000)
    out = tmp_path / "rep"
    code, stdout, err = run_report(capsys, root, "--out", out, "--format", "png,svg")
    assert code == 0, err
    assert "figure 11/11" in stdout and "report.md" in stdout
    for stem in ("fig1_timeline_1", "fig2_breakdown", "fig3_utilization_cdf", "fig4_imbalance", "fig5_oom_frontier_1"):
        assert_figure(out, stem, ("png", "svg"))
    md = (out / "report.md").read_text()
    for stem in ("fig1_timeline_1.png", "fig2_breakdown.png", "fig3_utilization_cdf.png", "fig4_imbalance.png",
                 "fig5_oom_frontier_1.png"):
        assert f"]({stem})" in md
    assert "## 6. Estimated vs measured peak\n\nSkipped:" in md
    assert "## 7. Plan mode at scale\n\nSkipped:" in md

    ok = [s for s in made.values() if s.status == "ok"]
    # breakdown table: every category value, peak bytes and MiB equal the summary's
    used = [c for c in CATEGORIES if any(r.breakdown[c] for s in ok for r in s.per_rank)]
    rows = table(md, "run", "rank")
    breakdown_rows = {(row[0], row[1]): row for row in rows if len(row) == 4 + len(used)}
    assert len(breakdown_rows) == sum(len(s.per_rank) for s in ok)
    peaks_seen = {(int(row[1]), int(row[3])) for row in breakdown_rows.values()}
    for summary in ok:
        for rank in summary.per_rank:
            assert (rank.rank, rank.peak_bytes) in peaks_seen
            match = [row for row in breakdown_rows.values() if int(row[1]) == rank.rank and int(row[3]) == rank.peak_bytes]
            assert any([int(v) for v in row[4:]] == [rank.breakdown[c] for c in used] and
                       row[2] == f"{rank.peak_bytes / MIB:.3f}" for row in match)
    # utilization table: utilization % with 3 decimals
    util_rows = [row for row in rows if len(row) == 5]
    assert sorted((int(r[3]), r[2]) for r in util_rows) == sorted(
        (x.peak_bytes, f"{x.utilization * 100:.3f}") for s in ok for x in s.per_rank)
    # imbalance table: the summary's imbalance, 4 decimals
    imbalance = {row[2] for row in table(md, "run", "ranks")}
    assert imbalance == {f"{s.job.imbalance:.4f}" for s in ok}
    # under-utilized share stated
    utils = [x.utilization for s in ok for x in s.per_rank]
    under = sum(u < 0.5 for u in utils)
    assert f"**{under} of {len(utils)} rank-runs ({under / len(utils) * 100:.1f} %) are under-utilized.**" in md
    # frontier: the grid over the two swept keys, OOM cell marked
    assert "| workload.batch_size \\ workload.rows | 10k | 20k |" in md
    assert "| 4096 | 87.891 % | OOM (r0 step 0 forward; needs ≥ 103.516 %) |" in md


def test_oom_results(tmp_path, capsys):
    root = tmp_path / "runs"
    ok = make_run(root / "a", [make_rank(0, 20 * MIB, CAP), make_rank(1, 20 * MIB, CAP)])
    build_oom = make_run(root / "b", [make_rank(r, 90_000, CAP, status="oom", step=-1, phase="build",
                                                oom=oom_event(r, -1, "build", 200_000_000, 90_000, CAP))
                                      for r in range(2)], rows=200000)
    code, _, err = run_report(capsys, root, "--format", "png")
    assert code == 0, err
    out = root / "report"
    assert_figure(out, "fig1_timeline_1")
    assert_figure(out, "fig1_timeline_2")  # the OOM run's timeline
    md = (out / "report.md").read_text()
    assert "out of memory" in md
    oom_rows = table(md, "run", "rank")
    assert any(row[1:7] == ["0", "-1", "build", "200000000", "90000", str(CAP)] for row in oom_rows)
    # the OOM run is not in the distribution, and is said to be left out
    assert "1 run(s) not finished" in md
    assert ok.per_rank[0].peak_bytes and f"| {ok.per_rank[0].peak_bytes} |" in md
    assert build_oom.status == "oom"


def test_single_run_default_out(tmp_path, capsys):
    run_dir = tmp_path / "20260101-000000-cccccc"
    summary = make_run(run_dir, [make_rank(0, 16 * MIB, 4 * 1024**3), make_rank(1, 16 * MIB - 1632, 4 * 1024**3)])
    code, _, err = run_report(capsys, run_dir, "--format", "png")
    assert code == 0, err
    out = run_dir / "report"
    for stem in ("fig1_timeline_1", "fig2_breakdown", "fig3_utilization_cdf", "fig4_imbalance"):
        assert_figure(out, stem)
    assert not list(out.glob("fig5_*"))
    md = (out / "report.md").read_text()
    assert "## 5. OOM frontier\n\nSkipped: no sweep directory" in md
    assert f"| 0 | ok | 16.000 | {16 * MIB} | step 2 forward | {4 * 1024**3} | 0.391 |" in md
    assert summary.per_rank[1].peak_bytes == 16 * MIB - 1632 and f"{16 * MIB - 1632}" in md


def test_plan_and_estimate_figures(tmp_path, capsys):
    root = tmp_path / "study"
    capacity = 80 * 1024**3
    est = {"per_rank_peak": [18 * MIB, 15 * MIB], "error_pct": [12.5, -6.25],
           "torchrec_per_rank_peak": [14 * MIB, 14 * MIB], "torchrec_error_pct": [-12.5, -12.5]}
    # the predicted breakdown: rank 0 as measured but 2 MiB more activations, rank 1 1 MiB fewer
    measured = make_rank(0, 16 * MIB, CAP).breakdown
    est["per_rank_breakdown"] = [{**measured, "activations": measured["activations"] + 2 * MIB},
                                 {**measured, "activations": measured["activations"] - MIB}]
    make_run(root / "train" / "r1", [make_rank(0, 16 * MIB, CAP), make_rank(1, 16 * MIB, CAP)], estimate=est)
    make_run(root / "train" / "r2", [make_rank(0, 30 * MIB, CAP), make_rank(1, 20 * MIB, CAP)], estimate=None)
    plans = {}
    for workload, size, per_rank_gib, verdict in (("tb_1", 16, [60, 66], "fits"), ("tb_1", 64, [15, 15.5], "fits"),
                                                  ("tb_10", 128, [100, 101], "oom"), ("tb_10", 8, [], "oom")):
        ranks = [make_rank(r, int(g * 1024**3), capacity, step=-1, phase="estimate") for r, g in enumerate(per_rank_gib)]
        plans[(workload, size)] = make_run(
            root / "plan" / f"{workload}-{size}", ranks, workload=workload, mode="plan", hardware="h100_80g",
            status="ok" if verdict == "fits" else "oom", timeline=False,
            error=None if ranks else "cannot place the tables",
            estimate={"verdict": verdict, "worst_rank": 1 if ranks else None, "planner": "membench",
                      "plan_time_s": 0.25})
        # plan summaries carry the world size they planned for, not the ranks listed
        summary = json.loads((root / "plan" / f"{workload}-{size}" / "summary.json").read_text())
        summary["world_size"] = size
        (root / "plan" / f"{workload}-{size}" / "summary.json").write_text(json.dumps(summary))
    code, _, err = run_report(capsys, root, "--out", tmp_path / "out", "--format", "png")
    assert code == 0, err
    out = tmp_path / "out"
    assert_figure(out, "fig6_estimate_vs_measured")
    assert_figure(out, "fig7_plan_scale")
    md = (out / "report.md").read_text()
    estimate_rows = table(md, "run", "rank")
    assert any(row[3:8] == [str(16 * MIB), str(18 * MIB), "+12.50", str(14 * MIB), "-12.50"] for row in estimate_rows)
    assert any(row[3:6] == [str(16 * MIB), str(15 * MIB), "-6.25"] for row in estimate_rows)
    assert_figure(out, "fig6b_estimate_by_category")
    terms = {row[0]: row for row in table(md, "category", "ranks")}
    assert terms["activations"][1:] == ["2", f"{MIB // 2:+,}", f"{-MIB:+,}", f"{2 * MIB:+,}"]
    assert terms["embedding_weights"][2:] == ["+0", "+0", "+0"]
    plan_rows = {(row[0], row[2]): row for row in table(md, "workload", "hardware")}
    assert plan_rows[("tb_1", "16")][3] == "fits" and plan_rows[("tb_1", "16")][7] == f"{66 / 80 * 100:.3f}"
    assert plan_rows[("tb_10", "128")][3] == "oom" and plan_rows[("tb_10", "128")][4] == "1"
    assert plan_rows[("tb_10", "8")][3] == "oom" and plan_rows[("tb_10", "8")][-1] == "cannot place the tables"
    # plan runs are estimates: not in the measured utilization distribution
    assert "**2 of 4 rank-runs" not in md and "rank-runs (" in md


def test_deterministic(tmp_path, capsys):
    root = tmp_path / "r"
    make_sweep(root)
    texts, figures = [], []
    for out in ("a", "b"):
        assert run_report(capsys, root, "--out", tmp_path / out, "--format", "svg")[0] == 0
        texts.append((tmp_path / out / "report.md").read_text().replace(str(tmp_path / out), "OUT"))
        figures.append({path.name: path.read_bytes() for path in sorted((tmp_path / out).glob("*.svg"))})
    assert texts[0] == texts[1]
    assert figures[0] and figures[0] == figures[1]  # byte-identical: fixed SVG ids, no dates


def test_labels_name_what_differs(tmp_path):
    root = tmp_path / "r"
    make_sweep(root)
    make_run(root / "z-invalid", [], status="invalid", error="invalid config: x")
    (root / "z-invalid" / "config.yaml").unlink()  # invalid runs stop before the config is written
    runs, sweeps = report.load_runs([root], skip=None)
    assert sweeps[0].varying == ["workload.batch_size", "workload.rows"]
    labels = [r.label for r in runs]
    assert labels[:4] == ["batch=512 · rows=10k", "batch=512 · rows=20k", "batch=4096 · rows=10k",
                          "batch=4096 · rows=20k"]
    assert len(set(labels)) == len(labels)
    assert load_summary(runs[0].dir).run_id == runs[0].s.run_id


def test_pipelines_figure_compares_against_base_in_batch_kjts(tmp_path, capsys):
    """Runs that differ only in the pipeline, side by side; a run from before the axis counts as plain."""
    root = tmp_path / "results"
    kjt = 512 * 8 * 4 * 8 + 512 * 8 * 4  # tiny's 8 tables at mean pooling 4: ids (int64) and lengths (int32)
    peaks = {None: 20 * MIB, "base": 20 * MIB + 1000, "sparse_dist": 20 * MIB + 1000 + 3 * kjt}
    in_flight = {None: 0, "base": 176_128, "sparse_dist": 647_200}
    for n, (pipeline, peak) in enumerate(peaks.items()):
        ranks = [make_rank(0, peak, CAP), make_rank(1, peak - 10, CAP)]
        for rank in ranks:
            rank.breakdown["inputs_in_flight"] = in_flight[pipeline]
            rank.breakdown["other"] -= in_flight[pipeline]
        make_run(root / f"2026010{n}-000000-aaaaaa", ranks, pipeline=pipeline)
    make_run(root / "20260109-000000-cccccc", [make_rank(0, 30 * MIB, CAP)], rows=99999, pipeline="base")  # no pair
    out = tmp_path / "rep"
    code, stdout, err = run_report(capsys, root, "--out", out, "--format", "png")
    assert code == 0, err
    assert_figure(out, "fig9_pipelines_1", ("png",))
    assert not (out / "fig9_pipelines_2.png").exists()
    rows = {row[0]: row for row in table((out / "report.md").read_text(), "pipeline", "holds beyond the trained batch")}
    assert set(rows) == {"plain", "base", "sparse_dist"}
    assert rows["sparse_dist"][3] == f"{peaks['sparse_dist']:,}" and rows["sparse_dist"][4] == "647,200"
    assert rows["sparse_dist"][5] == f"{3 * kjt:+,}" and rows["sparse_dist"][6] == "+3.00"
    assert rows["plain"][5] == "-1,000" and rows["base"][6] == "+0.00"


def test_pipelines_figure_skipped_without_a_pair(tmp_path, capsys):
    root = tmp_path / "results"
    make_run(root / "20260101-000000-aaaaaa", [make_rank(0, 20 * MIB, CAP)])
    code, stdout, err = run_report(capsys, root, "--out", tmp_path / "rep", "--format", "png")
    assert code == 0, err
    assert "## 9. Train pipelines: batches in flight\n\nSkipped: no two finished runs" in (
        tmp_path / "rep" / "report.md").read_text()


def test_estimate_against_world_size_ladder(tmp_path, capsys):
    """An emulation ladder (one rank of each N-rank job) and a real 2-rank run of the same workload: the
    panel plots the worst rank's signed error per N; a workload seen at one world size only is left out."""
    root = tmp_path / "ladder"

    def run(name: str, workload: str, world_size: int, errors: dict) -> None:
        ranks = [make_rank(rank, 16 * MIB, CAP) for rank in errors]
        width = max(errors) + 1
        est = {"per_rank_peak": [16 * MIB] * width, "error_pct": [errors.get(r) for r in range(width)],
               "torchrec_per_rank_peak": [12 * MIB] * width, "torchrec_error_pct": [-25.0] * width}
        make_run(root / name, ranks, workload=workload, estimate=est)
        path = root / name / "summary.json"
        summary = json.loads(path.read_text())
        summary["world_size"] = world_size  # an emulated rank: one rank measured of an N-rank job
        path.write_text(json.dumps(summary))

    run("real-2", "tiny", 2, {0: 0.5, 1: -1.5})
    run("emulated-64", "tiny", 64, {14: 0.25})
    run("emulated-1024", "tiny", 1024, {0: -0.75})
    run("other-8", "small", 8, {3: 4.0})
    code, _, err = run_report(capsys, root, "--out", tmp_path / "out", "--format", "png")
    assert code == 0, err
    assert_figure(tmp_path / "out", "fig6c_estimate_vs_world_size")
    rows = table((tmp_path / "out" / "report.md").read_text(), "workload, backend", "estimator")
    job = "tiny, torchrec"
    assert rows == [[job, "membench", "2", "1", "2", "-1.50"], [job, "membench", "64", "14", "1", "+0.25"],
                    [job, "membench", "1024", "0", "1", "-0.75"], [job, "torchrec planner", "2", "0", "2", "-25.00"],
                    [job, "torchrec planner", "64", "14", "1", "-25.00"],
                    [job, "torchrec planner", "1024", "0", "1", "-25.00"]]

    alone = tmp_path / "alone"
    make_run(alone / "r", [make_rank(0, 16 * MIB, CAP)], estimate={"per_rank_peak": [16 * MIB], "error_pct": [1.0]})
    assert run_report(capsys, alone, "--out", tmp_path / "out2", "--format", "png")[0] == 0
    assert not (tmp_path / "out2" / "fig6c_estimate_vs_world_size.png").exists()
    assert (tmp_path / "out2" / "fig6_estimate_vs_measured.png").is_file()


def test_planner_comparison_figure_draws_the_json_beside_its_runs(tmp_path, capsys):
    """planner-check's JSON next to its runs: the counts per memory model from it, the figure drawn, an old
    figure 10 of the same directory removed when a later report skips it."""
    from bench.harness.planner_comparison import RESULT_FILE, ModelOutcome, WorkloadComparison, to_json

    root = tmp_path / "results" / "planners-20260101-000000"
    make_run(root / "01-torchrec", [make_rank(0, 20 * MIB, CAP)])
    outcomes = [("ok", "ok"), ("oom", "refused"), ("ok", "failed"), ("refused", "ok")]
    workloads = []
    for index, (theirs, ours) in enumerate(outcomes):
        unused = lambda verdict: 10 * MIB if verdict == "ok" else None  # noqa: E731
        workloads.append(WorkloadComparison(index, [], 2, index == 3, CAP, CAP, outcomes={
            "torchrec": ModelOutcome("torchrec", theirs, unused_bytes=unused(theirs)),
            "membench": ModelOutcome("membench", ours, unused_bytes=unused(ours))}))
    (root / RESULT_FILE).write_text(json.dumps(to_json(0, workloads)))
    out = tmp_path / "rep"
    code, stdout, err = run_report(capsys, root, "--out", out, "--format", "png")
    assert code == 0, err
    assert_figure(out, "fig10_planners_1", ("png",))
    rows = {(row[0], row[1]): row[2:8] for row in table((out / "report.md").read_text(), "ranks", "memory model")}
    assert rows[("cpu", "torchrec")] == ["3", "2", "1", "0", "0", "0"]
    assert rows[("cpu", "membench")] == ["3", "1", "0", "1", "1", "0"]  # refused where torchrec's ran out
    assert rows[("emulated", "membench")] == ["1", "1", "0", "0", "0", "0"]
    (root / RESULT_FILE).unlink()
    code, _, err = run_report(capsys, root, "--out", out, "--format", "png")
    assert code == 0 and not (out / "fig10_planners_1.png").exists()
    assert "Skipped: no planner comparison among the runs" in (out / "report.md").read_text()


def test_cache_ratio_figure_draws_provision_reports_alone(tmp_path, capsys):
    """Provision reports over cache ratios (no summary.json anywhere) make a report of figure 11: GPUs and
    utilization per cache ratio, the all-HBM count beside them, which limit bound; a corrupt report is a note."""
    root = tmp_path / "results"

    def point(world_size, util, binding=None):
        return {"world_size": world_size, "utilization_max": util, "binding": binding}

    def provision_report(name, rows):
        (root / name).mkdir(parents=True)
        (root / name / "provision.json").write_text(json.dumps(
            {"workload": "tb_10", "hardware": "h100_80g", "planner": "membench", "results": rows}))

    provision_report("a", [{"batch_size": 2048, "compute_kernel": "fused_uvm_caching", "caching_ratio": ratio,
                            "recommended": point(ws, util), "next_smaller": point(ws - 8, 1.0, binding)}
                           for ratio, ws, util, binding in ((0.05, 40, 0.44, "host"), (0.3, 64, 0.85, "hbm"))])
    provision_report("b", [{"batch_size": 2048, "compute_kernel": "auto", "caching_ratio": None,
                            "recommended": point(192, 0.9), "next_smaller": point(184, 1.0, "hbm")}])
    (root / "c").mkdir()
    (root / "c" / "provision.json").write_text("{not json")
    out = tmp_path / "rep"
    code, _, err = run_report(capsys, root, "--out", out, "--format", "png")
    assert code == 0, err
    assert_figure(out, "fig11_cache_ratio", ("png",))
    text = (out / "report.md").read_text()
    rows = table(text, "job", "cache ratio")
    assert [row[1:] for row in rows] == [["0.05", "40", "44.0 %", "host memory", "192"],
                                         ["0.3", "64", "85.0 %", "HBM", "192"]]
    assert "No runs (provision reports only)" in text and "unreadable provision report" in text
