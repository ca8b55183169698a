"""From a composed Hydra config to what a launch needs: typed config, resolved devices, validation.

`hardware=auto` is resolved here (CUDA when torch sees a GPU, else CPU with 2 ranks), once, in the
launching process; the workers read the result from the run directory.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Tuple

import psutil
from omegaconf import OmegaConf

from bench.config import RunConfig
from workloads.tables import GIB, build_spec
from workloads.validate import (COMPUTE_KERNELS, EMBEDDING_OPTIMIZERS_CPU_FUSED, ConfigError, check_host_memory, validate_sharding_type,
                                validate_workload)

DEFAULT_CPU_RANKS = 2
# Collectives wait this many watchdog periods before they time out: longer than the watchdog, so a
# stalled rank is always caught by the launcher (status timeout, every rank ended) rather than surfacing
# first as a collective error on its peers (failed), and a dead peer still cannot hang a job that runs
# without the launcher watching.
COLLECTIVE_TIMEOUT_FACTOR = 2
# Rough multiplier of table bytes for optimizer state, only for the "fits in host RAM" check
OPTIMIZER_STATE_FACTOR = {"sgd": 1.0, "rowwise_adagrad": 1.05, "adam": 3.0}
# Fields that change what is measured (run_id, output paths and timeouts do not)
HASHED_SECTIONS = ("workload", "hardware", "sharding", "model", "record")


@dataclass
class LaunchSpec:
    device_type: str  # cpu | cuda
    dist_backend: str  # gloo | nccl
    world_size: int
    ranks_per_node: int
    nodes: int
    # per rank; 0 on cuda means "the device's total memory", read by the worker
    capacity_bytes: int
    collective_timeout_s: int
    # multi-node: where the c10d rendezvous lives, and which node agents this machine starts
    rdzv_endpoint: str = ""
    local_node_ranks: Tuple[int, ...] = (0,)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def to_run_config(cfg) -> RunConfig:
    """DictConfig (already type-checked by Hydra) -> RunConfig dataclass."""
    merged = OmegaConf.merge(OmegaConf.structured(RunConfig), cfg)
    return OmegaConf.to_object(merged)


def config_hash(cfg: RunConfig) -> str:
    payload = {name: OmegaConf.to_container(OmegaConf.structured(getattr(cfg, name)))
               for name in HASHED_SECTIONS}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_cuda_devices(cfg: RunConfig) -> int:
    """CUDA devices torch sees, asked only when the config can use them (importing torch costs the
    launching process about 1.5 s, on every CPU run otherwise)."""
    return 0 if cfg.hardware.device == "cpu" else cuda_device_count()


def resolve_launch(cfg: RunConfig, cuda_devices: int) -> LaunchSpec:
    hw = cfg.hardware
    if hw.device not in ("auto", "cpu", "cuda"):
        raise ConfigError("hardware.device", hw.device, "use one of auto, cpu, cuda")
    device_type = hw.device if hw.device != "auto" else ("cuda" if cuda_devices else "cpu")
    if device_type == "cuda" and not cuda_devices:
        raise ConfigError("hardware.device", hw.device, "no CUDA device is visible to torch here; use "
                                                        "hardware=cpu (or hardware=auto)")
    if hw.nodes < 1:
        raise ConfigError("hardware.nodes", hw.nodes, "must be >= 1")
    ranks = hw.ranks_per_node
    if ranks is None:
        ranks = cuda_devices if device_type == "cuda" else DEFAULT_CPU_RANKS
    if ranks < 1:
        raise ConfigError("hardware.ranks_per_node", ranks, "must be >= 1")
    if device_type == "cuda" and ranks > cuda_devices:
        raise ConfigError("hardware.ranks_per_node", ranks, f"only {cuda_devices} CUDA device(s) visible; "
                                                            f"use at most {cuda_devices}")
    backend = hw.dist_backend if hw.dist_backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
    if backend not in ("gloo", "nccl"):
        raise ConfigError("hardware.dist_backend", backend, "use one of auto, gloo, nccl")
    if backend == "nccl" and device_type == "cpu":
        raise ConfigError("hardware.dist_backend", backend, "nccl needs CUDA; use gloo (or auto) on CPU")
    if not hw.capacity_gib > 0:
        raise ConfigError("hardware.capacity_gib", hw.capacity_gib, "must be > 0 (GiB per rank)")
    if hw.memory_fraction is not None:
        if device_type != "cuda":
            raise ConfigError("hardware.memory_fraction", hw.memory_fraction,
                              "caps the CUDA caching allocator; on CPU lower hardware.capacity_gib instead")
        if not 0 < hw.memory_fraction <= 1:
            raise ConfigError("hardware.memory_fraction", hw.memory_fraction, "use a fraction in (0, 1]")
    capacity = int(hw.capacity_gib * GIB) if device_type == "cpu" else 0
    if cfg.timeout_s < 1:
        raise ConfigError("timeout_s", cfg.timeout_s, "must be >= 1 second")
    launcher = cfg.launcher
    if launcher.watchdog_s < 1:
        raise ConfigError("launcher.watchdog_s", launcher.watchdog_s, "must be >= 1 second")
    local_nodes: Tuple[int, ...] = (0,)
    if hw.nodes > 1:
        host, _, port = launcher.rdzv_endpoint.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError("launcher.rdzv_endpoint", launcher.rdzv_endpoint,
                              "use host:port of node 0, e.g. node0.cluster:29400")
        node_rank = launcher.node_rank
        if node_rank is None and "SLURM_NODEID" in os.environ:  # one task per node under SLURM
            node_rank = int(os.environ["SLURM_NODEID"])
        if launcher.spawn_all_nodes:
            local_nodes = tuple(range(hw.nodes))
        elif node_rank is None or not 0 <= node_rank < hw.nodes:
            raise ConfigError("launcher.node_rank", node_rank,
                              f"with hardware.nodes={hw.nodes} give this node's index 0..{hw.nodes - 1} (run "
                              f"`membench run ... launcher.node_rank=K` on every node), or "
                              f"launcher.spawn_all_nodes=true to start every node here")
        else:
            local_nodes = (node_rank,)
    return LaunchSpec(device_type=device_type, dist_backend=backend, world_size=ranks * hw.nodes,
                      ranks_per_node=ranks, nodes=hw.nodes, capacity_bytes=capacity,
                      collective_timeout_s=COLLECTIVE_TIMEOUT_FACTOR * launcher.watchdog_s,
                      rdzv_endpoint=launcher.rdzv_endpoint,
                      local_node_ranks=local_nodes)


def apply_global_batch(cfg: RunConfig, world_size: int) -> None:
    """workload.global_batch_size -> per-rank batch_size; refuses batches that do not split evenly."""
    global_batch = cfg.workload.global_batch_size
    if global_batch is None:
        return
    if global_batch < 1 or global_batch % world_size:
        raise ConfigError("workload.global_batch_size", global_batch,
                          f"must be a positive multiple of the world size ({world_size}); e.g. "
                          f"{max(world_size, global_batch - global_batch % world_size)}")
    cfg.workload.batch_size = global_batch // world_size


def validate_run(cfg: RunConfig, launch: LaunchSpec, available_host_bytes: int | None = None) -> None:
    """Raise ConfigError for the first problem; nothing has been launched or written yet."""
    if cfg.mode != "train":
        raise ConfigError("mode", cfg.mode, "`membench run` trains; use `membench plan` or `membench provision`")
    if cfg.model.backend not in ("torchrec", "native"):
        raise ConfigError("model.backend", cfg.model.backend, "use torchrec or native")
    if cfg.model.sparse_grads and cfg.model.backend != "native":
        raise ConfigError("model.sparse_grads", True, "sparse embedding gradients exist on the native backend "
                                                      "only (torchrec fuses the optimizer into the backward)")
    if cfg.record.cpu_mode != "exact":
        raise ConfigError("record.cpu_mode", cfg.record.cpu_mode, "only `exact` is available")
    if cfg.record.nvml_interval_ms < 1:
        raise ConfigError("record.nvml_interval_ms", cfg.record.nvml_interval_ms, "must be >= 1")
    apply_global_batch(cfg, launch.world_size)
    validate_workload(cfg.workload)
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
    validate_sharding_type("sharding.type", sharding.type, launch.device_type, allow_auto=True)
    names = {f"t{i}" for i in range(cfg.workload.num_tables)}
    for table, sharding_type in sharding.per_table.items():
        if table not in names:
            raise ConfigError(f"sharding.per_table.{table}", sharding_type,
                              f"no such table; tables are t0..t{cfg.workload.num_tables - 1}")
        validate_sharding_type(f"sharding.per_table.{table}", sharding_type, launch.device_type,
                               allow_auto=False)
    if sharding.compute_kernel not in COMPUTE_KERNELS:
        raise ConfigError("sharding.compute_kernel", sharding.compute_kernel,
                          f"use one of {', '.join(COMPUTE_KERNELS)}")
    if sharding.compute_kernel == "fused_uvm_caching" and launch.device_type != "cuda":
        raise ConfigError("sharding.compute_kernel", sharding.compute_kernel,
                          "UVM caching needs CUDA; on CPU use auto, fused or dense")
    all_data_parallel = {sharding.type, *sharding.per_table.values()} == {"data_parallel"}
    if (launch.device_type == "cpu" and not all_data_parallel and cfg.model.backend == "torchrec"
            and cfg.workload.embedding_optimizer not in EMBEDDING_OPTIMIZERS_CPU_FUSED):
        raise ConfigError("workload.embedding_optimizer", cfg.workload.embedding_optimizer,
                          f"fbgemm's CPU kernels fuse only {' / '.join(EMBEDDING_OPTIMIZERS_CPU_FUSED)} into "
                          f"the backward; use one of those on CPU (or sharding=data_parallel)")
    spec = build_spec(cfg.workload)
    if spec.is_plan_only:
        raise ConfigError("workload.materialize", "plan_only",
                          f"workload {cfg.workload.name!r} is virtual ({spec.virtual_bytes / 1e12:.1f} TB of "
                          f"tables) and cannot be trained on this machine; use `membench plan "
                          f"workload={cfg.workload.name} hardware=h100_80g world_size=512`, or train a shrunk "
                          f"copy with workload.materialize=scaled")
    if launch.device_type == "cpu":
        types = {sharding.type, *sharding.per_table.values()}
        replicas = launch.world_size if "data_parallel" in types else 1
        check_host_memory(spec.physical_bytes, replicas,
                          OPTIMIZER_STATE_FACTOR[cfg.workload.embedding_optimizer],
                          available_host_bytes if available_host_bytes is not None
                          else psutil.virtual_memory().available,
                          "workload.materialize", cfg.workload.materialize)


def write_run_config(run_dir: Path, cfg: RunConfig, launch: LaunchSpec) -> None:
    from bench.results import atomic_write_json, atomic_write_text

    atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(OmegaConf.structured(cfg)))
    atomic_write_json(run_dir / "launch.json", asdict(launch))


def load_run_config(run_dir: Path) -> Tuple[RunConfig, LaunchSpec]:
    cfg = to_run_config(OmegaConf.load(Path(run_dir) / "config.yaml"))
    data = json.loads((Path(run_dir) / "launch.json").read_text())
    data["local_node_ranks"] = tuple(data.get("local_node_ranks", (0,)))
    launch = LaunchSpec(**data)
    return cfg, launch
