"""The plain-PyTorch backend: same results as the torchrec path where they should agree, embedding
gradients where fbgemm has none, no torchrec import, and the same recorder/harness guarantees."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO_ROOT, run_here

# a table large enough that its gradient, not the activations, makes the peak
ROWS, DIM = 200_000, 32
ONE_TABLE = ["hardware=cpu", "workload.num_tables=1", f"workload.rows={ROWS}", f"workload.embedding_dim={DIM}",
             f"workload.dense_arch=[64,{DIM}]", "workload.warmup_steps=0", "workload.steps=2",
             "workload.embedding_optimizer=sgd"]


@pytest.mark.slow
def test_native_sweep_is_deterministic_adds_up_and_exports_lists_and_shows_progress(cli, tmp_path):
    """One 4-point sweep (each batch size twice): the native backend's determinism and breakdown, and issue
    19's export / ls / progress on a real sweep."""
    import pandas as pd

    run = cli("-m", "hardware=cpu", "model=native", "workload.steps=2", "workload.batch_size=8,16",
              "workload.seed=0,0")
    assert run.returncode == 0, run.output
    first, second, third, _ = run.summaries()
    assert first["model_backend"] == "native" and first["status"] == "ok"
    for mine, theirs in zip(first["per_rank"], second["per_rank"]):
        assert sum(mine["breakdown"].values()) == mine["peak_bytes"]
        for field in ("peak_bytes", "breakdown", "peak_step", "peak_phase"):
            assert mine[field] == theirs[field], field
    assert third["per_rank"][0]["peak_bytes"] > first["per_rank"][0]["peak_bytes"]  # the larger batch
    # predicted before launch by training the rank's own model on `meta` (nothing calibrated)
    assert first["estimate"]["calibration"].startswith("none: a dry run of the native model")
    assert all(abs(error) <= 1.0 for error in first["estimate"]["error_pct"]), first["estimate"]["error_pct"]
    assert "torchrec_error_pct" not in first["estimate"]
    # progress, plain lines (not a terminal): one per point, in order, with the swept overrides and an ETA
    lines = [line for line in run.output.splitlines() if line.startswith("[") and "/4] " in line]
    assert [line.split("]")[0] for line in lines] == ["[1/4", "[2/4", "[3/4", "[4/4"], run.output
    assert lines[0].startswith("[1/4] workload.batch_size=8 workload.seed=0 → ok, peak ")
    assert all("elapsed 0:" in line and "ETA 0:" in line for line in lines)
    assert lines[-1].endswith("ETA 0:00:00")
    # export: one row per point and rank, the swept axes as columns, that pandas reads back
    out = tmp_path / "sweep.csv"
    proc = subprocess.run([sys.executable, "-m", "bench", "export", str(run.results_dir), "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    frame = pd.read_csv(out)
    assert len(frame) == 4 * 2  # points x ranks
    assert frame.groupby(["workload.batch_size", "workload.seed"]).size().to_dict() == {(8, 0): 4, (16, 0): 4}
    assert (frame["status"] == "ok").all() and frame["peak_bytes"].gt(0).all()
    sweep_id = frame["sweep_id"].iloc[0]
    listing = subprocess.run([sys.executable, "-m", "bench", "ls", str(run.results_dir)], cwd=REPO_ROOT,
                             capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    row = next(line for line in listing.stdout.splitlines() if sweep_id in line)
    assert " 4 " in row and "ok (4 ok)" in row and "tiny" in row


@pytest.mark.slow
def test_native_materializes_embedding_gradients_torchrec_does_not(tmp_path):
    native = run_here(tmp_path / "native", *ONE_TABLE, "model=native", "sharding=table_wise")
    torchrec = run_here(tmp_path / "torchrec", *ONE_TABLE, "model=torchrec", "sharding=table_wise")
    assert native["status"] == "ok", native["error"]
    assert torchrec["status"] == "ok", torchrec["error"]
    (owner,) = native["sharding_plan"][0]["ranks"]
    rank = next(r for r in native["per_rank"] if r["rank"] == owner)
    assert rank["breakdown"]["embedding_weights"] == ROWS * DIM * 4
    assert rank["breakdown"]["embedding_grads"] == ROWS * DIM * 4  # a dense gradient of the whole table
    assert rank["peak_phase"] in ("backward", "optimizer")
    assert all(r["breakdown"]["embedding_grads"] == 0 for r in torchrec["per_rank"])


@pytest.mark.slow
def test_native_oom_is_recorded(tmp_path):
    summary = run_here(tmp_path / "run", "hardware=cpu", "model=native", "workload.steps=2",
                       "hardware.capacity_gib=0.005")
    assert summary["status"] == "oom" and summary["exit_code"] == 3 and summary["oom_ranks"]
    oom = next(r["oom"] for r in summary["per_rank"] if r["oom"])
    assert oom["requested_bytes"] > 0 and oom["phase"]


def test_native_refuses_other_sharding_types(cli):
    run = cli("hardware=cpu", "model=native", "sharding=column_wise")
    assert run.returncode == 2
    assert "native backend places tables table_wise only" in run.only_summary()["error"]


def test_native_path_never_imports_torchrec(tmp_path):
    """One rank trains the native model with torchrec and fbgemm made unimportable."""
    script = textwrap.dedent(f"""
        import os, sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torchrec", "fbgemm_gpu"):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
        from pathlib import Path
        from bench.run.config import RunConfig
        from bench.run.launchspec import resolve_launch, validate_run, write_run_config
        cfg = RunConfig()
        cfg.hardware.device, cfg.hardware.ranks_per_node, cfg.model.backend = "cpu", 1, "native"
        cfg.workload.steps = 1
        launch = resolve_launch(cfg, 0)
        validate_run(cfg, launch)
        run_dir = Path({str(tmp_path)!r})
        write_run_config(run_dir, cfg, launch)
        from bench.run import worker
        sys.exit(worker.main(["--run-dir", str(run_dir)]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "rank0.json").read_text())
    assert result["status"] == "ok" and result["peak_bytes"] > 0
    assert "torchrec" not in proc.stderr
