"""Fault drills: inject a fault, then check the recorded status, that no other result was lost, and that
no process of the run is left behind.

Drills: a rank that stops making progress (watchdog; repeated, since whether torchrun's agent or the
launcher ends the ranks first is a race), a rank killed with SIGKILL in a sweep, two runs started at once
(with a hostile workload name), a kill during --update-baselines, Ctrl-C on a sweep, and a 2-node job (two
torchrun agents on localhost) plus a 2-point sweep through submitit's local executor. The drills test the
launcher, so they train the plain-PyTorch backend (no torchrec import: seconds saved per run).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

pytestmark = pytest.mark.slow
FAST = ["hardware=cpu", "model=native", "workload.num_tables=4", "workload.rows=5000"]


def cli_cmd(results_dir: Path, *args: str):
    flags = [a for a in args if a.startswith("-")]
    return [sys.executable, "-m", "bench", "run", *flags, f"results_dir={results_dir}",
            *[a for a in args if not a.startswith("-")]]


def start(results_dir: Path, *args: str, env=None) -> subprocess.Popen:
    return subprocess.Popen(cli_cmd(results_dir, *args), cwd=REPO_ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})})


def wait_for(predicate, timeout: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def timeline_rows(run_dir: Path, rank: int) -> int:
    path = run_dir / f"timeline_rank{rank}.csv"
    return max(0, path.read_text().count("\n") - 1) if path.exists() else 0


def live_processes(results_dir: Path) -> list:
    """Every process (launcher, torchrun agent, rank) whose command line names something under results_dir."""
    import psutil

    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and any(str(results_dir) in arg for arg in proc.cmdline()):
                found.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.Error:
            continue
    return found


def end_leftovers(results_dir: Path) -> None:
    import psutil

    from bench.run.reaper import end_processes

    procs = []
    for line in live_processes(results_dir):
        try:
            procs.append(psutil.Process(int(line.split()[0])))
        except psutil.Error:
            continue
    assert end_processes([], procs, grace_s=1.0) == []


def summary_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_watchdog_ends_stalled_runs_leaves_no_process_and_keeps_their_timelines(tmp_path):
    """Two stalled runs at once: whether torchrun's agent or the launcher ends a rank first is a race, run
    twice (and under load) here."""
    # the watchdog must outlast start-up (launch to the first finished phase) on a loaded 2-core machine
    dirs = [tmp_path / f"drill{i}" for i in (1, 2)]
    procs = [start(d, *FAST, "launcher.watchdog_s=20", env={"MEMBENCH_FAULT_HANG_RANK": "1"}) for d in dirs]
    for results_dir, proc in zip(dirs, procs):
        output, _ = proc.communicate(timeout=240)
        assert live_processes(results_dir) == []  # checked the moment membench returns: no rank outlived it
        assert proc.returncode == 4, output
        (summary_path,) = results_dir.rglob("summary.json")
        summary = json.loads(summary_path.read_text())
        assert summary["status"] == "timeout" and "launcher.watchdog_s=20" in summary["error"]
        assert timeline_rows(summary_path.parent, 0) >= 1  # the partial timeline is kept


def test_rank_killed_by_signal_fails_the_point_and_the_sweep_continues(tmp_path):
    proc = start(tmp_path, "-m", *FAST, "workload.steps=400,2")
    run_dir = wait_for(lambda: next(iter(tmp_path.glob("sweep-*/0")), None), what="first point")
    wait_for(lambda: timeline_rows(run_dir, 1) >= 6, what="rank 1 training")
    pid = int((run_dir / ".progress_rank1").read_text())
    os.kill(pid, signal.SIGKILL)
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, output  # the sweep's worst status: failed
    killed, fine = summary_of(run_dir), summary_of(run_dir.parent / "1")
    assert killed["status"] == "failed" and "rank 1 killed by signal SIGKILL" in killed["error"]
    rank0 = next(r for r in killed["per_rank"] if r["rank"] == 0)
    assert rank0["status"] == "failed" and timeline_rows(run_dir, 0) >= 6  # its partial results are kept
    assert fine["status"] == "ok"
    index = json.loads((run_dir.parent / "sweep.json").read_text())
    assert [run["status"] for run in index["runs"]] == ["failed", "ok"]
    assert live_processes(tmp_path) == []


def test_two_runs_started_at_once_never_share_a_directory_and_a_hostile_name_is_a_label(tmp_path):
    marker = tmp_path / "pwned"
    name = f"x; touch {marker}; $(touch {marker})"
    procs = [start(tmp_path, *FAST, "workload.steps=1", f"workload.name='{name}'") for _ in range(2)]
    for proc in procs:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output
    summaries = [json.loads(p.read_text()) for p in tmp_path.rglob("summary.json")]
    assert len(summaries) == 2 and len({s["run_id"] for s in summaries}) == 2
    assert all(s["status"] == "ok" and len(s["per_rank"]) == 2 for s in summaries)
    assert all(s["workload"] == name for s in summaries)
    assert not marker.exists()


def test_ctrl_c_on_a_sweep_stops_cleanly_and_keeps_finished_runs(tmp_path):
    proc = start(tmp_path, "-m", *FAST, "workload.steps=1,400")
    second = wait_for(lambda: next(iter(tmp_path.glob("sweep-*/1")), None), timeout=180, what="second point")
    wait_for(lambda: timeline_rows(second, 0) >= 4, what="second point training")
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "interrupted" in output
    assert summary_of(second.parent / "0")["status"] == "ok"  # the finished point is kept
    interrupted = summary_of(second)
    assert interrupted["status"] == "failed" and "interrupted" in interrupted["error"]
    assert live_processes(tmp_path) == []  # no orphan agent or rank, the moment membench returns


def test_kill_during_update_baselines_leaves_old_baselines_intact(tmp_path):
    baselines = tmp_path / "baselines" / "cpu"
    baselines.mkdir(parents=True)
    old = {name: {"schema_version": 1, "name": name, "marker": "old"} for name in ("a", "b")}
    for name, content in old.items():
        (baselines / f"{name}.json").write_text(json.dumps(content))
    suite = tmp_path / "suite.yaml"
    suite.write_text(json.dumps({"name": "s", "hardware": "cpu", "entries": [
        {"name": "a", "overrides": [*FAST[1:], "workload.steps=300"]},
        {"name": "b", "overrides": [*FAST[1:], "workload.steps=300"]}]}))
    (tmp_path / "test_mem.py").write_text(
        "def test_memory(membench_entry, membench_check):\n    membench_check(membench_entry)\n")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--membench-suite={suite}",
                             f"--baseline-dir={tmp_path / 'baselines'}", f"--membench-results-dir={tmp_path / 'runs'}",
                             "--update-baselines", str(tmp_path / "test_mem.py")], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    run_dir = wait_for(lambda: next(iter((tmp_path / "runs").glob("suite-*/a")), None), what="entry a running")
    wait_for(lambda: timeline_rows(run_dir, 0) >= 2, what="entry a training")
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    # SIGKILL leaves the launcher no chance to end its torchrun (in a session of its own): do it here
    end_leftovers(tmp_path)
    for name, content in old.items():
        assert json.loads((baselines / f"{name}.json").read_text()) == content
    assert sorted(p.name for p in baselines.iterdir() if not p.name.startswith(".")) == ["a.json", "b.json"]


def test_two_nodes_as_two_torchrun_agents_on_localhost(tmp_path):
    proc = start(tmp_path, *FAST, "workload.steps=2", "hardware.nodes=2", "hardware.ranks_per_node=1",
                 "launcher.spawn_all_nodes=true", "launcher.rdzv_endpoint=127.0.0.1:29477")
    output, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, output
    (summary_path,) = tmp_path.rglob("summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "ok" and summary["world_size"] == 2
    assert [r["rank"] for r in summary["per_rank"]] == [0, 1]
    log = (summary_path.parent / "launcher.log").read_text()
    assert "[node 0]" in log and "[node 1]" in log


def test_sweep_through_submitit_local_executor(tmp_path):
    proc = start(tmp_path, "-m", "hydra/launcher=local", *FAST, "workload.steps=1", "workload.batch_size=256,512")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, output
    (index_path,) = tmp_path.glob("sweep-*/sweep.json")
    runs = json.loads(index_path.read_text())["runs"]
    assert [run["status"] for run in runs] == ["ok", "ok"]
    assert list(index_path.parent.glob(".submitit/*"))  # the jobs went through submitit
