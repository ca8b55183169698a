"""The `native` model backend: the same DLRM workload in plain PyTorch, no torchrec or fbgemm.

Tables are `nn.EmbeddingBag`s placed table-wise over the ranks (largest first onto the least-loaded
rank). Each step: the ids of every table go to the rank that owns it (all-to-all), that rank pools
them for the whole global batch, and the pooled embeddings come back (all-to-all, with its own
backward). Dense and over arch run under DDP; the embedding optimizer is an ordinary optimizer over
dense or sparse gradients, so embedding gradients materialize, unlike in fbgemm's fused backward.
"""
from __future__ import annotations

import contextlib
import heapq
from typing import Callable, ContextManager, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn

from workloads.data import Batch
from workloads.spec import WorkloadSpec

DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def table_owners(spec: WorkloadSpec, world_size: int) -> List[int]:
    """Owner rank of each table: longest-processing-time greedy on physical bytes (deterministic)."""
    loads = [(0, rank) for rank in range(world_size)]
    owners = [0] * len(spec.tables)
    for index in sorted(range(len(spec.tables)), key=lambda i: (-spec.tables[i].physical_bytes, i)):
        load, rank = heapq.heappop(loads)
        owners[index] = rank
        heapq.heappush(loads, (load + spec.tables[index].physical_bytes, rank))
    return owners


def plan_rows(spec: WorkloadSpec, owners: Sequence[int]) -> List[dict]:
    """The placement in the shape of `workloads.plan.describe_plan`, for sharding_plan.json."""
    return [{"module": "native.embeddings", "table": t.name, "sharding_type": "table_wise",
             "compute_kernel": "native", "ranks": [owner],
             "shards": [{"rank": owner, "offsets": [0, 0], "sizes": [t.physical_rows, t.embedding_dim]}]}
            for t, owner in zip(spec.tables, owners)]


class MLP(nn.Sequential):
    def __init__(self, in_features: int, sizes: Sequence[int], last_activation: bool = True):
        layers: List[nn.Module] = []
        for index, size in enumerate(sizes):
            layers.append(nn.Linear(in_features, size))
            if last_activation or index < len(sizes) - 1:
                layers.append(nn.ReLU())
            in_features = size
        super().__init__(*layers)


class DotInteraction(nn.Module):
    """DLRM's pairwise dot products between the dense embedding and every sparse one."""

    def __init__(self, num_sparse: int):
        super().__init__()
        self.num_sparse = num_sparse
        rows, cols = torch.triu_indices(num_sparse + 1, num_sparse + 1, offset=1)
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)

    def output_size(self, dim: int) -> int:
        return dim + (self.num_sparse + 1) * self.num_sparse // 2

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # B x (F+1) x D
        products = torch.bmm(combined, combined.transpose(1, 2))
        return torch.cat([dense, products[:, self.rows, self.cols]], dim=1)


class LowRankCrossNet(nn.Module):
    """DCNv2 with low-rank layers: x_{l+1} = x0 * (W_l V_l x_l + b_l) + x_l."""

    def __init__(self, in_features: int, num_layers: int, low_rank: int):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(in_features, low_rank, bias=False) for _ in range(num_layers))
        self.up = nn.ModuleList(nn.Linear(low_rank, in_features) for _ in range(num_layers))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x
        return x


class DCNInteraction(nn.Module):
    def __init__(self, num_sparse: int, dim: int, num_layers: int, low_rank: int):
        super().__init__()
        self.crossnet = LowRankCrossNet((num_sparse + 1) * dim, num_layers, low_rank)

    def output_size(self, dim: int) -> int:
        return self.crossnet.up[0].out_features

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        combined = torch.cat([dense.unsqueeze(1), sparse], dim=1).flatten(1)
        return self.crossnet(combined)


class DenseModel(nn.Module):
    """Everything after the embeddings: dense arch, interaction, over arch (wrapped in DDP)."""

    def __init__(self, spec: WorkloadSpec):
        super().__init__()
        cfg = spec.config
        dim, num_sparse = spec.tables[0].embedding_dim, len(spec.tables)
        self.dense_arch = MLP(cfg.num_dense_features, cfg.dense_arch)
        if cfg.arch == "dlrm_dcn":
            self.interaction = DCNInteraction(num_sparse, dim, cfg.dcn_num_layers, cfg.dcn_low_rank_dim)
        else:
            self.interaction = DotInteraction(num_sparse)
        self.over_arch = MLP(self.interaction.output_size(dim), cfg.over_arch, last_activation=False)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        return self.over_arch(self.interaction(self.dense_arch(dense), sparse)).squeeze(-1)


class PooledAllToAll(torch.autograd.Function):
    """Send each rank the pooled embeddings of its samples; the gradients travel back the same way."""

    @staticmethod
    def forward(ctx, local_pooled, world_size, batch, local_dims, all_dims, group, comm_scope):
        # local_pooled: (world_size * batch) x local_dims, rows grouped by the rank that owns the samples
        ctx.world_size, ctx.batch, ctx.local_dims, ctx.all_dims = world_size, batch, local_dims, all_dims
        ctx.group, ctx.comm_scope = group, comm_scope
        with comm_scope():
            send = local_pooled.contiguous()
            received = local_pooled.new_empty(batch * sum(all_dims))
            dist.all_to_all_single(received, send.view(-1), [batch * d for d in all_dims],
                                   [batch * local_dims] * world_size, group=group)
        # received: per source rank, batch x dims_of_that_rank -> batch x (sum of all dims, rank-major)
        chunks = received.split([batch * d for d in all_dims])
        return torch.cat([c.view(batch, d) for c, d in zip(chunks, all_dims)], dim=1)

    @staticmethod
    def backward(ctx, grad):
        batch, world_size = ctx.batch, ctx.world_size
        with ctx.comm_scope():
            send = torch.cat([g.contiguous().view(-1) for g in grad.split(ctx.all_dims, dim=1)])
            received = grad.new_empty(world_size * batch * ctx.local_dims)
            dist.all_to_all_single(received, send, [batch * ctx.local_dims] * world_size,
                                   [batch * d for d in ctx.all_dims], group=ctx.group)
        return received.view(world_size * batch, ctx.local_dims), None, None, None, None, None, None


class RowWiseAdagrad(torch.optim.Optimizer):
    """fbgemm's row-wise Adagrad (one accumulator per row), for dense or sparse gradients."""

    def __init__(self, params, lr: float = 0.01, eps: float = 1e-8):
        super().__init__(params, {"lr": lr, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "sum" not in state:
                    state["sum"] = torch.zeros(param.shape[0], device=param.device, dtype=torch.float32)
                grad = param.grad
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()
                    state["sum"].index_add_(0, rows, values.pow(2).mean(dim=1))
                    scale = group["lr"] / (state["sum"][rows].sqrt() + group["eps"])
                    param.index_add_(0, rows, -values * scale.unsqueeze(1))
                else:
                    state["sum"].add_(grad.pow(2).mean(dim=1))
                    param.addcdiv_(grad, state["sum"].sqrt().add_(group["eps"]).unsqueeze(1), value=-group["lr"])


def embedding_optimizer(name: str, params, lr: float, sparse: bool) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "rowwise_adagrad":
        return RowWiseAdagrad(params, lr=lr)
    if name == "adam":
        return torch.optim.SparseAdam(params, lr=lr) if sparse else torch.optim.Adam(params, lr=lr)
    raise ValueError(f"unknown embedding optimizer {name!r}")


class NativeDLRM(nn.Module):
    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, device: torch.device, sparse_grads: bool,
                 comm_scope: Callable[[], ContextManager] = contextlib.nullcontext, group=None):
        super().__init__()
        self.spec, self.rank, self.world_size, self.device = spec, rank, world_size, device
        self.owners = table_owners(spec, world_size)
        self.local = [i for i, owner in enumerate(self.owners) if owner == rank]
        dtype = DTYPES[spec.config.data_type]
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(spec.tables[i].physical_rows, spec.tables[i].embedding_dim, mode="sum",
                            sparse=sparse_grads, device=device, dtype=dtype) for i in self.local)
        # tables in the order pooled embeddings arrive: rank-major, then table order within a rank
        self.arrival = [i for r in range(world_size) for i, owner in enumerate(self.owners) if owner == r]
        self.dims_by_rank = [sum(spec.tables[i].embedding_dim for i, o in enumerate(self.owners) if o == r)
                             for r in range(world_size)]
        self.dense = DenseModel(spec).to(device)
        self.comm_scope, self.group = comm_scope, group
        self.loss_fn = nn.BCEWithLogitsLoss()
        # called with each pooled lookup output (e.g. to hook the start of its table's backward)
        self.on_pooled: Optional[Callable[[torch.Tensor], None]] = None
        # called as each id exchange starts, before its all-to-alls: on_exchange(the tables this rank receives,
        # the ids it sends itself (one view a table), value_count=the counts it sends (one a destination),
        # lengths=(the lengths it sends, their split sizes)); an emulated rank's peers answer from it
        # (bench.run.peer_batches)
        self.on_exchange: Optional[Callable[..., None]] = None

    def _exchange_ids(self, batch: Batch):
        """All-to-all of (lengths, values) so each rank gets the ids of its tables for every sample."""
        size, table_count = batch.batch_size, len(self.spec.tables)
        lengths = batch.lengths.view(table_count, size)
        offsets = torch.cat([lengths.new_zeros(1), lengths.sum(dim=1).cumsum(0)])
        send_lengths, send_values, value_counts = [], [], []
        for rank in range(self.world_size):
            tables = [i for i, owner in enumerate(self.owners) if owner == rank]
            send_lengths.extend(lengths[i] for i in tables)
            values = [batch.values[offsets[i]:offsets[i + 1]] for i in tables]
            send_values.extend(values)
            value_counts.append(sum(int(v.numel()) for v in values))
        with self.comm_scope():
            # on the model's device: a group made for nccl has no backend for CPU tensors
            counts = torch.tensor(value_counts, dtype=torch.int64, device=self.device)
            received_counts = torch.empty_like(counts)
            local_tables = len(self.local)
            lengths_out = torch.empty(self.world_size * local_tables * size, dtype=lengths.dtype, device=self.device)
            lengths_in = (torch.cat(send_lengths) if send_lengths else lengths.new_empty(0)).to(self.device)
            lengths_sent = [len([o for o in self.owners if o == r]) * size for r in range(self.world_size)]
            if self.on_exchange is not None:
                self.on_exchange(self.local, [batch.values[offsets[i]:offsets[i + 1]] for i in self.local],
                                 value_count=counts, lengths=(lengths_in, lengths_sent))
            dist.all_to_all_single(received_counts, counts, group=self.group)  # (allocates nothing)
            dist.all_to_all_single(lengths_out, lengths_in, [local_tables * size] * self.world_size, lengths_sent,
                                   group=self.group)
            values_out = torch.empty(int(received_counts.sum()), dtype=batch.values.dtype, device=self.device)
            values_in = (torch.cat(send_values) if send_values else batch.values.new_empty(0)).to(self.device)
            dist.all_to_all_single(values_out, values_in, received_counts.tolist(), value_counts, group=self.group)
        return lengths_out.view(self.world_size, local_tables, size), values_out, received_counts.tolist()

    def forward(self, batch: Batch) -> torch.Tensor:
        size = batch.batch_size
        lengths, values, counts = self._exchange_ids(batch)
        pooled = []
        starts = [0] + list(torch.tensor(counts).cumsum(0).tolist())
        for local_index, bag in enumerate(self.bags):
            per_rank_values, per_rank_lengths = [], []
            for rank in range(self.world_size):
                rank_lengths = lengths[rank]
                rank_values = values[starts[rank]:starts[rank + 1]]
                before = int(rank_lengths[:local_index].sum())
                count = int(rank_lengths[local_index].sum())
                per_rank_values.append(rank_values[before:before + count])
                per_rank_lengths.append(rank_lengths[local_index])
            ids, bag_lengths = torch.cat(per_rank_values), torch.cat(per_rank_lengths)
            offsets = torch.cat([bag_lengths.new_zeros(1), bag_lengths.cumsum(0)[:-1]])
            pooled.append(bag(ids, offsets.to(torch.int64)))  # (world_size * size) x dim
            if self.on_pooled is not None and pooled[-1].requires_grad:
                self.on_pooled(pooled[-1])
        local_dims = sum(b.embedding_dim for b in self.bags)
        if pooled:
            local_pooled = torch.cat(pooled, dim=1)
        else:  # a rank without tables must still join the backward all-to-all: keep it in the graph
            local_pooled = torch.zeros(self.world_size * size, 0, device=self.device, requires_grad=True)
        arrived = PooledAllToAll.apply(local_pooled, self.world_size, size, local_dims, self.dims_by_rank,
                                       self.group, self.comm_scope)
        # back to table order: batch x F x D
        dim = self.spec.tables[0].embedding_dim
        order = torch.tensor([self.arrival.index(i) for i in range(len(self.spec.tables))], device=self.device)
        sparse = arrived.view(size, len(self.spec.tables), dim).index_select(1, order)
        logits = self.dense(batch.dense_features.to(self.device), sparse)
        return self.loss_fn(logits, batch.labels.to(self.device))
