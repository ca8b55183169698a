"""Progress on long work: a sweep's [k/N] lines (or a bar on a terminal), provisioning over many world
sizes, and a run's ranks' steps (bench/apps/progress.py, bench/run/step_progress.py). No torchrun."""
from __future__ import annotations

import io
from pathlib import Path

from bench.apps.plan import world_size_progress
from bench.apps.progress import PointDone, SweepProgress, Throttled, count_points, sweep_axes
from bench.run.config import CONF_DIR
from bench.run.step_progress import RankPosition, StepWatcher, describe, last_position

MIB = 1024**2


class FakeClock:
    def __init__(self, start: float = 100.0):
        self.now = start

    def __call__(self) -> float:
        return self.now


def test_points_are_counted_from_the_overrides_as_hydra_expands_them():
    args = ["-m", "results_dir=/tmp/x", "hardware=cpu", "workload.batch_size=8,16", "workload.seed=range(0,3)"]
    axes = sweep_axes(args)
    assert axes == [("workload.batch_size", 2), ("workload.seed", 3)]
    assert count_points(axes) == 6
    assert count_points(sweep_axes(["-m", "hardware=cpu"])) == 1
    sharding_files = len(list(Path(CONF_DIR, "sharding").glob("*_wise.yaml")))
    glob_sweep = sweep_axes(["-m", "sharding=glob(*_wise)", "workload.seed=0,1"], CONF_DIR)
    assert count_points(glob_sweep) == 2 * sharding_files
    assert count_points(sweep_axes(["-m", "workload.dense_lr=interval(0.1,1)"])) is None  # not enumerable
    assert sweep_axes(["-m", "workload.batch_size=[8"]) is None  # Hydra itself reports the bad override


def test_a_sweep_prints_k_of_n_with_elapsed_and_eta_as_plain_lines():
    clock, out = FakeClock(), io.StringIO()
    progress = SweepProgress(4, ["workload.batch_size", "workload.seed"], terminal=False, out=out, now=clock)
    clock.now += 3  # start-up before the first point: not in the ETA
    lines = []
    for number, (batch, seed) in enumerate([(8, 0), (8, 1), (16, 0), (16, 1)]):
        progress.point_started()
        clock.now += 10
        overrides = ["results_dir=/tmp/x", "hardware=cpu", f"workload.batch_size={batch}", f"workload.seed={seed}"]
        lines.append(progress.point_done(overrides, "oom" if number == 3 else "ok", 22 * MIB + number, 10.0).line())
    assert out.getvalue().splitlines() == lines
    assert lines[0] == ("[1/4] workload.batch_size=8 workload.seed=0 → ok, peak 22.0 MiB, 10.0 s; "
                        "elapsed 0:00:13, ETA 0:00:30")
    assert lines[2].endswith("elapsed 0:00:33, ETA 0:00:10")
    assert lines[3].startswith("[4/4] workload.batch_size=16 workload.seed=1 → oom")
    assert lines[3].endswith("ETA 0:00:00")


def test_unknown_totals_and_missing_peaks_still_make_a_line():
    point = PointDone(2, None, ["workload=glob(*)"], "invalid", None, 0.5, 61.0)
    assert point.line() == "[2/?] workload=glob(*) → invalid, 0.5 s; elapsed 0:01:01"
    progress = SweepProgress(None, [], terminal=False, out=io.StringIO())
    assert progress.shown_overrides(["results_dir=/r", "hydra.verbose=true", "world_size=8"]) == ["world_size=8"]


def test_on_a_terminal_the_bar_replaces_the_lines(capsys):
    progress = SweepProgress(2, ["world_size"], terminal=True)
    for size in (8, 16):
        progress.point_started()
        progress.point_done([f"world_size={size}"], "ok", MIB, 0.1)
    progress.stop()
    out = capsys.readouterr().out
    assert "[1/2]" not in out and "[2/2]" not in out
    assert "2/2" in out and "last: world_size=16 → ok" in out


def test_no_sweep_point_no_bar(capsys):
    progress = SweepProgress(3, ["world_size"], terminal=True)
    progress.stop()  # `membench run -m --help` runs no point
    assert capsys.readouterr().out == ""


def test_throttled_lines_wait_and_then_come_at_most_every_interval():
    clock, said = FakeClock(), []
    throttle = Throttled(said.append, every_s=5, after_s=2, now=clock)
    for _ in range(20):  # 10 s of a loop that reports every half second
        throttle(lambda elapsed: f"at {elapsed:.1f}")
        clock.now += 0.5
    assert said == ["at 2.0", "at 7.0"]


def test_provisioning_reports_the_world_sizes_it_tries(capsys):
    report = world_size_progress(max_world_size=4096, every_s=0)
    report(512, {"world_size": 64, "fits": False, "max_rank_bytes": 3 * 1024**3, "shortfall_bytes": MIB})
    report(512, {"world_size": 72, "fits": False, "max_rank_bytes": None, "shortfall_bytes": 2 * MIB})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[membench] batch 512: world size 64 of up to 4096 does not fit (largest rank "
                               "3.00 GiB, 1.0 MiB over budget); elapsed 0:00:0")
    assert "world size 72 of up to 4096 does not fit (placement failed, 2.0 MiB over budget)" in lines[1]


def test_provision_calls_back_for_every_world_size():
    from bench.planning.provision import provision
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import resolve_target

    cfg = compose_run_config(["workload=tiny", "hardware=h100_80g", "hardware.capacity_gib=0.02",
                              "plan.max_world_size=4", "hardware.ranks_per_node=2"])
    tried = []
    provision(cfg, resolve_target(cfg, visible_cuda=None), progress=lambda line: None,
              on_world_size=lambda batch, point: tried.append((batch, point["world_size"])))
    assert tried == [(cfg.workload.batch_size, size) for size in (2, 4)]  # nothing fits 20 MiB


# -- a run's ranks --------------------------------------------------------------------------------
def write_timeline(path: Path, rows, partial: str = "") -> None:
    from bench.run.memory.recorder import TimelineWriter

    writer = TimelineWriter(path)
    for step, phase in rows:
        writer.write([f"{max(step, 0) * 0.1:.6f}", step, phase, 10, 12, None, None])
    writer.close()
    if partial:  # a row the rank is still writing
        with open(path, "a") as handle:
            handle.write(partial)


def test_the_last_complete_timeline_row_is_where_a_rank_is(tmp_path):
    path = tmp_path / "timeline_rank0.csv"
    write_timeline(path, [])
    assert last_position(path) is None  # the header only
    write_timeline(path, [(-1, "build"), (0, "input"), (0, "forward")], partial="0.3000,1,inp")
    assert last_position(path) == RankPosition(0, "forward")
    assert last_position(tmp_path / "missing.csv") is None


def test_step_lines_name_the_slowest_rank_and_the_time_left(tmp_path):
    write_timeline(tmp_path / "timeline_rank0.csv", [(-1, "build"), (0, "input"), (1, "input"), (2, "forward")])
    write_timeline(tmp_path / "timeline_rank1.csv", [(-1, "build"), (0, "input"), (1, "backward")])
    watcher = StepWatcher(tmp_path, "run-x", world_size=3, total_steps=6, local_ranks=3)
    positions = watcher.positions()
    assert positions == {0: RankPosition(2, "forward"), 1: RankPosition(1, "backward")}
    assert describe("run-x", positions, 3, 6, 65.0, None) == (
        "[membench] run run-x: 0:01:05, ranks at step 2-3 of 6 (slowest: rank 1, step 2 backward), "
        "1 rank(s) starting")
    assert describe("run-x", {}, 2, 6, 5.0, None) == "[membench] run run-x: 0:00:05, waiting for 2 rank(s) to start"
    assert describe("run-x", {0: RankPosition(-1, "build")}, 1, 6, 9.0, None) == (
        "[membench] run run-x: 0:00:09, building the model on 1 rank(s)")
    # ETA at the slowest rank's rate: from step 1 to step 3 in 20 s, 3 steps left
    two = StepWatcher(tmp_path, "run-x", world_size=2, total_steps=6)
    assert two.eta({0: RankPosition(2, "input"), 1: RankPosition(1, "input")}, now=10.0) is None  # the rate starts
    assert two.eta({0: RankPosition(4, "input"), 1: RankPosition(3, "input")}, now=30.0) == 30.0


def test_the_watcher_prints_while_the_run_goes_and_stops_with_it(tmp_path):
    write_timeline(tmp_path / "timeline_rank0.csv", [(-1, "build"), (0, "input")])
    said = []
    with StepWatcher(tmp_path, "run-x", 1, 4, say=said.append, every_s=0.05, after_s=0.0, poll_s=0.01):
        import time

        time.sleep(0.3)
    count = len(said)
    assert count >= 2 and said[0].startswith("[membench] run run-x: 0:00:00, ranks at step 1 of 4")
    with StepWatcher(tmp_path, "run-x", 1, 4, say=said.append, after_s=0.0, poll_s=0.01, enabled=False):
        pass
    assert len(said) == count
