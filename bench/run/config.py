"""Typed run configuration (Hydra structured configs) and its registration with the ConfigStore.

`conf/config.yaml` extends `membench_run`, so every group file and command-line override is checked
against these dataclasses by Hydra itself (unknown key or wrong type -> refused by name).
"""
from __future__ import annotations

import copy
import functools
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from workloads.config import WorkloadConfig

# Hydra's config tree: conf/config.yaml and its groups (workload, hardware, sharding, ...)
CONF_DIR = str(Path(__file__).resolve().parent.parent.parent / "conf")
# Fields that change what is measured (run_id, output paths and timeouts do not)
HASHED_SECTIONS = ("workload", "hardware", "sharding", "model", "record", "allocator")


@dataclass
class HardwareConfig:
    name: str = "auto"
    # cpu | cuda | auto (cuda when torch sees a GPU, else cpu)
    device: str = "auto"
    # ranks (GPUs, or CPU processes) per node; null = all visible GPUs on cuda, 2 on cpu
    ranks_per_node: Optional[int] = None
    nodes: int = 1
    # Memory per rank. CPU: the emulated capacity that live tensors may not exceed (an allocation
    # beyond it raises torch.OutOfMemoryError). GPU: the profile's HBM; NVML's total wins at run time.
    capacity_gib: float = 4.0
    # Host memory per node, for torchrec's planner (UVM / DDR): each rank of the node plans with its share
    host_memory_gib: float = 16.0
    # gloo | nccl | auto (nccl on cuda, gloo on cpu)
    dist_backend: str = "auto"
    # CUDA: cap each rank's caching allocator at this share of the device
    # (torch.cuda.set_per_process_memory_fraction), e.g. to provoke an OOM on purpose
    memory_fraction: Optional[float] = None
    # A GPU preset simulated on CPU: ranks train on CPU (gloo) and PyTorch's caching allocator is modelled
    # (bench.accounting.caching_allocator), so reserved memory, fragmentation and OOMs are a GPU's
    simulate: bool = False
    # Simulated device: memory outside the caching allocator, per rank (the CUDA context with its kernels,
    # NCCL's buffers), taken off capacity_gib before the allocator may use it
    non_torch_reserve_mib: int = 1024


@dataclass
class AllocatorConfig:
    """PyTorch's CUDA caching-allocator settings for the ranks (null: as PYTORCH_CUDA_ALLOC_CONF says, else
    torch's default). Real CUDA: passed in PYTORCH_CUDA_ALLOC_CONF; simulated: given to the model."""
    expandable_segments: Optional[bool] = None
    max_split_size_mb: Optional[int] = None
    garbage_collection_threshold: Optional[float] = None
    roundup_power2_divisions: Optional[int] = None
    large_segment_size_mb: Optional[int] = None  # torch >= 2.13 (older torch refuses the key)


@dataclass
class ShardingConfig:
    # auto (torchrec planner chooses) | data_parallel | table_wise | column_wise | table_column_wise |
    # row_wise | table_row_wise | grid_shard (the last three need CUDA)
    type: str = "auto"
    # Per-table overrides, e.g. {t0: column_wise}
    per_table: Dict[str, str] = field(default_factory=dict)
    # fused (HBM) | dense | fused_uvm (tables in host memory the GPU reads) | fused_uvm_caching (the same with an
    # HBM cache); UVM kernels need CUDA ranks to run (plan mode takes them anywhere); auto lets the planner pick
    compute_kernel: str = "auto"
    # fused_uvm_caching: the share of each table's rows its HBM cache holds (torchrec's cache load factor, in (0, 1);
    # null: torchrec's default, 0.2)
    caching_ratio: Optional[float] = None
    # column_wise / table_column_wise: shards at least this many columns wide (torchrec's planner's
    # `min_partition`; null: torchrec's own, 128, so a 128-wide table is one shard)
    column_shard_dim: Optional[int] = None


CPU_MODES = ("exact", "memtracker")

# Steps that build what a training job builds once, never measured: step 1 creates the optimizer state and
# torchrec's lazily built modules; DDP (the dense part of both backends) rebuilds its gradient buckets once,
# allocating the new buckets before it frees the old ones: in the forward of step 2, or of step 3 with
# static_graph=True (torchrec's DMP). From step 4 on every step allocates and frees the same.
# workload.warmup_steps below this is raised to it.
SETUP_STEPS = 3


@dataclass
class RecordConfig:
    enabled: bool = True
    # CPU ranks: exact = membench's live-tensor accounting of every op (deterministic); memtracker =
    # PyTorch's MemTracker counts instead (a cross-check of exact; not byte-identical run to run)
    cpu_mode: str = "exact"
    timeline: bool = True
    nvml_interval_ms: int = 100
    # CUDA: save allocator history as the pickle memory_viz reads (and one at OOM)
    snapshot: bool = False
    snapshot_max_entries: int = 100_000


@dataclass
class ModelConfig:
    # torchrec (the reference: sharded by torchrec, fbgemm fused backward + optimizer) | native (plain
    # PyTorch nn.EmbeddingBag tables, table-wise, no torchrec/fbgemm import)
    backend: str = "torchrec"
    # native only: sparse (COO) embedding gradients instead of dense ones
    sparse_grads: bool = False


@dataclass
class EmulateConfig:
    # One process trains rank `rank` of a `world_size`-rank job (bench.run.emulated_group: the peers answer
    # as this rank would); null: a real run of hardware's ranks
    world_size: Optional[int] = None
    # a rank index, or auto: the rank the pre-launch prediction puts highest (ties: the lowest index)
    rank: str = "auto"
    # How the peers answer the id all-to-alls: own_batches (each peer's lengths and ids drawn from its own
    # batch: exact whatever the pooling) | own_data (each peer sends what this rank sends itself: exact for
    # fixed pooling) | auto (own_batches unless the batches are drawn on the GPU, workload.generator)
    peers: str = "auto"


@dataclass
class PipelineConfig:
    # plain (membench's loop) | base | sparse_dist | sparse_dist_lite | fused_sparse_dist | semi_sync (torchrec's
    # train pipelines; the last two need CUDA). What each holds in flight: workloads.pipelines.PIPELINES
    name: str = "plain"


@dataclass
class LauncherConfig:
    # No progress (a finished phase on any rank) for this long -> the launcher ends the torchrun agents
    # and every rank, and marks the run `timeout`; collectives time out after twice this time, so a dead
    # peer cannot hang the others forever, yet a stall is always the watchdog's to report.
    watchdog_s: int = 300
    # Multi-node (hardware.nodes > 1): c10d rendezvous at node 0's host:port, the same on every node
    rdzv_endpoint: str = "127.0.0.1:29400"
    # This node's index when each node runs its own `membench run` (all nodes must share results_dir
    # and pass the same hydra.run.dir); null with spawn_all_nodes=true starts every node's agent here
    node_rank: Optional[int] = None
    # Start every node's torchrun agent on this machine (a multi-node job emulated on one host)
    spawn_all_nodes: bool = False
    # Off CUDA, fork each rank from its torchrun agent once the agent has imported what a rank imports
    # (bench.run.agent: 2-5 s of CPU per rank saved); false starts a fresh interpreter per rank, as CUDA
    # runs always do (a forked child cannot use CUDA). The memory numbers are the same either way.
    fork_ranks: bool = True
    # With fork_ranks: fork the torchrun agent itself from membench too, after membench has imported what a
    # rank imports (bench.run.forked_agent: the agent's 3-4 s of imports saved per run, and a sweep or the
    # regression gate pays them once); false starts it as a command (`python -m bench.run.agent`)
    fork_agent: bool = True


@dataclass
class PlanConfig:
    # membench (fast greedy placement on torchrec-compatible storage) | torchrec (its default planner;
    # minutes at thousands of tables and ranks)
    planner: str = "membench"
    # torchrec's planner's memory model (plan.planner=torchrec, and runs that let torchrec plan: sharding=auto
    # or any type torchrec places): torchrec (its EmbeddingStorageEstimator and HeuristicalStorageReservation)
    # | membench (membench's prediction as its storage estimator and reservation; docs/plan.md)
    memory_model: str = "torchrec"
    # With plan.memory_model=torchrec: a torchrec_reservation.json (`membench reservation RUN`) whose measured
    # static base, activation term and overhead replace torchrec's heuristic storage reservation
    reservation_file: Optional[str] = None
    # Row-wise split of tables larger than this share of a rank's capacity (CUDA only)
    max_shard_fraction: float = 0.25
    # Provisioning: keep this share of each rank's capacity free
    headroom: float = 0.10
    # Provisioning: largest world size to consider, and per-rank batch sizes to try (empty: the workload's)
    max_world_size: int = 8192
    batch_sizes: List[int] = field(default_factory=list)
    # Provisioning with sharding.compute_kernel=fused_uvm_caching: cache ratios to try, each a search of its own
    # (empty: sharding.caching_ratio alone)
    caching_ratios: List[float] = field(default_factory=list)


@dataclass
class RunConfig:
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    sharding: ShardingConfig = field(default_factory=ShardingConfig)
    record: RecordConfig = field(default_factory=RecordConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    emulate: EmulateConfig = field(default_factory=EmulateConfig)
    # train (launch under torchrun) | plan (estimate only, any world size) | provision; set by the command
    mode: str = "train"
    # Plan mode: ranks to plan for (default nodes x hardware.ranks_per_node); `nodes` overrides
    # hardware.nodes
    world_size: Optional[int] = None
    nodes: Optional[int] = None
    plan: PlanConfig = field(default_factory=PlanConfig)
    results_dir: str = "results/runs"
    # Wall-clock limit of one torchrun job; exceeded -> status `timeout`, every agent and rank ended
    timeout_s: int = 1800
    # Set by the CLI from Hydra's output directory; not meant to be overridden
    run_id: str = ""


# Sections and fields added after results were recorded: hashed only when they differ from their default, so that
# a config which does not use them keeps the hash its baselines (and earlier results) were recorded with
HASHED_WHEN_SET = {"pipeline": {"name": "plain"}, "workload.tables_file": None, "workload.generator": "auto",
                   "emulate": {"world_size": None, "rank": "auto", "peers": "auto"},
                   "sharding.column_shard_dim": None, "sharding.caching_ratio": None,
                   "allocator.large_segment_size_mb": None, "plan.memory_model": "torchrec",
                   "plan.reservation_file": None, "plan.caching_ratios": []}


def register_configs() -> None:
    cs = ConfigStore.instance()
    if "membench_run.yaml" not in cs.repo:  # once a process: storing builds the schema anew (13 ms a compose)
        cs.store(name="membench_run", node=RunConfig)


def new_run_id() -> str:
    """Sortable and unique even for runs started in the same second by concurrent processes."""
    return f"{datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def register_resolvers(on_sweep_dir: Optional[Callable[[Path], None]] = None) -> None:
    """The resolvers conf/config.yaml names its output directories with. `on_sweep_dir` is told every
    sweep directory this process resolves (with a launcher that runs points in other processes, such as
    submitit, the caller reads their statuses back from that sweep's index)."""
    def sweep_dir(results_dir: str) -> str:
        path = f"{results_dir}/sweep-{new_run_id()}"
        if on_sweep_dir is not None:
            on_sweep_dir(Path(path))
        return path

    # use_cache: one value per process, so a sweep's directory is resolved once for all its jobs
    OmegaConf.register_new_resolver("membench_id", new_run_id, use_cache=True, replace=True)
    OmegaConf.register_new_resolver("membench_sweep_dir", sweep_dir, use_cache=True, replace=True)


@functools.lru_cache(maxsize=None)
def _run_config_schema():
    # built once a process (13 ms each time); OmegaConf.merge copies its first argument, so it stays unchanged
    return OmegaConf.structured(RunConfig)


def to_run_config(cfg) -> RunConfig:
    """DictConfig (already type-checked by Hydra) -> RunConfig dataclass."""
    merged = OmegaConf.merge(_run_config_schema(), cfg)
    return OmegaConf.to_object(merged)


def config_hash(cfg: RunConfig) -> str:
    payload = {name: OmegaConf.to_container(OmegaConf.structured(getattr(cfg, name)))
               for name in (*HASHED_SECTIONS, *(path for path in HASHED_WHEN_SET if "." not in path))}
    for path, default in HASHED_WHEN_SET.items():
        *parents, key = path.split(".")
        if parents and parents[0] not in payload:  # one field of a section not hashed otherwise
            value = getattr(getattr(cfg, parents[0]), key)
            if value != default:
                payload[path] = value
            continue
        node = payload
        for parent in parents:
            node = node[parent]
        if node[key] == default:
            del node[key]
    if cfg.workload.tables_file:
        payload["workload"]["tables_file"] = tables_file_digest(cfg.workload.tables_file)
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def tables_file_digest(given: str) -> str:
    """What a tables file holds, not where it lies: the same file under another path hashes the same, an edited
    one differently (a file that cannot be read: its name, for validation to refuse)."""
    from workloads.tables_file import resolve_path

    try:
        return "sha256:" + hashlib.sha256(resolve_path(given).read_bytes()).hexdigest()
    except (OSError, ValueError):
        return given


def with_setup_steps(cfg: RunConfig) -> RunConfig:
    """`cfg` with workload.warmup_steps raised to SETUP_STEPS (a copy when it changes; negative counts are left
    for validation to refuse)."""
    if not 0 <= cfg.workload.warmup_steps < SETUP_STEPS:
        return cfg
    resolved = copy.deepcopy(cfg)
    resolved.workload.warmup_steps = SETUP_STEPS
    return resolved


def with_changes(cfg: RunConfig, **changes) -> RunConfig:
    """A copy of `cfg` with top-level fields changed (`mode="plan"`): the caller's config stays as given."""
    new = copy.deepcopy(cfg)
    for name, value in changes.items():
        setattr(new, name, value)
    return new
