"""From a composed config to what a launch needs: resolved devices and ranks, validation, the run files.

`resolve_target` is the one resolver of device type, ranks per node, world size and memory per rank, for
a launch here (`hardware=auto`: CUDA when torch sees a GPU, else CPU with 2 ranks) and for a plan of
hardware that need not be here (`membench plan` / `provision`). It runs once, in the launching process;
the workers read the result from the run directory. Nothing here changes the config it is given:
`resolve_run` returns a resolved copy, `validate_run` only checks.
"""
from __future__ import annotations

import copy
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional, Tuple

import psutil
from omegaconf import OmegaConf

from bench.planning.measured_terms import check_reservation_file
from workloads.uvm_cache import UVM_KERNELS, validate_caching_ratio
from bench.planning.types import PlanTarget, validate_memory_model
from bench.run.launch_types import LaunchSpec
from bench.results.schema import (DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_SIMULATED, has_cuda_allocator,
                                  kernel_device)
from bench.results.store import atomic_write_json, atomic_write_text
from workloads.pipelines import validate_pipeline
from bench.run.config import CPU_MODES, SETUP_STEPS, RunConfig, to_run_config, with_setup_steps
from workloads.spec import build_spec
from workloads.tables_file import resolve_path
from workloads.storage import materialized_bytes
from workloads.units import GIB, MIB
from workloads.validate import (COMPUTE_KERNELS, EMBEDDING_OPTIMIZERS_CPU_FUSED, ConfigError, check_host_memory,
                                validate_sharding_type, validate_workload)

DEFAULT_CPU_RANKS = 2
# A plan for GPUs that are not here: a typical node's GPU count (hardware.ranks_per_node overrides it)
DEFAULT_GPU_RANKS_PER_NODE = 8
# Collectives wait this many watchdog periods before they time out: longer than the watchdog, so a
# stalled rank is always caught by the launcher (status timeout, every rank ended) rather than surfacing
# first as a collective error on its peers (failed), and a dead peer still cannot hang a job that runs
# without the launcher watching.
COLLECTIVE_TIMEOUT_FACTOR = 2


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_cuda_devices(cfg: RunConfig) -> Tuple[int, Optional[int]]:
    """(CUDA devices torch sees, the smallest one's total memory), asked only when the config can use them
    (importing torch costs the launching process about 1.5 s, on every CPU run otherwise)."""
    if cfg.hardware.device == "cpu":
        return 0, None
    from bench.run.memory.nvml import cuda_device_memory_bytes

    count = cuda_device_count()
    if not count and cfg.hardware.device == "auto" and gpu_driver_present():
        print("[membench] warning: an NVIDIA driver lists GPUs but torch sees none (a driver older than torch's "
              "CUDA build needs?); hardware=auto runs on the CPU", file=sys.stderr)
    return count, (cuda_device_memory_bytes(count) if count else None)


def gpu_driver_present(gpus_dir: str = "/proc/driver/nvidia/gpus") -> bool:
    """Does the NVIDIA kernel driver list a GPU (whatever torch makes of it)?"""
    return any(Path(gpus_dir).glob("*"))


def _device_type(cfg: RunConfig, visible_cuda: Optional[int]) -> str:
    device = cfg.hardware.device
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError("hardware.device", device, "use one of auto, cpu, cuda")
    if cfg.hardware.simulate:
        if device != "cuda":
            raise ConfigError("hardware.simulate", True, f"simulates a GPU preset, and hardware={cfg.hardware.name} is "
                                                         f"not one; use e.g. hardware=h100_80g hardware.simulate=true")
        return DEVICE_CUDA_SIMULATED
    if visible_cuda is None:  # planning: `auto` plans for this machine's CPU ranks
        return DEVICE_CUDA if device == "cuda" else DEVICE_CPU
    device_type = device if device != "auto" else (DEVICE_CUDA if visible_cuda else DEVICE_CPU)
    if device_type == DEVICE_CUDA and not visible_cuda:
        raise ConfigError("hardware.device", device, "no CUDA device is visible to torch here; use "
                                                     "hardware=cpu (or hardware=auto), or hardware.simulate=true")
    return device_type


def capacity_bytes(cfg: RunConfig, device_type: str, device_memory_bytes: Optional[int]) -> int:
    """Memory per rank: the emulated capacity on CPU; on CUDA the device's total memory (else the hardware
    profile's: always so on a simulated device), times hardware.memory_fraction when the allocator is capped.
    Never 0: torchrec's planner takes it as the HBM of every device."""
    hw = cfg.hardware
    if not hw.capacity_gib > 0:
        raise ConfigError("hardware.capacity_gib", hw.capacity_gib, "must be > 0 (GiB per rank)")
    if device_type == DEVICE_CPU:
        return int(hw.capacity_gib * GIB)
    total = device_memory_bytes if device_memory_bytes else int(hw.capacity_gib * GIB)
    return int(total * (hw.memory_fraction if hw.memory_fraction is not None else 1.0))


def simulated_allocator_limits(cfg: RunConfig) -> Tuple[int, Optional[int]]:
    """The modelled caching allocator's limits on a simulated device: what cudaMalloc can get (the preset's
    memory less what lives outside the allocator: CUDA context, NCCL buffers, hardware.non_torch_reserve_mib),
    and torch's allowed maximum (hardware.memory_fraction x the memory, as set_per_process_memory_fraction;
    None when uncapped: then garbage_collection_threshold is inert, as on a GPU)."""
    hw = cfg.hardware
    total, reserve = int(hw.capacity_gib * GIB), hw.non_torch_reserve_mib * MIB
    if reserve >= total:
        raise ConfigError("hardware.non_torch_reserve_mib", hw.non_torch_reserve_mib,
                          f"leaves nothing of the {hw.capacity_gib} GiB per rank to the allocator; lower it")
    fraction = hw.memory_fraction
    return total - reserve, (int(total * fraction) if fraction is not None and fraction < 1.0 else None)


def resolve_target(cfg: RunConfig, visible_cuda: Optional[int],
                   device_memory_bytes: Optional[int] = None) -> PlanTarget:
    """Device type, ranks per node, world size and memory per rank. `visible_cuda`: the CUDA devices torch
    sees here, for a launch; None for a plan (then `world_size` / `nodes` may override the hardware's).
    `device_memory_bytes`: the smallest visible device's total memory, when known."""
    hw, planning = cfg.hardware, visible_cuda is None
    device_type = _device_type(cfg, visible_cuda)
    nodes_field, nodes = ("nodes", cfg.nodes) if planning and cfg.nodes is not None else ("hardware.nodes", hw.nodes)
    if nodes < 1:
        raise ConfigError(nodes_field, nodes, "must be >= 1")
    ranks = hw.ranks_per_node
    if ranks is None:
        ranks = (DEFAULT_CPU_RANKS if device_type == DEVICE_CPU else
                 visible_cuda if device_type == DEVICE_CUDA and not planning else DEFAULT_GPU_RANKS_PER_NODE)
    if ranks < 1:
        raise ConfigError("hardware.ranks_per_node", ranks, "must be >= 1")
    if not planning and device_type == DEVICE_CUDA and ranks > visible_cuda:
        raise ConfigError("hardware.ranks_per_node", ranks, f"only {visible_cuda} CUDA device(s) visible; "
                                                            f"use at most {visible_cuda}")
    world_size = cfg.world_size if planning and cfg.world_size is not None else nodes * ranks
    if world_size < 1:
        raise ConfigError("world_size", world_size, "must be >= 1")
    if device_type == DEVICE_CUDA_SIMULATED:
        simulated_allocator_limits(cfg)  # refuses a reserve that leaves the allocator nothing
    return PlanTarget(device_type=device_type, ranks_per_node=ranks, world_size=world_size,
                      capacity_bytes=capacity_bytes(cfg, device_type, device_memory_bytes))


def _dist_backend(cfg: RunConfig, device_type: str) -> str:
    hw = cfg.hardware
    if device_type == DEVICE_CUDA_SIMULATED:
        backend = "gloo"  # the ranks run on CPU, whatever the preset's GPUs use
    else:
        backend = hw.dist_backend if hw.dist_backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ConfigError("hardware.dist_backend", backend, "use one of auto, gloo, nccl")
    if backend == "nccl" and device_type == "cpu":
        raise ConfigError("hardware.dist_backend", backend, "nccl needs CUDA; use gloo (or auto) on CPU")
    if hw.memory_fraction is not None:
        if not has_cuda_allocator(device_type):
            raise ConfigError("hardware.memory_fraction", hw.memory_fraction,
                              "caps the CUDA caching allocator; on CPU lower hardware.capacity_gib instead")
        if not 0 < hw.memory_fraction <= 1:
            raise ConfigError("hardware.memory_fraction", hw.memory_fraction, "use a fraction in (0, 1]")
    return backend


def _local_node_ranks(cfg: RunConfig) -> Tuple[int, ...]:
    """The node agents this machine starts: every node's with spawn_all_nodes, else this node's."""
    hw, launcher = cfg.hardware, cfg.launcher
    if hw.nodes == 1:
        return (0,)
    host, _, port = launcher.rdzv_endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError("launcher.rdzv_endpoint", launcher.rdzv_endpoint,
                          "use host:port of node 0, e.g. node0.cluster:29400")
    node_rank = launcher.node_rank
    if node_rank is None and "SLURM_NODEID" in os.environ:  # one task per node under SLURM
        node_rank = int(os.environ["SLURM_NODEID"])
    if launcher.spawn_all_nodes:
        return tuple(range(hw.nodes))
    if node_rank is None or not 0 <= node_rank < hw.nodes:
        raise ConfigError("launcher.node_rank", node_rank,
                          f"with hardware.nodes={hw.nodes} give this node's index 0..{hw.nodes - 1} (run "
                          f"`membench run ... launcher.node_rank=K` on every node), or "
                          f"launcher.spawn_all_nodes=true to start every node here")
    return (node_rank,)


def resolve_launch(cfg: RunConfig, cuda_devices: int, device_memory_bytes: Optional[int] = None) -> LaunchSpec:
    target = resolve_target(cfg, cuda_devices, device_memory_bytes)
    if target.device_type == DEVICE_CUDA and not device_memory_bytes:  # NVML unreadable in the launcher (N18)
        print(f"[membench] warning: the GPUs' memory could not be read here (NVML); the launcher plans and "
              f"predicts with hardware.capacity_gib={cfg.hardware.capacity_gib:g} GiB per GPU, the ranks record "
              f"against their device's own total", file=sys.stderr)
    backend = _dist_backend(cfg, target.device_type)
    local_nodes = _local_node_ranks(cfg)
    local_ranks = len(local_nodes) * target.ranks_per_node
    if target.device_type == "cuda" and local_ranks > cuda_devices:
        raise ConfigError("launcher.spawn_all_nodes", cfg.launcher.spawn_all_nodes,
                          f"{len(local_nodes)} node(s) x {target.ranks_per_node} ranks on this host need "
                          f"{local_ranks} GPUs, {cuda_devices} visible; one GPU per rank (lower "
                          f"hardware.ranks_per_node, or start each node's agent on its own host)")
    if cfg.timeout_s < 1:
        raise ConfigError("timeout_s", cfg.timeout_s, "must be >= 1 second")
    if cfg.launcher.watchdog_s < 1:
        raise ConfigError("launcher.watchdog_s", cfg.launcher.watchdog_s, "must be >= 1 second")
    return LaunchSpec(device_type=target.device_type, dist_backend=backend, world_size=target.world_size,
                      ranks_per_node=target.ranks_per_node, nodes=cfg.hardware.nodes,
                      capacity_bytes=target.capacity_bytes,
                      collective_timeout_s=COLLECTIVE_TIMEOUT_FACTOR * cfg.launcher.watchdog_s,
                      rdzv_endpoint=cfg.launcher.rdzv_endpoint, local_node_ranks=local_nodes)


def rank_cuda_index(launch: LaunchSpec, local_rank: int, node_rank: int) -> int:
    """The GPU of a rank on this host: its local rank, offset by the nodes before its own when several
    nodes' agents share the host (launcher.spawn_all_nodes), so no two ranks share a GPU."""
    if len(launch.local_node_ranks) == 1:
        return local_rank
    return launch.local_node_ranks.index(node_rank) * launch.ranks_per_node + local_rank


def resolve_run(cfg: RunConfig, launch: LaunchSpec) -> RunConfig:
    """A copy of `cfg` with what the launch decides filled in: workload.global_batch_size -> the per-rank
    batch_size (refused when it does not split evenly over the ranks); warm-up steps raised to cover the
    one-time setup (SETUP_STEPS)."""
    resolved = copy.deepcopy(with_setup_steps(cfg))
    tables_file = cfg.workload.tables_file
    if tables_file and not Path(tables_file).is_absolute():
        try:  # recorded as found, so config.yaml names the file whatever directory the run started in
            resolved.workload.tables_file = str(resolve_path(tables_file))
        except ValueError:
            pass  # validation names the problem
    if resolved.workload.warmup_steps != cfg.workload.warmup_steps:
        print(f"[membench] workload.warmup_steps {cfg.workload.warmup_steps} -> {SETUP_STEPS}: the first "
              f"{SETUP_STEPS} steps build what is built once (optimizer state, DDP's rebuilt gradient buckets), "
              f"so the measured steps start after them", flush=True)
    global_batch = cfg.workload.global_batch_size
    if global_batch is None:
        return resolved
    world_size = launch.world_size
    if global_batch < 1 or global_batch % world_size:
        raise ConfigError("workload.global_batch_size", global_batch,
                          f"must be a positive multiple of the world size ({world_size}); e.g. "
                          f"{max(world_size, global_batch - global_batch % world_size)}")
    resolved.workload.batch_size = global_batch // world_size
    return resolved


def checked_run(cfg: RunConfig, cuda_devices: int, device_memory_bytes: Optional[int] = None,
                available_host_bytes: int | None = None) -> Tuple[RunConfig, LaunchSpec]:
    """(the resolved config, its launch) that `membench run` would start, or ConfigError for the first
    problem; nothing is launched or written."""
    from bench.run.emulation import emulated_launch

    launch = emulated_launch(cfg, resolve_launch(cfg, cuda_devices, device_memory_bytes))
    resolved = resolve_run(cfg, launch)
    validate_run(resolved, launch, available_host_bytes)
    return resolved, launch


def validate_run(cfg: RunConfig, launch: LaunchSpec, available_host_bytes: int | None = None) -> None:
    """Raise ConfigError for the first problem of a resolved config; nothing has been launched or written."""
    if cfg.mode != "train":
        raise ConfigError("mode", cfg.mode, "`membench run` trains; use `membench plan` or `membench provision`")
    _validate_backend(cfg)
    if cfg.record.cpu_mode not in CPU_MODES:
        raise ConfigError("record.cpu_mode", cfg.record.cpu_mode, f"one of {', '.join(CPU_MODES)}")
    if cfg.record.cpu_mode == "memtracker" and launch.device_type != DEVICE_CPU:
        raise ConfigError("record.cpu_mode", cfg.record.cpu_mode,
                          "PyTorch's MemTracker cross-check runs on CPU ranks only (hardware=cpu)")
    if cfg.record.nvml_interval_ms < 1:
        raise ConfigError("record.nvml_interval_ms", cfg.record.nvml_interval_ms, "must be >= 1")
    validate_workload(cfg.workload)
    validate_memory_model(cfg.plan.memory_model)
    check_reservation_file(cfg.plan, launch.device_type)
    validate_pipeline(cfg.pipeline.name, cfg.model.backend, kernel_device(launch.device_type))
    _validate_sharding(cfg, kernel_device(launch.device_type))
    _validate_materialized(cfg, launch, available_host_bytes)
    if has_cuda_allocator(launch.device_type):
        _validate_allocator(cfg)


def _validate_allocator(cfg: RunConfig, environ=None) -> None:
    from bench.accounting.allocator_config import (ALLOCATOR_OPTIONS, ASYNC_BACKEND, allocator_conf_text,
                                                   allocator_config)
    from bench.accounting.caching_allocator import AllocatorSettings

    settings = cfg.allocator
    for name in ALLOCATOR_OPTIONS:  # each run setting checked by the model's own rules (torch's), alone
        value = getattr(settings, name)
        try:
            AllocatorSettings(**{name: value})
        except ValueError as err:
            raise ConfigError(f"allocator.{name}", value, f"{err}; fix or unset it") from None
    allocator = allocator_config(environ, settings)
    if allocator["backend"] == ASYNC_BACKEND:
        raise ConfigError(allocator["source"], allocator["raw"],
                          f"backend:{ASYNC_BACKEND} hands allocation to the driver, and the caching allocator's "
                          f"statistics membench reads stay zero; remove backend:{ASYNC_BACKEND} (the native "
                          f"caching allocator is the default)")
    try:  # what the environment adds, checked as torch checks it when the ranks start
        AllocatorSettings.parse(allocator_conf_text(settings, environ))
    except ValueError as err:
        raise ConfigError(allocator["source"] or "allocator", allocator["raw"], f"{err}; fix or unset it") from None


def _validate_backend(cfg: RunConfig) -> None:
    if cfg.model.backend not in ("torchrec", "native"):
        raise ConfigError("model.backend", cfg.model.backend, "use torchrec or native")
    if cfg.model.sparse_grads and cfg.model.backend != "native":
        raise ConfigError("model.sparse_grads", True, "sparse embedding gradients exist on the native backend "
                                                      "only (torchrec fuses the optimizer into the backward)")
    sharding = cfg.sharding
    if cfg.model.backend == "native":
        for field, value in [("sharding.type", sharding.type), *((f"sharding.per_table.{t}", v)
                                                                  for t, v in sharding.per_table.items())]:
            if value not in ("auto", "table_wise"):
                raise ConfigError(field, value, "the native backend places tables table_wise only; use "
                                                "sharding=auto or sharding=table_wise (or model.backend=torchrec)")
        if sharding.compute_kernel != "auto":
            raise ConfigError("sharding.compute_kernel", sharding.compute_kernel,
                              "the native backend has no fbgemm kernels; leave it auto")


def _validate_sharding(cfg: RunConfig, device_type: str) -> None:
    sharding = cfg.sharding
    validate_sharding_type("sharding.type", sharding.type, device_type, allow_auto=True)
    if cfg.workload.tables_file:
        names = [t.name for t in build_spec(cfg.workload).tables]
        listed = ", ".join(names[:6]) + (f", ... ({len(names)} tables)" if len(names) > 6 else "")
    else:
        names = [f"t{i}" for i in range(cfg.workload.num_tables)]
        listed = f"t0..t{cfg.workload.num_tables - 1}"
    for table, sharding_type in sharding.per_table.items():
        if table not in names:
            raise ConfigError(f"sharding.per_table.{table}", sharding_type, f"no such table; tables are {listed}")
        validate_sharding_type(f"sharding.per_table.{table}", sharding_type, device_type, allow_auto=False)
    if sharding.column_shard_dim is not None and sharding.column_shard_dim < 1:
        raise ConfigError("sharding.column_shard_dim", sharding.column_shard_dim, "must be >= 1 (or null)")
    if sharding.compute_kernel not in COMPUTE_KERNELS:
        raise ConfigError("sharding.compute_kernel", sharding.compute_kernel,
                          f"use one of {', '.join(COMPUTE_KERNELS)}")
    if sharding.compute_kernel in UVM_KERNELS and device_type != "cuda":
        raise ConfigError("sharding.compute_kernel", sharding.compute_kernel,
                          "UVM kernels need CUDA ranks to run (membench plan takes them anywhere); on CPU use "
                          "auto, fused or dense")
    validate_caching_ratio(sharding.caching_ratio)
    all_data_parallel = {sharding.type, *sharding.per_table.values()} == {"data_parallel"}
    if (device_type == "cpu" and not all_data_parallel and cfg.model.backend == "torchrec"
            and cfg.workload.embedding_optimizer not in EMBEDDING_OPTIMIZERS_CPU_FUSED):
        raise ConfigError("workload.embedding_optimizer", cfg.workload.embedding_optimizer,
                          f"fbgemm's CPU kernels fuse only {' / '.join(EMBEDDING_OPTIMIZERS_CPU_FUSED)} into "
                          f"the backward; use one of those on CPU (or sharding=data_parallel)")


def _validate_materialized(cfg: RunConfig, launch: LaunchSpec, available_host_bytes: Optional[int]) -> None:
    spec = build_spec(cfg.workload)
    if spec.is_plan_only:
        raise ConfigError("workload.materialize", "plan_only",
                          f"workload {cfg.workload.name!r} is virtual ({spec.virtual_bytes / 1e12:.1f} TB of "
                          f"tables) and cannot be trained on this machine; use `membench plan "
                          f"workload={cfg.workload.name} hardware=h100_80g world_size=512`, or train a shrunk "
                          f"copy with workload.materialize=scaled")
    if kernel_device(launch.device_type) == DEVICE_CPU and cfg.emulate.world_size is None:  # tables in host RAM
        types = {cfg.sharding.type, *cfg.sharding.per_table.values()}
        replicas = launch.world_size if "data_parallel" in types else 1
        needed = replicas * sum(materialized_bytes(t, cfg.workload.embedding_optimizer) for t in spec.tables)
        available = available_host_bytes if available_host_bytes is not None else psutil.virtual_memory().available
        check_host_memory(needed, available, "workload.materialize", cfg.workload.materialize)


def write_run_config(run_dir: Path, cfg: RunConfig, launch: LaunchSpec) -> None:
    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    atomic_write_json(run_dir / "launch.json", asdict(launch))


def load_run_config(run_dir: Path) -> Tuple[RunConfig, LaunchSpec]:
    cfg = to_run_config(OmegaConf.load(Path(run_dir) / "config.yaml"))
    data = json.loads((Path(run_dir) / "launch.json").read_text())
    data["local_node_ranks"] = tuple(data.get("local_node_ranks", (0,)))
    launch = LaunchSpec(**data)
    return cfg, launch
