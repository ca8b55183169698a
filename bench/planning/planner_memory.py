"""What torchrec's planner plans a rank with: the capacity of each memory tier (HBM, and host memory per rank)
and the memory model (torchrec's own, with or without a measured storage reservation, or membench's).
torchrec is imported only when a plug-in memory model is built."""
from __future__ import annotations

from typing import Optional, Tuple

from bench.results.schema import DEVICE_CUDA, DEVICE_CUDA_SIMULATED, kernel_device
from workloads.spec import WorkloadSpec
from workloads.units import GIB


def host_memory_per_node(cfg) -> int:
    """hardware.host_memory_gib in bytes: a node's host memory, which its ranks' UVM tables share."""
    return int(cfg.hardware.host_memory_gib * GIB)


def host_memory_per_rank(cfg, ranks_per_node: int) -> int:
    """torchrec's `ddr_cap` is per rank (planner/types.py: "ddr_cap_bytes ... per rank"); hardware.host_memory_gib
    is a node's: its share per rank (passed whole, a node of 8 ranks planned UVM with 8x its host memory)."""
    return host_memory_per_node(cfg) // max(1, ranks_per_node)


def planner_memory(cfg, device_type: str, capacity_bytes: int, ranks_per_node: int) -> Tuple[str, Optional[int], int]:
    """(compute_device, hbm_cap, ddr_cap) torchrec's planner plans a rank of `device_type` with: a GPU's HBM and
    its node's host memory per rank (N10); a CPU rank its node's host memory per rank (DDR); a simulated GPU,
    which trains with CPU kernels, in DDR with the GPU's memory."""
    compute_device = kernel_device(device_type)
    if compute_device == DEVICE_CUDA:
        return compute_device, capacity_bytes, host_memory_per_rank(cfg, ranks_per_node)
    ddr_cap = capacity_bytes if device_type == DEVICE_CUDA_SIMULATED else host_memory_per_rank(cfg, ranks_per_node)
    return compute_device, None, ddr_cap


def memory_model_for(cfg, spec: WorkloadSpec, device_type: str):
    """The memory model torchrec's planner plans with: membench's (plan.memory_model=membench), torchrec's own
    with a measured storage reservation (plan.reservation_file), or None (torchrec's default estimator and
    heuristic storage reservation)."""
    if cfg.plan.memory_model == "membench":
        from bench.planning.torchrec_memory_model import MembenchMemoryModel

        return MembenchMemoryModel.from_config(cfg, spec, device_type)
    if cfg.plan.reservation_file is not None:
        from bench.planning.torchrec_measured import MeasuredStorageReservation

        return MeasuredStorageReservation.from_file(cfg.plan.reservation_file)
    return None


def memory_model_name(memory) -> str:
    """What a plan's info calls the memory model (`memory_model_for`'s answer) it was planned with."""
    return "torchrec" if memory is None else memory.MODEL_NAME
