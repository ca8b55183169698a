"""A process group in which one process plays rank R of an N-rank job, answering for every peer.

`emulate.world_size=N emulate.rank=R` trains rank R for real (its own shards at full size, its kernels and
optimizers, the global-batch lookups its tables serve, the same recorder) in one process: each collective
completes at once, its outputs filled with what the peers would send. The id all-to-alls are answered from
each peer's own batch where `peer_answers` is set (emulate.peers=own_batches, bench.run.peer_batches: exact
whatever the pooling); everything else, and the ids too under emulate.peers=own_data, as if each peer were
this rank ("own data"):

- all-to-all: peer p sends what R sends to itself (R's own chunk of the input). Where the chunk p would send
  has another size (pooled embeddings of tables of other widths), its buffer, sized by the caller from the
  plan, is filled by repeating R's own chunk: the sizes are the peers' and exact, the values are R's.
- all-reduce: N copies of R's tensor (SUM multiplies by N; AVG, MAX, MIN leave it); all-gather: N copies;
  reduce-scatter: N times R's own chunk; broadcast from another rank: the buffer stays as it is (R's own
  values, as a peer identical to R would send them); barrier: done.

Own data is exact for memory wherever what a peer sends has a size that does not depend on its data: fixed
pooling, data-parallel and dense collectives. With random pooling the peers' lengths are then R's own, so the
buffers sized from them follow R's batch, not each peer's: the result says so.
"""
from __future__ import annotations

from typing import List, Sequence

import torch
import torch.distributed as dist

from bench.run.emulation import BACKEND_NAME


def _done(result) -> "dist.Work":
    """A work already completed with `result` (c10d's private constructor from a future: the one use)."""
    from torch._C._distributed_c10d import _create_work_from_future

    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def chunks(tensor: torch.Tensor, split_sizes: Sequence[int], world_size: int) -> List[torch.Tensor]:
    """`tensor`'s chunk for (or from) each rank, as c10d's all-to-all splits it (views)."""
    sizes = list(split_sizes) if split_sizes else [tensor.shape[0] // world_size] * world_size
    return list(torch.split(tensor, sizes, dim=0)) if tensor.dim() else [tensor]


def _fill_from(target: torch.Tensor, source: torch.Tensor) -> None:
    """`target` holds `source` (the same shape), or `source` repeated into its size (the values are R's). In
    place, through views: a temporary here would be an allocation no real peer causes, and the recorder
    counts it (5,116 B on rank 0 of an uneven table-wise job, before). Only a non-contiguous buffer, which
    no caller hands over, goes through a copy."""
    if target.numel() == 0:
        return
    if target.shape == source.shape:
        target.copy_(source)
        return
    if source.numel() == 0:
        target.zero_()
        return
    flat = source.reshape(-1)
    into = target.view(-1) if target.is_contiguous() else torch.empty(target.numel(), dtype=target.dtype,
                                                                       device=target.device)
    for start in range(0, into.numel(), flat.numel()):
        piece = into[start:start + flat.numel()]
        piece.copy_(flat[:piece.numel()])
    if not target.is_contiguous():
        target.copy_(into.view(target.shape))


def _sums(opts) -> bool:
    """Does the reduction add the peers' contributions (c10d's default op)?"""
    return opts is None or opts.reduceOp == dist.ReduceOp.SUM


def _gather_into(output: torch.Tensor, tensor: torch.Tensor, world_size: int) -> None:
    for chunk in output.chunk(world_size, dim=0):
        _fill_from(chunk, tensor)


class EmulatedProcessGroup(dist.ProcessGroup):
    """Rank `rank` of a `world_size`-rank group whose peers answer as this rank would."""

    def __init__(self, rank: int, world_size: int):
        super().__init__(rank, world_size)
        self._rank, self._world = rank, world_size
        # emulate.peers=own_batches: what answers the id exchanges from each peer's own batch (PeerBatches)
        self.peer_answers = None

    def getBackendName(self) -> str:  # noqa: N802 (c10d's name)
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        """The name c10d registered this group under (DeviceMesh asks; a Python group does not hold it)."""
        from torch.distributed.distributed_c10d import _world

        return _world.pg_names[self]

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # noqa: A002
        if self.peer_answers is not None and self.peer_answers.fill(output, input, output_split_sizes,
                                                                    input_split_sizes):
            return _done(output)
        own = chunks(input, input_split_sizes, self._world)[self._rank]
        for chunk in chunks(output, output_split_sizes, self._world):
            _fill_from(chunk, own)
        return _done(output)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        own = input_tensors[self._rank]
        for chunk in output_tensors:
            _fill_from(chunk, own)
        return _done(output_tensors)

    def allreduce(self, tensors, opts=None):
        if _sums(opts):
            for tensor in tensors:
                tensor.mul_(self._world)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outputs, tensor in zip(output_tensors, input_tensors):
            for output in outputs:
                output.copy_(tensor)
        return _done(output_tensors)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002
        _gather_into(output, input, self._world)
        return _done(output)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for output, tensor in zip(outputs, inputs):
            _gather_into(output, tensor, self._world)
        return _done(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        _fill_from(output, input.chunk(self._world, dim=0)[self._rank])
        if _sums(opts):
            output.mul_(self._world)
        return _done(output)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        for output, inputs in zip(output_tensors, input_tensors):
            _fill_from(output, inputs[self._rank])
            if _sums(opts):
                output.mul_(self._world)
        return _done(output_tensors)

    def broadcast(self, tensors, opts=None):
        return _done(tensors)

    def barrier(self, opts=None):
        return _done(None)


_WORLD: List[EmulatedProcessGroup] = []  # the group init_emulated_group made


def _create(store, rank: int, world_size: int, timeout) -> EmulatedProcessGroup:
    _WORLD[:] = [EmulatedProcessGroup(rank, world_size)]
    return _WORLD[0]


def world_group() -> EmulatedProcessGroup:
    """The default group of this emulated rank's process."""
    if not _WORLD:
        raise RuntimeError("no emulated group: init_emulated_group first")
    return _WORLD[0]


def init_emulated_group(rank: int, world_size: int) -> None:
    """The default process group of this process: rank `rank` of `world_size`, peers emulated."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:  # noqa: SLF001 (registered once per process)
        dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])
    dist.init_process_group(BACKEND_NAME, rank=rank, world_size=world_size, store=dist.HashStore())
