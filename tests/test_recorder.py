"""Recorder logic without torchrun: segments, breakdown sums, timeline rows; CUDA backend on fakes."""
from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from bench.run.memory.cpu import CpuExactRecorder
from bench.run.memory.cuda import CudaRecorder
from bench.run.memory.cuda_stats import CudaAllocatorStats
from bench.results.schema import CATEGORIES

from nvml_fakes import FakeSampler

CPU = torch.device("cpu")


def train_steps(recorder, model, optimizer, steps: int, batch: int = 64):
    for step in range(steps):
        with recorder.phase(step, "input"):
            x = torch.ones(batch, 32)
        with recorder.phase(step, "forward"):
            loss = model(x).square().mean()
        with recorder.phase(step, "backward"):
            loss.backward()
        with recorder.phase(step, "optimizer"):
            optimizer.step()
            optimizer.zero_grad()
        del x, loss


def run_cpu(tmp_path, capacity=10**9, steps=3, warmup=1):
    recorder = CpuExactRecorder(0, CPU, capacity, tmp_path / "timeline.csv", warmup_steps=warmup)
    recorder.start()
    with recorder.phase(-1, "build"):
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
        optimizer = torch.optim.Adam(model.parameters())
    recorder.attribute({"dense_params": list(model.parameters())})
    try:
        train_steps(recorder, model, optimizer, steps)
    finally:
        recorder.stop()
    return recorder


def test_cpu_breakdown_sums_to_peak_and_is_attributed(tmp_path):
    result = run_cpu(tmp_path).result("ok")
    assert set(result.breakdown) == set(CATEGORIES)
    assert sum(result.breakdown.values()) == result.peak_bytes
    params = (32 * 64 + 64 + 64 * 1 + 1) * 4
    assert result.breakdown["dense_params"] == params
    # Adam: exp_avg + exp_avg_sq per parameter, plus one step scalar per parameter tensor
    assert result.breakdown["dense_optimizer"] >= 2 * params
    assert result.breakdown["activations"] > 0
    assert result.peak_step >= 1  # steady state excludes the warm-up step
    assert result.utilization == pytest.approx(result.peak_bytes / 10**9)


def test_cpu_recorder_is_deterministic(tmp_path):
    first, second = (run_cpu(tmp_path, steps=3).result("ok") for _ in range(2))
    for field in ("peak_bytes", "breakdown", "peak_step", "peak_phase", "warmup_peak_bytes", "build_peak_bytes"):
        assert getattr(first, field) == getattr(second, field)


def test_timeline_has_a_row_per_phase(tmp_path):
    recorder = run_cpu(tmp_path, steps=2)
    recorder.close()
    rows = list(csv.DictReader(open(tmp_path / "timeline.csv")))
    assert [(r["step"], r["phase"]) for r in rows[:5]] == [
        ("-1", "build"), ("0", "input"), ("0", "forward"), ("0", "backward"), ("0", "optimizer")]
    assert len(rows) == 1 + 2 * 4
    assert all(int(r["phase_peak_bytes"]) >= int(r["in_use_bytes"]) for r in rows)


def test_failed_rank_reports_peak_of_its_segment(tmp_path):
    recorder = CpuExactRecorder(0, CPU, 40_000, None, warmup_steps=0)
    recorder.start()
    with pytest.raises(torch.OutOfMemoryError):
        with recorder.phase(-1, "build"):
            keep = torch.ones(5000)  # 20,000 B
            torch.ones(6000)         # would exceed 40,000 B
    recorder.stop()
    result = recorder.result("oom")
    assert (recorder.step, recorder.phase_name) == (-1, "build")
    assert result.peak_bytes == 20_000 and result.peak_phase == "build"
    assert sum(result.breakdown.values()) == result.peak_bytes
    del keep


# -- CUDA backend on fakes -----------------------------------------------------------------------
class FakeSnapshots:
    def __init__(self):
        self.calls = []

    def start_history(self, max_entries):
        self.calls.append(("start", max_entries))

    def dump_snapshot(self, path):
        self.calls.append(("dump", str(path)))
        return str(path)

    def stop_history(self):
        self.calls.append(("stop",))


def test_cuda_recorder_breakdown_from_stats_and_nvml(tmp_path):
    # phase peaks in MiB: (allocated, peak allocated, reserved, peak reserved)
    script = iter([(10, 12, 16, 16), (20, 30, 32, 34), (10, 40, 40, 48), (10, 25, 40, 40)])
    resets = []

    def read_stats(device):
        alloc, peak_alloc, reserved, peak_reserved = (v << 20 for v in next(script))
        return CudaAllocatorStats(allocated_bytes=alloc, peak_allocated_bytes=peak_alloc,
                                  reserved_bytes=reserved, peak_reserved_bytes=peak_reserved)

    sampler, snapshots = FakeSampler(used=60 << 20), FakeSnapshots()
    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 << 30, tmp_path / "t.csv", warmup_steps=0,
                            read_stats=read_stats, reset_peaks=resets.append, sampler=sampler,
                            snapshot_dir=tmp_path, snapshots=snapshots, synchronize=lambda d: None)
    recorder._static_bytes = {"embedding_weights": 8 << 20, "dense_params": 1 << 20}
    with recorder.phase(-1, "build"):
        pass
    for name in ("forward", "backward", "optimizer"):
        with recorder.phase(0, name):
            pass
    result = recorder.result("ok")
    recorder.close()
    assert len(resets) == 4  # peak counters reset at every phase
    # NVML's used is flat (steady state): the phase where the allocator peaks is the peak, not the first one
    assert result.peak_allocated_bytes == 40 << 20 and result.peak_reserved_bytes == 48 << 20
    assert (result.peak_step, result.peak_phase) == (0, "backward")
    # NVML is the measure: 60 MiB used at the end of backward with 40 reserved, so 20 MiB outside the
    # allocator; when reserved peaked at 48 MiB inside the phase, the process held 48 + 20
    assert result.peak_bytes == 68 << 20
    assert result.breakdown["activations"] == (40 - 9) << 20
    assert result.breakdown["allocator_overhead"] == (48 - 40) << 20
    assert result.breakdown["non_torch"] == 20 << 20
    assert sum(result.breakdown.values()) == result.peak_bytes
    assert sampler.started and sampler.stopped
    assert snapshots.calls[0] == ("start", 100_000)
    assert snapshots.calls[-2][0] == "dump" and snapshots.calls[-1] == ("stop",)


def test_cuda_failure_stats_dump_an_oom_snapshot(tmp_path):
    snapshots = FakeSnapshots()
    recorder = CudaRecorder(1, torch.device("cuda", 1), 1 << 30, None, 0,
                            read_stats=lambda d: CudaAllocatorStats(num_ooms=1, allocated_bytes=5),
                            reset_peaks=lambda d: None, sampler=FakeSampler(10), snapshot_dir=tmp_path,
                            snapshots=snapshots)
    stats = recorder.failure_stats()
    assert stats["num_ooms"] == 1 and stats["allocated_bytes"] == 5
    assert not any(call[0] == "dump" for call in snapshots.calls)  # not before the rank's result is written
    recorder.close()
    assert ("dump", str(tmp_path / "oom_rank1.pickle")) in snapshots.calls


def test_a_sigterm_while_the_failure_is_written_does_not_lose_the_result(tmp_path, monkeypatch):
    """A peer's death reaches a rank as a broken collective and, a moment later, as torchrun's SIGTERM; the
    SIGTERM landed while the failed result was being written and the rank ended with no result (a fault
    drill caught it once the collectives completed at launch)."""
    import os
    import signal

    from bench.results import store
    from bench.run import worker

    recorder = CpuExactRecorder(0, CPU, 40_000, None, warmup_steps=0)
    recorder.start()
    write = store.write_rank_result

    def write_after_a_sigterm(run_dir, result):
        os.kill(os.getpid(), signal.SIGTERM)  # delivered before the write's first bytecode returns
        write(run_dir, result)

    monkeypatch.setattr(worker, "write_rank_result", write_after_a_sigterm)
    previous = signal.signal(signal.SIGTERM, worker.raise_terminated)
    try:
        code = worker.record_failure(tmp_path, recorder, 0, RuntimeError("Connection closed by peer"))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == 1
    assert store.load_rank_result(store.rank_file(tmp_path, 0)).status == "failed"


def test_a_recorder_that_cannot_start_still_leaves_the_rank_a_result(tmp_path, monkeypatch):
    """Audit N9: under MIG UUIDs (or without libnvidia-ml) torch's NVML mapping raises; that was outside
    every `try`, so the rank died with no result. The CUDA recorder now runs without NVML, and a recorder
    that cannot be made at all leaves a `failed` result naming why."""
    from bench.results import store
    from bench.run import worker
    from bench.run.memory import cuda as cuda_recorder

    def mig(index):
        raise RuntimeError("device 0 is not visible (CUDA_VISIBLE_DEVICES=MIG-...)")

    monkeypatch.setattr(cuda_recorder, "nvml_device_index", mig)
    recorder = cuda_recorder.CudaRecorder(0, torch.device("cuda", 0), 1 << 30, None, 0, read_stats=lambda d: None,
                                          reset_peaks=lambda d: None)
    assert recorder.sampler is None
    fallback = worker.StepTimeRecorder(3, torch.device("cpu"), 1 << 30, None, 0)  # what main falls back to
    fallback.heartbeat = lambda: None
    code = worker.record_failure(tmp_path, fallback, 3, RuntimeError("the recorder could not start"))
    result = store.load_rank_result(store.rank_file(tmp_path, 3))
    assert code == 1 and result.status == "failed" and "could not start" in result.error
