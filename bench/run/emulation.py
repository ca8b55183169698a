"""emulate.*: one process trains rank R of an N-rank job (bench.run.emulated_group answers for the peers).

The launch keeps the job's world size, ranks per node (torchrec's topology) and per-rank capacity, and
starts one rank process; `emulate.rank=auto` becomes the rank the pre-launch prediction puts highest.
"""
from __future__ import annotations

import copy
import dataclasses
from typing import Any, Dict, Optional

import psutil

from bench.results.schema import DEVICE_CPU, kernel_device
from bench.run.config import RunConfig
from bench.run.launch_types import LaunchSpec
from workloads.units import GIB
from workloads.validate import ConfigError, check_host_memory

AUTO = "auto"
BACKEND_NAME = "membench_emulated"  # the process group's c10d backend name (bench.run.emulated_group)
# emulate.peers: how the peers answer the id all-to-alls (bench.run.peer_batches, bench.run.emulated_group)
OWN_BATCHES, OWN_DATA = "own_batches", "own_data"
PEERS_ANSWERS = (AUTO, OWN_BATCHES, OWN_DATA)


def emulated_launch(cfg: RunConfig, launch: LaunchSpec) -> LaunchSpec:
    """`launch` as an emulated job of emulate.world_size ranks (the rank itself is set by `with_rank`), or
    `launch` unchanged when emulation is off; ConfigError for a setting that cannot work."""
    emulate = cfg.emulate
    if emulate.world_size is None:
        return launch
    if emulate.world_size < 1:
        raise ConfigError("emulate.world_size", emulate.world_size, "must be >= 1 (or null: no emulation)")
    if launch.multi_node or cfg.launcher.spawn_all_nodes:
        raise ConfigError("hardware.nodes", cfg.hardware.nodes, "an emulated rank runs in one process on one "
                          "machine: leave hardware.nodes=1 (emulate.world_size sets the job's size)")
    peers_answer(cfg, launch.device_type)  # refused here, before anything starts
    rank = requested_rank(cfg)
    if rank is not None and not 0 <= rank < emulate.world_size:
        raise ConfigError("emulate.rank", emulate.rank, f"a rank in 0..{emulate.world_size - 1}, or auto")
    return dataclasses.replace(launch, world_size=emulate.world_size, emulated_rank=rank, dist_backend=BACKEND_NAME)


def peers_answer(cfg: RunConfig, device_type: str) -> str:
    """emulate.peers as it runs: own_batches needs the peers' batches drawn here, on the host (auto: own_data
    when workload.generator draws them on the GPU, whose generator a peer's batch could only be drawn with on
    the GPU itself, an allocation no rank of the real job makes); ConfigError for anything else."""
    from workloads.data import draws_on_device
    from workloads.spec import build_spec

    requested = str(cfg.emulate.peers).strip()
    if requested not in PEERS_ANSWERS:
        raise ConfigError("emulate.peers", cfg.emulate.peers, f"one of {', '.join(PEERS_ANSWERS)}")
    on_device = draws_on_device(cfg.workload.generator, kernel_device(device_type), build_spec(cfg.workload))
    if requested == OWN_BATCHES and on_device:
        raise ConfigError("emulate.peers", requested, "the peers' batches are drawn on the host: set "
                          "workload.generator=host, or emulate.peers=own_data")
    if requested == AUTO:
        return OWN_DATA if on_device else OWN_BATCHES
    return requested


def requested_rank(cfg: RunConfig) -> Optional[int]:
    """emulate.rank as an index, None for auto; ConfigError for anything else."""
    text = str(cfg.emulate.rank).strip()
    if text == AUTO:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError("emulate.rank", cfg.emulate.rank, "a rank index (0, 1, ...) or auto") from None


def with_rank(cfg: RunConfig, launch: LaunchSpec, estimate: Optional[Dict[str, Any]]) -> LaunchSpec:
    """The emulated launch with its rank decided: as requested, or (auto) the highest predicted rank."""
    if cfg.emulate.world_size is None or launch.emulated_rank is not None:
        return launch
    peaks = (estimate or {}).get("per_rank_peak") or []
    if len(peaks) != launch.world_size:
        raise ConfigError("emulate.rank", AUTO, "auto needs the pre-launch prediction, which failed here; "
                          "name the rank (emulate.rank=0)")
    rank = max(range(len(peaks)), key=lambda index: (peaks[index], -index))
    print(f"[membench] emulate.rank=auto: rank {rank} of {launch.world_size} (predicted highest, "
          f"{peaks[rank] / 2**20:.1f} MiB)", flush=True)
    return dataclasses.replace(launch, emulated_rank=rank)


def check_rank_fits_host(launch: LaunchSpec, estimate: Optional[Dict[str, Any]],
                         available_bytes: Optional[int] = None) -> None:
    """An emulated rank on CPU holds its own shards and buffers in this machine's RAM: refuse it, before it
    starts, when its predicted peak would not fit (the whole job's tables are never needed here)."""
    peaks = (estimate or {}).get("per_rank_peak") or []
    if launch.emulated_rank is None or kernel_device(launch.device_type) != DEVICE_CPU or not peaks:
        return
    if available_bytes is None:
        available_bytes = psutil.virtual_memory().available
    needed = peaks[launch.emulated_rank]
    check_host_memory(needed, available_bytes, "emulate.rank", launch.emulated_rank,
                      needs=f"rank {launch.emulated_rank} of {launch.world_size} is predicted to need "
                            f"{needed / GIB:.1f} GiB ({needed} B)",
                      fix="emulate a larger world size (a smaller share per rank) or a smaller workload")


def with_rank_config(cfg: RunConfig, launch: LaunchSpec) -> RunConfig:
    """`cfg` with emulate.rank as the launch decided it (config.yaml names the rank that ran)."""
    if launch.emulated_rank is None or str(cfg.emulate.rank) == str(launch.emulated_rank):
        return cfg
    resolved = copy.deepcopy(cfg)
    resolved.emulate.rank = str(launch.emulated_rank)
    return resolved


def emulation_record(cfg: RunConfig, launch: LaunchSpec) -> Optional[Dict[str, Any]]:
    """What the summary says of an emulated run: which rank of how many, how its peers were answered, and
    whether that is exact: always with own_batches; with own_data when every table's pooling is fixed (what a
    peer sends then has the size R's own has)."""
    from workloads.spec import build_spec

    if launch.emulated_rank is None:
        return None
    peers = peers_answer(cfg, launch.device_type)
    exact = peers == OWN_BATCHES or all(table.pooling.distribution == "fixed"
                                        for table in build_spec(cfg.workload).tables)
    return {"rank": launch.emulated_rank, "world_size": launch.world_size, "peers": peers, "exact": exact}
