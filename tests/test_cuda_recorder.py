"""The CUDA recorder (bench.run.memory.cuda), checked on CPU (GPU_AUDIT.md, as test_gpu_path.py): each test
reproduces an audited defect with fakes of the caching allocator's statistics, NVML and torch.cuda.memory's
snapshot calls, and fails on the code the audit read (commit 12424eb)."""
from __future__ import annotations

import pytest
import torch

from nvml_fakes import FakeNvml, FakeSampler


def test_steady_state_peak_is_the_phase_where_tensors_peak():
    """Audit #3: with NVML used and the reserved pool flat from phase to phase (steady state), the peak
    phase was the first one, so a 1200 MiB allocation peak was reported as 100 MiB and the activations as
    allocator overhead."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    mib = 1 << 20
    peaks = iter([100, 1200, 300])  # peak allocated per phase (MiB); reserved 2000 MiB and NVML 2500 MiB flat


    def read_stats(device):
        return CudaAllocatorStats(allocated_bytes=50 * mib, peak_allocated_bytes=next(peaks) * mib,
                                  reserved_bytes=2000 * mib, peak_reserved_bytes=2000 * mib)

    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 << 30, None, warmup_steps=0, read_stats=read_stats,
                            reset_peaks=lambda d: None, sampler=FakeSampler(2500 * mib), synchronize=lambda d: None)
    recorder._static_bytes = {"dense_params": 40 * mib}
    for name in ("forward", "backward", "optimizer"):
        with recorder.phase(0, name):
            pass
    result = recorder.result("ok")
    assert (result.peak_phase, result.peak_allocated_bytes) == ("backward", 1200 * mib)
    assert result.breakdown["activations"] == (1200 - 40) * mib
    assert result.breakdown["allocator_overhead"] == (2000 - 1200) * mib
    assert sum(result.breakdown.values()) == result.peak_bytes == 2500 * mib


def test_an_nvml_bump_outside_the_allocator_does_not_make_its_phase_the_peak():
    """Audit N21: phases were ranked by NVML first, so a phase where NCCL connected a peer (or a kernel
    module loaded) won over the one where the tensors peaked."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    mib = 1 << 20
    peaks = iter([(300, 1000, 2600), (1200, 2000, 2500)])  # (peak allocated, peak reserved, NVML) per phase
    sampler = FakeSampler(0)

    def read_stats(device):
        allocated, reserved, nvml = next(peaks)
        sampler.used = nvml * mib
        return CudaAllocatorStats(allocated_bytes=50 * mib, peak_allocated_bytes=allocated * mib,
                                  reserved_bytes=reserved * mib, peak_reserved_bytes=reserved * mib)

    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 << 30, None, warmup_steps=0, read_stats=read_stats,
                            reset_peaks=lambda d: None, sampler=sampler, synchronize=lambda d: None)
    for name in ("forward", "backward"):
        with recorder.phase(0, name):
            pass
    result = recorder.result("ok")
    assert (result.peak_phase, result.peak_allocated_bytes, result.peak_bytes) == ("backward", 1200 * mib, 2500 * mib)
    assert result.breakdown["non_torch"] == 500 * mib


class RecordingSnapshots:
    """torch.cuda.memory's snapshot calls (`_record_memory_history`, `_dump_snapshot`), recorded with what
    the run directory held at each call."""

    def __init__(self, run_dir):
        self.run_dir, self.calls = run_dir, []

    def _record_memory_history(self, **kwargs):
        self.calls.append(("history", kwargs))

    def _dump_snapshot(self, filename):
        self.calls.append(("dump", filename, sorted(p.name for p in self.run_dir.glob("rank*.json"))))


def cuda_recorder(run_dir, snapshots, stats=None):
    from bench.run.memory import snapshot as snapshot_api
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats


    class Backend:  # bench.run.memory.snapshot with torch.cuda.memory replaced
        start_history = staticmethod(lambda n: snapshot_api.start_history(n, backend=snapshots))
        stop_history = staticmethod(lambda: snapshot_api.stop_history(backend=snapshots))
        dump_snapshot = staticmethod(lambda path: snapshot_api.dump_snapshot(path, backend=snapshots))

    return CudaRecorder(0, torch.device("cuda", 0), 80 << 30, None, 0,
                        read_stats=lambda d: stats or CudaAllocatorStats(num_ooms=1, allocated_bytes=1 << 30),
                        reset_peaks=lambda d: None, sampler=FakeSampler(3 << 30), snapshot_dir=run_dir, snapshots=Backend(),
                        synchronize=lambda d: None)


def test_oom_snapshot_is_dumped_after_the_result_is_written(tmp_path):
    """Audit (likely): the OOM snapshot was dumped before the rank's result existed; with C++ stacks a dump
    takes minutes, outlasting the watchdog, so the OOM rank left nothing."""
    from bench.run.worker import record_failure

    snapshots = RecordingSnapshots(tmp_path)
    recorder = cuda_recorder(tmp_path, snapshots)
    with pytest.raises(torch.OutOfMemoryError):
        with recorder.phase(0, "forward"):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)")
    assert record_failure(tmp_path, recorder, 0, torch.OutOfMemoryError("CUDA out of memory. Tried to "
                                                                        "allocate 2.00 GiB")) == 3
    history, dump = snapshots.calls[0], next(c for c in snapshots.calls if c[0] == "dump")
    assert history[1]["stacks"] == "python"  # C++ frames make a dump take minutes
    assert dump[1].endswith("oom_rank0.pickle") and dump[2] == ["rank0.json"]  # the result came first


def test_final_snapshot_is_dumped_after_the_peers_are_released(tmp_path):
    from bench.run.worker import finish

    snapshots = RecordingSnapshots(tmp_path)
    recorder = cuda_recorder(tmp_path, snapshots)
    with recorder.phase(0, "forward"):
        pass
    order = []
    snapshots._dump_snapshot = lambda filename: order.append("dump")
    finish(tmp_path, recorder, lambda: order.append("barrier"))
    assert order == ["barrier", "dump"] and (tmp_path / "rank0.json").exists()


def test_snapshot_arguments_match_the_real_torch_api():
    import inspect

    parameters = inspect.signature(torch.cuda.memory._record_memory_history).parameters
    assert {"enabled", "stacks", "max_entries"} <= set(parameters)
    assert "python" in (torch.cuda.memory._record_memory_history.__doc__ or "")


def test_step_times_wait_for_the_gpu():
    """Audit (risk): step times were taken without synchronizing, so they timed the host's enqueueing."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    events = []
    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 << 30, None, 0, read_stats=lambda d: CudaAllocatorStats(),
                            reset_peaks=lambda d: None, sampler=None, synchronize=lambda d: events.append(("sync", d)))
    recorder.sampler = None
    for step in (0, 1):
        with recorder.phase(step, "forward"):
            events.append("work")
    recorder.finish_steps()
    assert events == [("sync", torch.device("cuda", 0)), "work"] * 2 + [("sync", torch.device("cuda", 0))]
    assert len(recorder.step_times_s) == 2


def test_uvm_tables_are_not_counted_as_allocator_memory():
    """Audit (likely): tables in CUDA managed memory (fused_uvm_caching) are on the device but not in the
    caching allocator's statistics; counted as static memory they drove `activations` to 0 and `other`
    negative. meta tensors stand in for the device's."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    device, mib = torch.device("meta"), 1 << 20
    uvm_table, hbm_table = torch.empty(400 * mib, dtype=torch.uint8, device=device), torch.empty(
        100 * mib, dtype=torch.uint8, device=device)
    stats = CudaAllocatorStats(allocated_bytes=150 * mib, peak_allocated_bytes=180 * mib, reserved_bytes=200 * mib,
                               peak_reserved_bytes=200 * mib)
    recorder = CudaRecorder(0, device, 80 << 30, None, 0, read_stats=lambda d: stats, reset_peaks=lambda d: None,
                            sampler=None, synchronize=lambda d: None, is_uvm=lambda t: t is uvm_table)
    recorder.sampler = None
    recorder.attribute({"embedding_weights": [uvm_table, hbm_table]})
    with recorder.phase(0, "forward"):
        pass
    breakdown = recorder.result("ok").breakdown
    assert breakdown["embedding_weights"] == 100 * mib and recorder.uvm_bytes == 400 * mib
    assert breakdown["activations"] == 80 * mib and breakdown["other"] == 0


def test_this_process_memory_not_the_devices_is_the_measure():
    """Audit (risk): NVML's v1 `used` is device-wide (other processes, the driver's reservation), so
    non_torch and the peak counted other processes. The v2 struct and this process's entry are used."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats
    from bench.run.memory.nvml import NvmlSampler

    gib = 1 << 30
    nvml = FakeNvml(used=[30 * gib], driver_reserved=2 * gib)  # 30 GiB used on the device, by two processes
    nvml.processes[0].usedGpuMemory = 6 * gib  # ours
    sampler = NvmlSampler(0, interval_s=60.0, nvml=nvml)
    stats = CudaAllocatorStats(allocated_bytes=4 * gib, peak_allocated_bytes=4 * gib, reserved_bytes=5 * gib,
                               peak_reserved_bytes=5 * gib)
    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 * gib, None, 0, read_stats=lambda d: stats,
                            reset_peaks=lambda d: None, sampler=sampler, synchronize=lambda d: None)
    with recorder.phase(0, "forward"):
        pass
    result = recorder.result("ok")
    recorder.close()
    assert result.peak_bytes == 6 * gib and result.breakdown["non_torch"] == 1 * gib
    sample = sampler.latest()
    assert (sample.device_used_bytes, sample.device_reserved_bytes) == (30 * gib, 2 * gib)  # v2: apart


def test_a_peak_between_phase_ends_is_caught_and_samples_stay_bounded():
    """Audit (risk): only the phase-end NVML reading counted (a peak inside the phase was missed) while
    the background samples grew without bound (~36k an hour)."""
    from bench.run.memory.nvml import SAMPLES_KEPT, NvmlSampler

    nvml = FakeNvml(used=[1 << 30])
    nvml.processes = []  # no per-process figure: the device's used
    sampler = NvmlSampler(0, interval_s=60.0, nvml=nvml)
    sampler.start()
    sampler.take_window_peak()
    for used in (1, 9, 2):  # as the background thread would sample, mid-phase
        nvml.used = [used << 30]
        nvml._i = 0
        sampler.sample_now()
    assert sampler.take_window_peak() == 9 << 30 and sampler.take_window_peak() is None
    for _ in range(SAMPLES_KEPT + 50):
        sampler.sample_now()
    assert len(sampler.samples) == SAMPLES_KEPT
    sampler.stop()


def test_a_failed_nvml_reading_skips_the_column_not_the_rank():
    """Audit (likely): one transient NVMLError in the phase-end reading failed the rank."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    class Sampler(FakeSampler):
        def sample_now(self):
            raise RuntimeError("NVMLError_Unknown: Unknown Error")

    recorder = CudaRecorder(0, torch.device("cuda", 0), 1 << 30, None, 0,
                            read_stats=lambda d: CudaAllocatorStats(peak_reserved_bytes=5, reserved_bytes=5),
                            reset_peaks=lambda d: None, sampler=Sampler(used=0), synchronize=lambda d: None)
    with recorder.phase(0, "forward"):
        pass
    result = recorder.result("ok")
    assert result.peak_bytes == 5 and recorder.nvml_failures == 1  # reserved stands in for that phase


def test_allocator_counters_and_fragmentation_are_recorded_per_rank():
    """Audit (risk): num_alloc_retries, num_ooms and fragmentation appeared only in OOM events."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    readings = iter([CudaAllocatorStats(peak_allocated_bytes=10, peak_reserved_bytes=20, reserved_bytes=20,
                                        inactive_split_bytes=1, peak_inactive_split_bytes=2, num_alloc_retries=0),
                     CudaAllocatorStats(peak_allocated_bytes=30, peak_reserved_bytes=40, reserved_bytes=40,
                                        inactive_split_bytes=5, peak_inactive_split_bytes=7, num_alloc_retries=3)])
    recorder = CudaRecorder(0, torch.device("cuda", 0), 1 << 30, None, 0, read_stats=lambda d: next(readings),
                            reset_peaks=lambda d: None, sampler=None, synchronize=lambda d: None)
    recorder.sampler = None
    for name in ("forward", "backward"):
        with recorder.phase(0, name):
            pass
    allocator = recorder.result("ok").allocator
    assert allocator == {"num_alloc_retries": 3, "num_ooms": 0, "inactive_split_bytes": 5,
                         "peak_inactive_split_bytes": 7, "uvm_bytes": 0}


def test_rank_result_keeps_nvmls_device_view_beside_the_process_reading():
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats
    from bench.run.memory.nvml import NvmlSampler

    gib = 1 << 30
    nvml = FakeNvml(used=[30 * gib], driver_reserved=2 * gib)
    nvml.processes[0].usedGpuMemory = 6 * gib
    recorder = CudaRecorder(0, torch.device("cuda", 0), 80 * gib, None, 0,
                            read_stats=lambda d: CudaAllocatorStats(reserved_bytes=5 * gib, peak_reserved_bytes=5 * gib),
                            reset_peaks=lambda d: None, sampler=NvmlSampler(0, interval_s=60.0, nvml=nvml),
                            synchronize=lambda d: None)
    with recorder.phase(0, "forward"):
        pass
    result = recorder.result("ok")
    recorder.close()
    assert result.peak_device_used_bytes == 6 * gib
    assert result.nvml == {"device_used_peak_bytes": 30 * gib, "driver_reserved_bytes": 2 * gib,
                           "process_reported": True, "failed_readings": 0}


def test_under_a_memory_fraction_utilization_is_peak_reserved_against_the_cap():
    """Audit N4: the cap limits the caching allocator, but the peak (NVML's process memory) also holds the
    CUDA context and NCCL's buffers: an 8 MiB cap against a 500 MiB process read utilization 62.5 and
    headroom -492 MiB."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    mib = 1 << 20
    stats = CudaAllocatorStats(allocated_bytes=4 * mib, peak_allocated_bytes=5 * mib, reserved_bytes=6 * mib,
                               peak_reserved_bytes=6 * mib)
    results = {}
    for capped in (False, True):
        recorder = CudaRecorder(0, torch.device("cuda", 0), 8 * mib, None, 0, read_stats=lambda d: stats,
                                reset_peaks=lambda d: None, sampler=FakeSampler(500 * mib),
                                synchronize=lambda d: None, capped=capped)
        with recorder.phase(0, "forward"):
            pass
        results[capped] = recorder.result("ok")
        recorder.close()
    assert results[False].utilization == 62.5 and results[False].headroom_bytes == -492 * mib
    assert results[True].peak_bytes == 500 * mib  # still the process's memory
    assert (results[True].utilization, results[True].headroom_bytes) == (0.75, 2 * mib)


def test_gradients_freed_before_a_forward_peak_are_not_counted_at_it():
    """Audit N22: the static part was "as of the last attribute()": the native backend attributes
    embedding_grads each backward and zero_grad(set_to_none) frees them before the next forward, so a
    forward peak counted them, `activations` fell short and `other` went negative."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    mib = 1 << 20
    weights, grads = torch.empty(8 * mib, dtype=torch.uint8), torch.empty(6 * mib, dtype=torch.uint8)
    stats = CudaAllocatorStats(allocated_bytes=10 * mib, peak_allocated_bytes=12 * mib, reserved_bytes=12 * mib,
                               peak_reserved_bytes=12 * mib)
    recorder = CudaRecorder(0, torch.device("cpu"), 80 << 30, None, warmup_steps=0, read_stats=lambda d: stats,
                            reset_peaks=lambda d: None, sampler=FakeSampler(12 * mib), synchronize=lambda d: None,
                            is_uvm=lambda tensor: False)
    recorder.attribute({"embedding_weights": [weights], "embedding_grads": [grads]})
    del grads  # zero_grad(set_to_none=True): the gradient is gone before the forward
    with recorder.phase(1, "forward"):
        pass
    breakdown = recorder.result("ok").breakdown
    assert breakdown["embedding_grads"] == 0 and breakdown["embedding_weights"] == 8 * mib
    assert breakdown["activations"] == 4 * mib and breakdown.get("other", 0) >= 0
