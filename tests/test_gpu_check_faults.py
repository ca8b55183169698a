"""gpu_check's self-test: for each check, the fault it exists to catch is planted into the path the check
reads (a model that never splits a block, NVML below reserved, a negative `other`, the peak taken from the
wrong phase, a snapshot without its trace, an OOM that never comes, a recorder that doubles step time), and
the check must FAIL; without the fault it must PASS. The checks run as gpu_check runs them, on the simulated
GPU (`--simulate`), small sizes; the overhead check, a GPU timing, is decided on planted timings."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from bench.gpucheck import recorder_checks, replay, sequences, verdicts
from bench.gpucheck.log import CheckLog
from bench.run.memory.simulated import SimulatedCudaRecorder, SimulatedNvml, SimulatedSnapshots

WIDTH, BATCH, STEPS = 256, 64, 4


def verdicts_of(run, tmp_path) -> dict:
    log = CheckLog()
    run(recorder_checks.Target(torch.device("cpu"), recorder_checks.SIMULATED_BYTES, simulated=True), tmp_path, log)
    return {check.name: check.verdict for check in log.checks}


def recording(target, out_dir, log):
    recorder_checks.recorder_checks(target, out_dir, STEPS, WIDTH, BATCH, log)


def allocator(target, out_dir, log):
    replay.allocator_replay(target, out_dir, WIDTH, BATCH, log)


def test_without_a_fault_every_check_passes(tmp_path):
    seen = {**verdicts_of(recording, tmp_path), **verdicts_of(allocator, tmp_path)}
    assert seen == {"allocator peaks": "PASS", "nvml device used >= reserved": "PASS",
                    "breakdown sums to peak": "PASS", "peak phase holds the highest allocated": "PASS",
                    "memory_viz snapshot": "PASS", "recorder overhead": "SKIP", "forced OOM recorded": "PASS",
                    "OOM snapshot": "PASS", "allocator model vs replay": "PASS"}


def test_a_model_that_never_splits_a_block_fails_the_replay(tmp_path, monkeypatch):
    """Planted on the model's side only (the simulated device, the "real" side here, keeps the true rules)."""
    from bench.accounting.caching_allocator import CachingAllocatorModel
    from bench.accounting.caching_allocator.replay import ReplayPeaks

    class NeverSplits(CachingAllocatorModel):
        def _should_split(self, block, size):
            return False

    def replay_never_splitting(events, settings, before=()):
        model = NeverSplits(1 << 50, settings, trace_max_entries=0)
        for key, nbytes in events:
            model.free(key) if nbytes is None else model.malloc(nbytes, key)
        return ReplayPeaks.from_stats(model.memory_stats())

    monkeypatch.setattr(replay, "replay", replay_never_splitting)
    assert verdicts_of(allocator, tmp_path)["allocator model vs replay"] == "FAIL"


def test_the_replayed_trace_needs_every_size_rule():
    """gpu_check's default model (width 4096) allocates three sizes only, 4 B, 16 KiB and 64 MiB (no
    20 MiB segment, no 2 MiB rounding, no split: a model keeping 64 MiB blocks whole passed); the varied
    stream after it has each kind of request, and frees between them."""
    from bench.accounting.caching_allocator.replay import AllocationStream
    from bench.accounting.live_tensors import LiveTensorTracker

    meta, stream = torch.device("meta"), AllocationStream()
    with LiveTensorTracker(meta, 1 << 60, rank=0, allocator=stream):
        model = recorder_checks.make_model(meta, 4096)
        recorder_checks.train(model, torch.optim.Adam(model.parameters()), None, meta, 3, 4096, 4096)
    assert {n for _, n in stream.events if n is not None} == {4, 16 << 10, 64 << 20}
    events = replay.varied_events()
    sizes = [n for _, n in events if n is not None]
    mib = 1 << 20
    assert any(n < mib for n in sizes) and any(mib < n < 10 * mib for n in sizes) and any(n > 10 * mib for n in sizes)
    assert any(n % 512 for n in sizes) and any(n % (2 * mib) for n in sizes if n > mib)
    frees = [i for i, (_, n) in enumerate(events) if n is None]
    assert frees and frees[0] < len(sizes) // 2  # frees interleaved, not only at the end


def test_nvml_reading_below_reserved_fails(tmp_path, monkeypatch):
    real_sample = SimulatedNvml.sample_now

    def one_mib(self):
        return dataclasses.replace(real_sample(self), device_used_bytes=1 << 20, process_used_bytes=1 << 20)

    monkeypatch.setattr(SimulatedNvml, "sample_now", one_mib)
    assert verdicts_of(recording, tmp_path)["nvml device used >= reserved"] == "FAIL"


def _planted_result(monkeypatch, change):
    real_result = SimulatedCudaRecorder.result

    def result(self, status, *args, **kwargs):
        return change(real_result(self, status, *args, **kwargs))
    monkeypatch.setattr(SimulatedCudaRecorder, "result", result)


def test_a_negative_other_fails_the_breakdown_even_when_it_sums(tmp_path, monkeypatch):
    def negative_other(result):
        moved = 50 << 20
        breakdown = {**result.breakdown, "activations": result.breakdown["activations"] + moved,
                     "other": result.breakdown["other"] - moved}
        return dataclasses.replace(result, breakdown=breakdown)
    _planted_result(monkeypatch, negative_other)
    assert verdicts_of(recording, tmp_path)["breakdown sums to peak"] == "FAIL"


def test_a_peak_taken_from_the_wrong_phase_fails(tmp_path, monkeypatch):
    _planted_result(monkeypatch, lambda result: dataclasses.replace(result, peak_phase="input"))
    assert verdicts_of(recording, tmp_path)["peak phase holds the highest allocated"] == "FAIL"


def test_a_snapshot_without_its_trace_fails(tmp_path, monkeypatch):
    real_snapshot = SimulatedSnapshots.dump_snapshot

    def traceless(self, path):
        written = real_snapshot(self, path)
        import pickle

        snapshot = pickle.loads(open(written, "rb").read())
        snapshot["device_traces"] = [[]]
        open(written, "wb").write(pickle.dumps(snapshot))
        return written
    monkeypatch.setattr(SimulatedSnapshots, "dump_snapshot", traceless)
    assert verdicts_of(recording, tmp_path)["memory_viz snapshot"] == "FAIL"


def test_a_snapshot_without_frames_fails_on_a_gpu():
    snapshot = {"segments": [{"total_size": 2 << 20}], "device_traces": [[{"action": "alloc", "frames": []}]]}
    assert not verdicts.snapshot_is_readable(snapshot, need_frames=True).ok
    assert verdicts.snapshot_is_readable(snapshot, need_frames=False).ok
    snapshot["device_traces"][0][0]["frames"] = [{"filename": "x.py", "line": 1, "name": "f"}]
    assert verdicts.snapshot_is_readable(snapshot, need_frames=True).ok


def test_an_oom_that_never_comes_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(recorder_checks, "FORCED_OOM_BYTES", 1 << 20)  # fits the 256 MiB left: no OOM
    assert verdicts_of(recording, tmp_path)["forced OOM recorded"] == "FAIL"


@pytest.mark.parametrize("recorded_ms, plain_ms, ok", [([26.0, 26.2, 25.9], [13.0, 13.1, 12.9], False),
                                                        ([13.4, 13.3, 13.5], [13.0, 13.1, 12.9], True)])
def test_a_recorder_that_doubles_step_time_fails(recorded_ms, plain_ms, ok):
    assert verdicts.overhead_within([t / 1e3 for t in recorded_ms], [t / 1e3 for t in plain_ms]).ok is ok


def test_a_stage_that_raises_is_a_fail_line_and_the_next_stages_still_run(tmp_path, monkeypatch):
    """One stage's exception (a hung run's timeout, a recorder error) once ended gpu_check with a traceback
    and no gpu_check.json."""
    import json

    from bench.apps import gpu_check
    from bench.gpucheck import runs

    def broken(*args):
        raise RuntimeError("planted: the recorder could not start")

    ran = []
    monkeypatch.setattr(replay, "allocator_replay", lambda *a: ran.append("replay"))
    monkeypatch.setattr(sequences, "allocator_sequences", lambda *a: ran.append("sequences"))
    monkeypatch.setattr(recorder_checks, "recorder_checks", broken)
    for name in ("native_run", "oom_drill", "watchdog_drill", "torchrec_run"):
        monkeypatch.setattr(runs, name, lambda *a, name=name: ran.append(name))
    log = CheckLog(json_path=tmp_path / "gpu_check.json", simulated=True)
    gpu_check.run_all(True, tmp_path, STEPS, WIDTH, BATCH, log)
    assert ran == ["replay", "sequences", "native_run", "oom_drill", "watchdog_drill", "torchrec_run"]
    assert log.failed == ["stage recorder checks"]
    assert "planted: the recorder could not start" in log.checks[-1].detail
    assert json.loads((tmp_path / "gpu_check.json").read_text())["failed"] == ["stage recorder checks"]


@pytest.mark.slow
def test_a_run_past_its_timeout_is_ended_with_every_process_of_it(tmp_path, monkeypatch):
    """A hung `membench run` in a stage: its launcher, agents and ranks are ended (killing the launcher
    alone left them running), and the stage gets RunTimedOut."""
    from bench.gpucheck import runs
    from bench.run.reaper import rank_processes

    monkeypatch.setattr(runs, "RUN_TIMEOUT_S", 12)
    with pytest.raises(runs.RunTimedOut, match="ran past 12 s; ended it .processes left: none"):
        runs.membench_run(tmp_path, "model=native", "workload=tiny", *runs.hardware_overrides(True),
                          "launcher.watchdog_s=600", env={"MEMBENCH_FAULT_HANG_RANK": "0"})
    (run_dir,) = {path.parent for path in (tmp_path / "runs").rglob("launch.json")}
    (progress,) = run_dir.glob(".progress_rank0")  # the rank did start (its pid is in it): none was left
    assert progress.read_text().split()[0].isdigit()
    assert rank_processes(run_dir) == []
