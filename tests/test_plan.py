"""Plan mode, provisioning and the peak estimator (no torchrun, no GPU)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.run.execute import compose_run_config
from conftest import REPO_ROOT, membench_here
from bench.planning.dry_run import DryRunModel
from bench.planning.estimate import FEATURES, predict
from bench.planning.types import RankShare
from bench.planning.calibration import fit_coefficients
from workloads.spec import build_spec


def plan_cli(tmp_path, *overrides, capsys=None):
    """`membench plan OVERRIDES`: in a subprocess, or from this process given pytest's capsys."""
    if capsys is None:
        cmd = [sys.executable, "-m", "bench", "plan", f"results_dir={tmp_path}", *overrides]
        proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    else:
        proc = subprocess.CompletedProcess([], *membench_here(capsys, "plan", f"results_dir={tmp_path}", *overrides))
    summaries = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    return proc, summaries


def test_plan_tb_1_on_h100_fits_and_adds_up(tmp_path, capsys):
    proc, (summary,) = plan_cli(tmp_path, "workload=tb_1", "hardware=h100_80g", "world_size=32", capsys=capsys)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary["mode"] == "plan" and summary["status"] == "ok" and summary["world_size"] == 32
    assert summary["estimate"]["verdict"] == "fits" and summary["estimate"]["planner"] == "membench"
    ranks = summary["per_rank"]
    assert len(ranks) == 32
    embedding = sum(r["breakdown"]["embedding_weights"] for r in ranks)
    assert embedding == summary["estimate"]["virtual_table_bytes"]  # every virtual byte placed once
    for rank in ranks:
        assert sum(rank["breakdown"].values()) == rank["peak_bytes"]
        assert rank["utilization"] == pytest.approx(rank["peak_bytes"] / rank["capacity_bytes"])
        assert rank["breakdown"]["non_torch"] > 0 and rank["breakdown"]["allocator_overhead"] > 0
    assert "fits" in proc.stdout


def test_plan_that_cannot_place_says_so_in_one_line(tmp_path, capsys):
    proc, (summary,) = plan_cli(tmp_path, "workload=tb_10", "hardware=h100_80g", "nodes=1", capsys=capsys)
    assert proc.returncode == 3
    assert summary["status"] == "oom" and summary["estimate"]["verdict"] == "oom"
    assert "short by" in summary["error"] and "GiB" in summary["error"]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert sum("short by" in line for line in proc.stdout.splitlines()) == 1


def test_plan_rejects_bad_world_size(tmp_path):
    proc, summaries = plan_cli(tmp_path, "workload=tb_1", "hardware=h100_80g", "world_size=0")
    assert proc.returncode == 2 and "world_size" in proc.stderr and summaries == []


def test_provisioning_is_monotonic_in_headroom():
    from bench.planning.provision import provision
    from bench.run.launchspec import resolve_target

    chosen = []
    for headroom in (0.0, 0.1, 0.3, 0.6):
        cfg = compose_run_config(["workload=tb_1", "hardware=h100_80g", f"plan.headroom={headroom}",
                                  "plan.max_world_size=256"])
        report = provision(cfg, resolve_target(cfg, visible_cuda=None), progress=lambda line: None)
        (row,) = report["results"]
        assert row["recommended"] is not None
        budget = (1 - headroom) * report["capacity_bytes"]
        assert row["recommended"]["max_rank_bytes"] <= budget
        if row["next_smaller"] is not None:  # the size below lacks memory, and says how much
            assert row["next_smaller"]["shortfall_bytes"] > 0
        chosen.append(row["recommended"]["world_size"])
    assert chosen == sorted(chosen)  # more headroom never recommends fewer GPUs
    assert all(size % 8 == 0 for size in chosen)  # multiples of GPUs per node


def test_fit_recovers_nonnegative_coefficients():
    truth = {"const": 1000.0, "pooled_received": 1.5, "pooled_sent": 0.0, "ids_input": 2.0, "ids_received": 0.5,
             "data_parallel_tables": 0.75}
    samples = [{"const": 1.0, "pooled_received": a, "pooled_sent": b, "ids_input": c, "ids_received": d,
                "data_parallel_tables": e}
               for a, b, c, d, e in [(1e6, 2e5, 3e4, 1e4, 0), (2e6, 1e5, 5e4, 3e4, 1e6), (5e5, 4e5, 2e4, 2e4, 0),
                                     (3e6, 3e5, 1e5, 5e4, 2e6), (1.5e6, 1e6, 7e4, 9e4, 0), (4e6, 2e6, 2e5, 1e5, 5e5),
                                     (2.5e6, 7e5, 9e4, 4e4, 3e6)]]
    residuals = [sum(truth[k] * s[k] for k in FEATURES) for s in samples]
    fitted = fit_coefficients(samples, residuals)
    for name in FEATURES:
        assert fitted[name] >= 0
        assert fitted[name] == pytest.approx(truth[name], rel=1e-6, abs=1e-6)


def test_prediction_breakdown_for_a_table_wise_share():
    cfg = compose_run_config(["workload=tiny"])
    spec = build_spec(cfg.workload)
    dense = DryRunModel(spec).run()
    share = RankShare(weight_bytes=1000, optimizer_bytes=40, sent_dims=64, sent_pooling=4.0)
    (prediction,) = predict(spec, [share], {name: 0.0 for name in FEATURES})
    assert prediction.breakdown["embedding_weights"] == 1000
    assert prediction.breakdown["dense_grads"] == prediction.breakdown["dense_params"] == dense.params_bytes
    # Adam: two fp32 states per dense parameter, plus one step counter per parameter tensor
    assert dense.optimizer_bytes >= 2 * dense.params_bytes
    assert prediction.total_bytes == sum(prediction.breakdown.values())


def test_the_dry_run_model_allocates_nothing_on_the_host():
    """DCN's cross layers take no device argument: built under the dense device, a dry run on meta makes them
    there (a terabyte workload's cross weights were once 1.6 GB allocated and initialized on the host), and its
    tables get no optimizer (they are replaced by placeholders)."""
    import torch

    from workloads.model import build_model

    spec = build_spec(compose_run_config(["workload=tiny", "workload.arch=dlrm_dcn"]).workload)
    model = build_model(spec, torch.device("meta"), embedding_optimizer_attached=False)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert not any(hasattr(p, "_in_backward_optimizers") for p in model.parameters())
    trained = build_model(spec, torch.device("meta"))
    assert all(hasattr(p, "_in_backward_optimizers") for p in trained.model.sparse_arch.parameters())
    assert DryRunModel(spec).params and {p.device.type for p in DryRunModel(spec).params} == {"meta"}


def test_a_rank_s_shares_count_the_ids_its_tables_pooling_law_draws():
    """Uniform pooling draws (min + max) / 2 ids a sample whatever workload.pooling.mean says: the estimate
    counted `mean` (a table-wise tiny run with uniform pooling, mean 15 in [1, 32], was predicted -0.64 %;
    -0.03 % now)."""
    from bench.planning.estimate import add_replicated_table, add_sharded_table

    cfg = compose_run_config(["workload=tiny", "workload.pooling.distribution=uniform", "workload.pooling.mean=15"])
    table = build_spec(cfg.workload).tables[0]
    share = RankShare()
    add_sharded_table(share, table, table.physical_rows, table.embedding_dim, "rowwise_adagrad")
    add_replicated_table(share, table, "adam")
    assert share.sent_pooling == share.replicated_pooling == (1 + 32) / 2
