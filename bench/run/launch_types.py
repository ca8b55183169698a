"""LaunchSpec: what a launch resolved from a run's config (bench.run.launchspec resolves it; the launcher, the
workers and bench.run.emulation read it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass
class LaunchSpec:
    device_type: str  # cpu | cuda
    dist_backend: str  # gloo | nccl | membench_emulated (emulate.*)
    world_size: int
    ranks_per_node: int
    nodes: int
    # per rank: the emulated capacity on CPU, the device's (capped) memory on CUDA
    capacity_bytes: int
    collective_timeout_s: int
    # multi-node: where the c10d rendezvous lives, and which node agents this machine starts
    rdzv_endpoint: str = ""
    local_node_ranks: Tuple[int, ...] = (0,)
    emulated_rank: Optional[int] = None  # emulate.*: one process plays this rank of world_size

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1

    @property
    def measured_ranks(self) -> Tuple[int, ...]:
        """The ranks whose results the run writes: every rank, or the one emulated."""
        return (self.emulated_rank,) if self.emulated_rank is not None else tuple(range(self.world_size))

    @property
    def local_processes(self) -> int:
        """Rank processes this machine starts."""
        return 1 if self.emulated_rank is not None else self.ranks_per_node * len(self.local_node_ranks)
