"""A GPU preset simulated on CPU (`hardware.simulate=true`): the live-tensor stream replayed into the caching
allocator model, the CUDA recorder reading it, OOMs the model refuses, allocator settings as a sweep axis,
predictions of reserved memory, and memory_viz snapshots. (A whole run that ends OOM after the model's retry:
tests/test_gpu_check.py, whose --simulate flow makes one.)"""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from bench.accounting.caching_allocator import AllocatorSettings, CachingAllocatorModel
from bench.accounting.caching_allocator.replay import AllocationStream, replay
from bench.accounting.live_tensors import LiveTensorTracker
from workloads.units import GIB, MIB, UNBOUNDED_BYTES

SIMULATED = ("hardware=h100_80g", "hardware.simulate=true", "hardware.ranks_per_node=2")
VOLATILE = {"run_id", "started_at", "wall_s", "step_times_s", "step_time_ms_p50", "samples_per_s", "sweep_id", "plan_time_s", "snapshot_path"}


def model_tracker(settings=AllocatorSettings(), capacity_bytes: int = 1 << 40):
    model = CachingAllocatorModel(capacity_bytes, settings)
    return model, LiveTensorTracker(torch.device("cpu"), UNBOUNDED_BYTES, rank=0, allocator=model)


def train_varying(tracker, sizes_mib=(30, 32, 34, 36)) -> None:
    """A layer whose batch grows step to step (blocks over 10 MiB, each step a size the last did not free)."""
    weight = torch.ones(1024, 256, requires_grad=True)
    with tracker:
        for size in sizes_mib:
            batch = size * MIB // (1024 * 4)
            x = torch.ones(batch, 1024)
            loss = (x @ weight).square().mean()
            loss.backward()
            del x, loss
        weight.grad = None


def test_every_storage_reaches_the_model_and_leaves_it():
    model, tracker = model_tracker()
    train_varying(tracker)
    stats = model.memory_stats()
    assert stats["allocated_bytes.all.current"] == tracker.live_bytes == 0
    # the model rounds each request up to 512 bytes
    assert tracker.peak_bytes <= stats["allocated_bytes.all.peak"] <= tracker.peak_bytes + 512 * stats[
        "allocation.all.peak"]
    assert tracker.peak_bytes > 30 * MIB
    assert stats["reserved_bytes.all.peak"] >= stats["allocated_bytes.all.peak"]
    assert stats["allocation.all.allocated"] == stats["allocation.all.freed"] > 20


def test_expandable_segments_lowers_reserved_when_block_sizes_vary_step_to_step():
    reserved = {}
    for expandable in (False, True):
        model, tracker = model_tracker(AllocatorSettings(expandable_segments=expandable))
        train_varying(tracker)
        reserved[expandable] = model.memory_stats()["reserved_bytes.all.peak"]
    # without: each step's larger batch takes a new segment while the smaller cached ones stay reserved;
    # with: one segment grows by 20 MiB pages and is reused
    assert reserved[True] < 0.6 * reserved[False], reserved


def test_a_free_deferred_to_the_phase_end_never_collides_with_a_reused_address():
    """A free that arrives from another thread is applied at the phase end, while a new storage may already
    reuse its address (cdata): the model keys allocations by a count, not by address (keyed by address it
    raised KeyError). The drop is made on this thread, seen as another's, so that malloc reuses the address."""
    model, tracker = model_tracker()
    reused = tries = 0
    with tracker:
        owner = tracker._owner_thread
        # until the address has come back a few times: malloc need not reuse it at once (under load it
        # once did not in 10 tries)
        while reused < 3 and tries < 1000:
            tries += 1
            sent = torch.ones(1000)
            cdata = sent.untyped_storage()._cdata
            tracker._owner_thread = None  # the next free looks like a backend thread's
            del sent
            tracker._owner_thread = owner
            fresh = torch.ones(1000)
            reused += fresh.untyped_storage()._cdata == cdata
            del fresh
        tracker.flush_deferred()
    assert reused > 0  # the address did come back while the free was pending
    assert model.memory_stats()["allocated_bytes.all.current"] == tracker.live_bytes == 0
    assert tracker.late_frees == tries


def test_the_model_refuses_with_a_cuda_style_oom_at_that_op():
    from bench.accounting.oom import OomEvent

    model, tracker = model_tracker(capacity_bytes=18 * MIB)
    with tracker, pytest.raises(torch.OutOfMemoryError) as raised:
        torch.empty(int(9.5 * MIB), dtype=torch.uint8)  # a 20 MiB segment (request < 10 MiB) on an 18 MiB device
    event = OomEvent.from_exception(raised.value, 0, 0, "forward")
    assert event.requested_bytes == int(9.5 * MIB)
    assert "CUDA out of memory on the simulated device" in event.message and "1 allocation retries" in event.message
    assert model.memory_stats()["num_ooms"] == 1 and model.memory_stats()["num_alloc_retries"] == 1


def test_allocation_stream_replays_to_the_same_peaks_and_round_trips_json():
    stream = AllocationStream()
    _, tracker = model_tracker()
    tracker.allocator = stream
    train_varying(tracker)
    model, tracker = model_tracker()
    train_varying(tracker)
    stats = model.memory_stats()
    again = replay(AllocationStream.from_json(json.loads(json.dumps(stream.to_json()))).events, AllocatorSettings())
    assert (again.peak_allocated_bytes, again.peak_reserved_bytes, again.peak_inactive_split_bytes) == (
        stats["allocated_bytes.all.peak"], stats["reserved_bytes.all.peak"], stats["inactive_split_bytes.all.peak"])


def test_simulated_limits_follow_the_preset_reserve_and_memory_fraction():
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import resolve_launch, simulated_allocator_limits, validate_run
    from workloads.validate import ConfigError

    cfg = compose_run_config(list(SIMULATED))
    assert simulated_allocator_limits(cfg) == (80 * GIB - 1024 * MIB, None)
    launch = resolve_launch(cfg, 0)
    assert launch.device_type == "cuda_simulated" and launch.capacity_bytes == 80 * GIB
    assert launch.dist_backend == "gloo"
    capped = compose_run_config([*SIMULATED, "hardware.memory_fraction=0.5"])
    assert simulated_allocator_limits(capped) == (80 * GIB - 1024 * MIB, 40 * GIB)
    with pytest.raises(ConfigError, match="hardware.non_torch_reserve_mib"):
        simulated_allocator_limits(compose_run_config([*SIMULATED, "hardware.non_torch_reserve_mib=90000"]))
    with pytest.raises(ConfigError, match="hardware.simulate"):
        resolve_launch(compose_run_config(["hardware=cpu", "hardware.simulate=true"]), 0)
    for override, field in (("allocator.max_split_size_mb=10", "allocator.max_split_size_mb"),
                            ("allocator.garbage_collection_threshold=1.5", "allocator.garbage_collection_threshold")):
        bad = compose_run_config([*SIMULATED, override])
        with pytest.raises(ConfigError, match=field):
            validate_run(bad, resolve_launch(bad, 0))


@pytest.mark.parametrize("backend", ["torchrec", "native"])
def test_plan_predicts_the_allocator_overhead_from_the_model(backend):
    """Both backends' predictions on a GPU: the caching allocator model's overhead and the memory outside
    torch (the native one once had neither and read -77 % against a simulated H100)."""
    from bench.planning.predict import try_predict_run
    from bench.run.execute import compose_run_config
    from bench.run.launchspec import resolve_launch

    overheads = {}
    for expandable in ("false", "true"):
        cfg = compose_run_config([*SIMULATED, f"model={backend}", f"allocator.expandable_segments={expandable}"])
        prediction = try_predict_run(cfg, resolve_launch(cfg, 0))
        breakdown = prediction["per_rank_breakdown"][0]
        assert breakdown["non_torch"] == 1024 * MIB
        overheads[expandable] = breakdown["allocator_overhead"]
        tensors = sum(v for k, v in breakdown.items() if k not in ("allocator_overhead", "non_torch"))
        # the model's rounding of this rank's stream, not a fixed share of the tensors
        assert overheads[expandable] != int(tensors * 0.05)
        assert prediction["per_rank_peak"][0] == sum(breakdown.values())
    assert overheads["false"] > 0 and overheads["true"] >= 0
    cpu = compose_run_config(["hardware=cpu", f"model={backend}"])
    assert "allocator_overhead" not in try_predict_run(cpu, resolve_launch(cpu, 0))["per_rank_breakdown"][0]


def _stable(value):
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


@pytest.mark.slow
def test_simulated_gpu_run_end_to_end_byte_identical_with_settings_as_an_axis(cli, tmp_path, capsys):
    from torch.cuda import _memory_viz

    from bench.report.app import main as report_main

    # one rank per point keeps the three launches cheap; two simulated ranks with their collectives run in
    # tests/test_gpu_check.py (the torchrec run of --simulate)
    run = cli("-m", *SIMULATED, "hardware.ranks_per_node=1", "workload.steps=2", "record.snapshot=true",
              "allocator.expandable_segments=false,false,true")
    assert run.returncode == 0, run.output
    first, second, expandable = run.summaries()
    for summary in (first, expandable):
        assert summary["status"] == "ok" and summary["device_type"] == "cuda_simulated"
        for rank in summary["per_rank"]:
            assert rank["recorder"] == "cuda_simulated"
            assert rank["peak_reserved_bytes"] >= rank["peak_allocated_bytes"] > 0
            assert rank["breakdown"]["allocator_overhead"] > 0 and rank["breakdown"]["non_torch"] == 1024 * MIB
            assert rank["peak_device_used_bytes"] == rank["peak_bytes"]
            assert rank["allocator"]["num_alloc_retries"] == 0
        assert all(b["allocator_overhead"] > 0 for b in summary["estimate"]["per_rank_breakdown"])
    assert expandable["allocator"]["expandable_segments"] is True and first["allocator"]["expandable_segments"] is False
    # deterministic: the same config gives the same bytes, timelines included (but for the clock column)
    assert _stable(first) == _stable(second)
    dirs = run.run_dirs()
    for rank in (0,):
        rows = [[line.split(",", 1)[1] for line in (d / f"timeline_rank{rank}.csv").read_text().splitlines()]
                for d in dirs[:2]]
        assert rows[0] == rows[1] and len(rows[0]) > 8
    # the model's snapshot opens in torch's memory_viz tooling
    snapshot = pickle.loads((dirs[0] / "snapshot_rank0.pickle").read_bytes())
    assert snapshot["segments"] and "device_traces" in snapshot
    assert "segments: " in _memory_viz.segsum(snapshot) and _memory_viz.trace(snapshot)
    # the report's allocator figure, one bar pair per setting
    assert report_main([str(dirs[0].parent), "--out", str(tmp_path / "report"), "--format", "png"]) == 0
    markdown = (tmp_path / "report" / "report.md").read_text()
    section = markdown.split("## 8.")[1]
    assert "fig8_allocator.png" in section and "expandable_segments=True" in section


def test_allocator_settings_reach_real_cuda_ranks_through_the_environment(monkeypatch):
    """On a GPU the same allocator.* axis is PYTORCH_CUDA_ALLOC_CONF for the ranks, over the environment's
    options; an option torch would refuse stops the run before launch, naming where it came from."""
    from bench.run.execute import compose_run_config
    from bench.run.launch import worker_env
    from bench.run.launchspec import resolve_launch, validate_run
    from workloads.validate import ConfigError

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "roundup_power2_divisions:4")
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    cfg = compose_run_config(["hardware=h100_80g", "hardware.ranks_per_node=2", "allocator.expandable_segments=true",
                              "allocator.max_split_size_mb=256"])
    launch = resolve_launch(cfg, 2, 80 * GIB)
    env = worker_env(launch, cfg)
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "roundup_power2_divisions:4,expandable_segments:True,max_split_size_mb:256"
    assert "PYTORCH_ALLOC_CONF" not in env
    assert AllocatorSettings.parse(env["PYTORCH_CUDA_ALLOC_CONF"]).expandable_segments
    simulated = compose_run_config([*SIMULATED, "allocator.expandable_segments=true"])
    assert "PYTORCH_CUDA_ALLOC_CONF" not in worker_env(resolve_launch(simulated, 0), simulated)  # the model's
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:10")
    plain = compose_run_config(["hardware=h100_80g", "hardware.ranks_per_node=2"])
    with pytest.raises(ConfigError, match="PYTORCH_ALLOC_CONF"):
        validate_run(plain, resolve_launch(plain, 2, 80 * GIB))
