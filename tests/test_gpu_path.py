"""The CUDA path, checked on CPU (GPU_AUDIT.md): each test reproduces an audited defect with a fake at the
API boundary or a CPU reproduction, and fails on the code the audit read (commit 12424eb). Here: launching and
planning for CUDA, which GPU a rank and NVML use, what counts as an OOM, the allocator's settings and versions;
the CUDA recorder's own audit tests are in test_cuda_recorder.py."""
from __future__ import annotations

import pytest
import torch

from bench.run.config import RunConfig
from workloads.spec import build_spec


class CollectiveSeen(Exception):
    """Raised by the fake collective once it has seen its arguments."""


def test_native_model_hands_collectives_tensors_on_its_device(monkeypatch):
    """Audit #2: a group made for nccl has only a CUDA backend; every tensor given to a collective must be on
    the model's device (meta stands in for cuda: it is not the CPU)."""
    from workloads.data import SyntheticBatches
    from workloads.native import NativeDLRM

    cfg = RunConfig()
    cfg.workload.num_tables = 2
    spec = build_spec(cfg.workload)
    model = NativeDLRM(spec, rank=0, world_size=2, device=torch.device("meta"), sparse_grads=False)
    seen = []

    def all_to_all_single(output, input, *args, **kwargs):
        seen.append((output.device, input.device))
        raise CollectiveSeen

    monkeypatch.setattr(torch.distributed, "all_to_all_single", all_to_all_single)
    with pytest.raises(CollectiveSeen):
        model(SyntheticBatches(spec, rank=0, world_size=2).batch(0))
    assert seen == [(torch.device("meta"), torch.device("meta"))]


def cuda_config(**hardware) -> RunConfig:
    cfg = RunConfig()
    cfg.hardware.name, cfg.hardware.device, cfg.hardware.ranks_per_node, cfg.hardware.capacity_gib = (
        "h100_80g", "cuda", 2, 80.0)
    for key, value in hardware.items():
        setattr(cfg.hardware, key, value)
    return cfg


@pytest.mark.parametrize("device_memory", [None, 141 * 1024**3])
def test_cuda_launch_has_a_capacity_torchrecs_planner_can_plan_with(device_memory):
    """Audit #1: CUDA capacity 0 reached torchrec's Topology(hbm_cap=0) and planning failed (every torchrec
    run with sharding=auto on CUDA, and every pre-launch prediction). Planning for cuda needs no GPU."""
    from bench.planning.predict import predict_run
    from bench.run.launchspec import resolve_launch

    cfg = cuda_config()
    launch = resolve_launch(cfg, 2, device_memory) if device_memory else resolve_launch(cfg, 2)
    assert launch.capacity_bytes == (device_memory or 80 * 1024**3)
    prediction = predict_run(cfg, launch)
    assert len(prediction["per_rank_peak"]) == 2 and min(prediction["per_rank_peak"]) > 0
    # a CUDA prediction carries the device overheads (caching allocator, CUDA context)
    assert all(b["non_torch"] > 0 and b["allocator_overhead"] > 0 for b in prediction["per_rank_breakdown"])
    assert len(prediction["torchrec_per_rank_peak"]) == 2


def test_memory_fraction_caps_the_capacity_on_launch_and_on_the_rank(monkeypatch):
    """Audit #7: with hardware.memory_fraction the allocator may use only that share of the device, so
    utilization and headroom are against that share (the rank reads its device's real total)."""
    from bench.run.launchspec import resolve_launch
    from bench.run.memory.factory import rank_capacity_bytes

    cfg = cuda_config(memory_fraction=0.25)
    launch = resolve_launch(cfg, 2, 100 * 1024**3)
    assert launch.capacity_bytes == 25 * 1024**3

    class Properties:  # torch.cuda.get_device_properties(device) -> _CudaDeviceProperties(total_memory=...)
        total_memory = 140 * 1024**3

    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: calls.append(device) or Properties())
    assert rank_capacity_bytes(cfg, launch, torch.device("cuda", 1)) == 35 * 1024**3
    assert calls == [torch.device("cuda", 1)]


def test_nvml_is_indexed_through_cuda_visible_devices(monkeypatch):
    """Audit #4: NVML ignores CUDA_VISIBLE_DEVICES; torch's cuda:0 with CUDA_VISIBLE_DEVICES=3,1 is NVML's
    device 3, so the sampler must be opened on 3 (else device-used comes from another GPU)."""
    from bench.run.memory import cuda as cuda_recorder
    from bench.run.memory.nvml import nvml_device_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [nvml_device_index(0), nvml_device_index(1)] == [3, 1]
    opened = []

    class Sampler:
        def __init__(self, device_index, interval_s):
            opened.append(device_index)

        def start(self):
            raise RuntimeError("NVML unavailable: fake")

    monkeypatch.setattr(cuda_recorder, "NvmlSampler", Sampler)
    cuda_recorder.CudaRecorder(0, torch.device("cuda", 1), 1 << 30, None, 0, read_stats=lambda d: None,
                               reset_peaks=lambda d: None)
    assert opened == [1]
    cuda_recorder.CudaRecorder(0, torch.device("cuda", 0), 1 << 30, None, 0, read_stats=lambda d: None,
                               reset_peaks=lambda d: None)
    assert opened == [1, 3]


def test_spawned_nodes_on_one_host_never_share_a_gpu():
    """Audit #6: with launcher.spawn_all_nodes every node's agent runs here and local ranks restart at 0."""
    from bench.run.launchspec import rank_cuda_index, resolve_launch
    from workloads.validate import ConfigError

    cfg = cuda_config(nodes=2)
    cfg.launcher.spawn_all_nodes = True
    launch = resolve_launch(cfg, 4, 80 << 30)
    assert sorted(rank_cuda_index(launch, local, node) for node in (0, 1) for local in (0, 1)) == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="need 4 GPUs, 2 visible"):
        resolve_launch(cfg, 2, 80 << 30)
    cfg.launcher.spawn_all_nodes, cfg.launcher.node_rank = False, 1  # one node's agent per host
    assert rank_cuda_index(resolve_launch(cfg, 2, 80 << 30), 1, 1) == 1


@pytest.mark.parametrize("message, memory", [
    ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.11 GiB total capacity)", True),
    ("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for details), "
     "NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n"
     "Cuda failure 'out of memory'", True),
    ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`", True),
    ("CUDA error: cudaErrorMemoryAllocation: cudaMallocManaged failed", True),
    ("NCCL communicator was aborted on rank 1. Original reason for failure was: Watchdog caught collective "
     "operation timeout", False),
    ("mat1 and mat2 shapes cannot be multiplied (512x13 and 64x128)", False),
])
def test_memory_failures_outside_the_caching_allocator_are_ooms(message, memory):
    """Audit (likely): NCCL buffers, cuBLAS workspaces and fbgemm's UVM tables run out of device memory
    without a torch.OutOfMemoryError; such a rank was recorded as failed, not OOM."""
    from bench.accounting.oom import is_memory_failure

    error_type = torch.distributed.DistBackendError if message.startswith("NCCL") else RuntimeError
    assert is_memory_failure(error_type(message)) is memory
    assert is_memory_failure(torch.OutOfMemoryError("anything"))


def test_allocator_configuration_is_parsed_and_async_backend_refused(monkeypatch):
    """Audit (risk): the allocator settings, which change reserved memory and fragmentation, were not
    recorded, and cudaMallocAsync (whose pool the caching allocator's statistics do not see) ran as if valid."""
    from bench.run.launchspec import resolve_launch, validate_run
    from bench.accounting.allocator_config import allocator_config, parse_allocator_config
    from workloads.validate import ConfigError

    parsed = parse_allocator_config("expandable_segments:True,max_split_size_mb:128,"
                                    "roundup_power2_divisions:[256:1,512:2,>:8],garbage_collection_threshold:0.6")
    assert (parsed["backend"], parsed["expandable_segments"], parsed["max_split_size_mb"]) == ("native", True, 128)
    assert parsed["roundup_power2_divisions"] == "[256:1,512:2,>:8]"
    assert parsed["garbage_collection_threshold"] == 0.6
    assert allocator_config({})["source"] is None and allocator_config({})["backend"] == "native"
    assert allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})["expandable_segments"]
    cfg = cuda_config()
    launch = resolve_launch(cfg, 2, 80 << 30)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync")
    with pytest.raises(ConfigError, match="PYTORCH_CUDA_ALLOC_CONF='backend:cudaMallocAsync'"):
        validate_run(cfg, launch)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    validate_run(cfg, launch)


def test_cuda_versions_come_from_torch_nccl_and_the_driver(monkeypatch):
    from types import SimpleNamespace

    from bench.run.memory.cuda_env import cuda_versions

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "nccl", SimpleNamespace(version=lambda: (2, 27, 3)))
    calls = []
    nvml = SimpleNamespace(nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
                           nvmlSystemGetDriverVersion=lambda: "580.65.06")
    assert cuda_versions(nvml) == {"cuda": "13.0", "nccl": "2.27.3", "nvidia_driver": "580.65.06"}
    assert calls == ["init", "shutdown"]


def test_auto_hardware_warns_when_a_gpu_is_there_but_torch_cannot_use_it(monkeypatch, tmp_path, capsys):
    """Audit (risk): torch's CUDA 13 build on an older driver sees no GPU, and hardware=auto fell back to
    the CPU without a word."""
    from bench.run import launchspec

    (tmp_path / "0000:1b:00.0").mkdir()  # what /proc/driver/nvidia/gpus holds, one folder per GPU
    assert launchspec.gpu_driver_present(str(tmp_path)) and not launchspec.gpu_driver_present(str(tmp_path / "no"))
    monkeypatch.setattr(launchspec, "cuda_device_count", lambda: 0)
    monkeypatch.setattr(launchspec, "gpu_driver_present", lambda: True)
    assert launchspec.visible_cuda_devices(RunConfig()) == (0, None)
    assert "an NVIDIA driver lists GPUs but torch sees none" in capsys.readouterr().err


def test_a_failed_rank_does_not_wait_for_its_device_and_the_baseline_recorder_does(monkeypatch):
    """Audit N5: a rank ended because a peer died has collectives queued behind that peer; a device sync in
    its result() never returned, so it wrote nothing. N14: `record.enabled=false` is the overhead
    baseline, and on a GPU its step times must be synchronized too."""
    import torch

    from bench.run.memory.recorder import StepTimeRecorder

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    for status, expected in (("failed", 2), ("ok", 3)):
        synced.clear()
        recorder = StepTimeRecorder(0, torch.device("cuda", 0), 1 << 30, None, 0)
        for step in range(2):
            with recorder.phase(step, "forward"):
                pass
        result = recorder.result(status)
        # each step's start syncs (two), then the result's own: none for a failed rank
        assert len(synced) == expected, (status, synced)
        assert len(result.step_times_s) == 2


def topology_planned(monkeypatch, overrides, *plan_args) -> dict:
    """The keyword arguments torchrec_adapter.make_sharding_plan(cfg, None, *plan_args) builds its topology
    with (the planner itself never runs)."""
    from bench.planning import torchrec_adapter
    from bench.run.execute import compose_run_config

    cfg = compose_run_config(overrides)
    seen = {}

    class Planned(Exception):
        pass

    def topology(**kwargs):
        seen.update(kwargs)
        raise Planned

    monkeypatch.setattr(torchrec_adapter, "make_topology", topology)
    with pytest.raises(Planned):
        torchrec_adapter.make_sharding_plan(cfg, None, *plan_args, None)
    return seen


def test_torchrecs_host_memory_is_a_node_s_share_per_rank(monkeypatch):
    """Audit N10: torchrec's ddr_cap is per rank; hardware.host_memory_gib is per node. Passed whole, the
    nightly UVM entry (8 ranks, 2048 GiB a node) was planned as if each rank had 2 TiB (16 TiB a node)."""
    from bench.run.execute import compose_run_config

    overrides = ["hardware=h100_80g", "hardware.ranks_per_node=8"]
    seen = topology_planned(monkeypatch, overrides, 16, 8, "cuda", 80 << 30)
    assert seen["ddr_cap_bytes"] == int(compose_run_config(overrides).hardware.host_memory_gib * 1024**3) // 8
    assert seen["local_world_size"] == 8


def test_a_launch_whose_gpu_memory_is_unknown_says_so(capsys):
    """Audit N18: NVML unreadable in the launcher made hardware=auto plan with the preset's 4 GiB, silently."""
    from bench.run.launchspec import resolve_launch

    cfg = cuda_config()
    launch = resolve_launch(cfg, 2, None)
    warning = capsys.readouterr().err
    assert launch.capacity_bytes == int(cfg.hardware.capacity_gib * 1024**3)
    assert "memory could not be read here (NVML)" in warning and f"{cfg.hardware.capacity_gib:g} GiB" in warning
    resolve_launch(cfg, 2, 80 << 30)
    assert capsys.readouterr().err == ""
