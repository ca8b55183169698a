"""End to end through the real CLI: Hydra -> torchrun (2 CPU ranks, gloo) -> results on disk."""
from __future__ import annotations

import csv
import json

import pytest

from conftest import DETERMINISTIC_FIELDS, run_here

RANK_FILES = ("rank{r}.json", "timeline_rank{r}.csv")


@pytest.mark.slow
def test_tiny_run_end_to_end_and_deterministic(cli):
    # the same config and seed twice, as the two points of one sweep: ranks forked from their agent, then
    # each a fresh interpreter (as on CUDA)
    run = cli("-m", "hardware=cpu", "launcher.fork_ranks=true,false")
    assert run.returncode == 0, run.output
    run_a, run_b = run.run_dirs()
    summary = json.loads((run_a / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["exit_code"] == 0
    assert summary["world_size"] == 2 and summary["device_type"] == "cpu"
    assert {"torch", "torchrec"} <= set(summary["versions"])
    for name in ("config.yaml", "launch.json", "sharding_plan.json", "launcher.log"):
        assert (run_a / name).exists(), name
    for r in (0, 1):
        for pattern in RANK_FILES:
            assert (run_a / pattern.format(r=r)).exists()
        rows = list(csv.DictReader(open(run_a / f"timeline_rank{r}.csv")))
        assert {row["phase"] for row in rows} == {"build", "input", "forward", "backward", "optimizer"}
    for rank in summary["per_rank"]:
        assert rank["status"] == "ok" and rank["recorder"] == "cpu_exact"
        assert rank["peak_bytes"] > 0
        assert sum(rank["breakdown"].values()) == rank["peak_bytes"]
        assert rank["breakdown"]["embedding_weights"] > 0 and rank["breakdown"]["activations"] > 0
        assert rank["breakdown"]["dense_grads"] > 0 and rank["breakdown"]["dense_optimizer"] > 0
        assert rank["utilization"] == pytest.approx(rank["peak_bytes"] / rank["capacity_bytes"])
    job = summary["job"]
    assert job["steps"] == 5 and job["step_time_ms_p50"] > 0 and job["samples_per_s"] > 0
    assert job["utilization_min"] <= job["utilization_mean"] <= job["utilization_max"]
    # same config and seed, forked or not: byte-identical accounting on every rank
    other = json.loads((run_b / "summary.json").read_text())
    for mine, theirs in zip(summary["per_rank"], other["per_rank"]):
        for field in DETERMINISTIC_FIELDS:
            assert mine[field] == theirs[field], field
    assert "per-rank memory" in run.output
    assert "prediction vs measured, rank" in run.output and "activations" in run.output  # its terms shown
    # the prediction made before launch, scored against the measurement (calibrated on other runs)
    estimate = summary["estimate"]
    assert estimate["calibration"].startswith("membench calibrate")
    assert all(abs(error) <= 3.0 for error in estimate["error_pct"]), estimate["error_pct"]
    assert len(estimate["torchrec_per_rank_peak"]) == 2 and len(estimate["torchrec_error_pct"]) == 2


@pytest.mark.slow
def test_analytic_table_wise_rowwise_adagrad(tmp_path):
    rows, dim = 50_000, 32
    summary = run_here(tmp_path / "run", "hardware=cpu", "sharding=table_wise", "workload.num_tables=1",
                       f"workload.rows={rows}", f"workload.embedding_dim={dim}", f"workload.dense_arch=[64,{dim}]",
                       "workload.warmup_steps=0", "workload.steps=2", "workload.embedding_optimizer=rowwise_adagrad")
    assert summary["status"] == "ok", summary["error"]
    (owner,) = summary["sharding_plan"][0]["ranks"]
    for rank in summary["per_rank"]:
        breakdown = rank["breakdown"]
        if rank["rank"] == owner:
            assert breakdown["embedding_weights"] == rows * dim * 4
            assert breakdown["embedding_optimizer"] == rows * 4
        else:
            assert breakdown["embedding_weights"] == 0 and breakdown["embedding_optimizer"] == 0


@pytest.mark.slow
def test_oom_names_rank_and_phase_and_sweep_continues(cli):
    # the plain-PyTorch backend: the sweep and OOM handling are the launcher's, and it starts in seconds
    run = cli("-m", "hardware=cpu", "model=native", "sharding=table_wise", "workload.num_tables=2",
              "workload.rows_list=[200000,1000]", "workload.steps=2", "hardware.capacity_gib=0.04,1.0")
    assert run.returncode == 3, run.output  # the sweep's most severe status: oom
    sweeps = list(run.results_dir.glob("sweep-*"))
    assert len(sweeps) == 1
    index = json.loads((sweeps[0] / "sweep.json").read_text())
    assert [point["status"] for point in index["runs"]] == ["oom", "ok"]
    oom_summary, ok_summary = (json.loads((sweeps[0] / d / "summary.json").read_text()) for d in ("0", "1"))
    (owner,) = next(row["ranks"] for row in ok_summary["sharding_plan"] if row["table"] == "t0")
    assert oom_summary["status"] == "oom" and oom_summary["exit_code"] == 3
    assert oom_summary["oom_ranks"] == [owner]
    oom_rank = next(r for r in oom_summary["per_rank"] if r["rank"] == owner)
    assert oom_rank["oom"]["phase"] == "build" and oom_rank["oom"]["step"] == -1
    assert oom_rank["oom"]["requested_bytes"] == 200_000 * 64 * 4
    assert f"rank {owner} out of memory" in oom_summary["error"]
    assert (sweeps[0] / "0" / f"timeline_rank{owner}.csv").read_text().count("\n") >= 2  # partial kept
    assert ok_summary["status"] == "ok"


@pytest.mark.parametrize("args, field", [
    (("sharding=row_wise",), "sharding.type"),
    (("workload=tb_1",), "workload.materialize"),
    (("workload.pooling.mean=0",), "workload.pooling.mean"),
])
def test_invalid_config_is_refused_before_launch(cli, args, field):
    run = cli("hardware=cpu", *args)
    assert run.returncode == 2, run.output
    summary = run.only_summary()
    assert summary["status"] == "invalid" and summary["exit_code"] == 2
    assert field in summary["error"]
    error_lines = [line for line in run.output.splitlines() if line.startswith("membench: invalid config")]
    assert len(error_lines) == 1 and field in error_lines[0]
    assert not list(run.run_dirs()[0].glob("rank*.json"))


def test_unknown_key_is_refused_by_hydra(cli):
    run = cli("workload.num_tabels=3")
    assert run.returncode == 2
    assert "num_tabels" in run.output
    assert run.summaries() == []
