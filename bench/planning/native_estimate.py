"""Peak prediction for the native backend: the rank's own model trained on the `meta` device.

The native backend is plain PyTorch, so its prediction needs no model of a library: each rank's
NativeDLRM (its own tables, the dense part) is built on `meta` and trained for two steps the way the worker
trains it (input, forward, backward, dense then embedding optimizer, zero_grad), counted by the same
live-tensor tracker as real runs. What is not the model's own code is replaced by its shapes: the batch
(pooling at each table's mean), the all-to-all of ids and of pooled embeddings (the same buffers, no
collective), and DDP, whose gradient buckets are kept as persistent gradients. Nothing is fitted.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List

from bench.planning.dry_run import keep_gradients
from bench.planning.types import RankPrediction
from workloads.spec import WorkloadSpec
from workloads.units import UNBOUNDED_BYTES

STEPS = 2  # the first builds the optimizer state; the peak is taken in the second


def _cpu_embedding_bag_shapes():
    """A dispatch mode that gives `aten._embedding_bag` on `meta` the outputs its CPU kernel returns. Meta's
    shapes differ in the auxiliary outputs the backward keeps (offset2bag: one per id on meta, none on CPU in
    sum mode; max_indices: none on meta, one per bag on CPU), which would count 8 bytes per id too many."""
    import torch

    from bench.accounting.dispatch_mode import DispatchMode

    class CpuEmbeddingBagShapes(DispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            mode = args[4] if len(args) > 4 else (kwargs or {}).get("mode", 0)
            if func is torch.ops.aten._embedding_bag.default and mode == 0:
                output, offset2bag, bag_size, _ = out
                out = (output, offset2bag.new_empty(0), bag_size, bag_size.new_empty(bag_size.shape))
            return out

    return CpuEmbeddingBagShapes()


def _pooled_all_to_all():
    import torch

    class PooledAllToAll(torch.autograd.Function):
        """workloads.native.PooledAllToAll's buffers without the collective."""

        @staticmethod
        def forward(ctx, local_pooled, world_size, batch, local_dims, all_dims):
            ctx.world_size, ctx.batch, ctx.local_dims, ctx.all_dims = world_size, batch, local_dims, all_dims
            send = local_pooled.contiguous()
            received = local_pooled.new_empty(batch * sum(all_dims))
            del send
            chunks = received.split([batch * d for d in all_dims])
            return torch.cat([c.view(batch, d) for c, d in zip(chunks, all_dims)], dim=1)

        @staticmethod
        def backward(ctx, grad):
            batch, world_size = ctx.batch, ctx.world_size
            send = torch.cat([g.contiguous().view(-1) for g in grad.split(ctx.all_dims, dim=1)])
            received = grad.new_empty(world_size * batch * ctx.local_dims)
            del send
            return received.view(world_size * batch, ctx.local_dims), None, None, None, None

    return PooledAllToAll


class NativeDryRun:
    """One rank of the native backend on `meta`."""

    def __init__(self, spec: WorkloadSpec, rank: int, world_size: int, sparse_grads: bool,
                 allocator_settings=None):
        import torch

        from bench.accounting.caching_allocator.replay import AllocationStream

        from bench.accounting.live_tensors import LiveTensorTracker
        from workloads.model import dense_optimizer_class
        from workloads.native import NativeDLRM, embedding_optimizer

        cfg = spec.config
        self.spec, self.rank, self.world_size = spec, rank, world_size
        self.meta = torch.device("meta")
        # a GPU: every malloc and free from the build on, replayed through the caching allocator model
        self.allocator_settings = allocator_settings
        self.allocations = AllocationStream() if allocator_settings is not None else None
        self.tracker = LiveTensorTracker(self.meta, UNBOUNDED_BYTES, rank=rank, on_new_peak=self._on_new_peak,
                                         allocator=self.allocations)
        self.peak_breakdown: Dict[str, int] = {}
        with self.tracker:
            self.model = NativeDLRM(spec, rank, world_size, self.meta, sparse_grads=sparse_grads)
        dense_params = list(self.model.dense.parameters())
        self.tracker.track_tensors(list(self.model.bags.parameters()), "embedding_weights")
        for param in self.model.bags.parameters():  # as the worker does: a table's gradient, once accumulated
            param.register_post_accumulate_grad_hook(
                lambda p: self.tracker.track_tensors([p.grad], "embedding_grads"))
        self.tracker.track_tensors(dense_params, "dense_params")
        keep_gradients(self.tracker, dense_params, "dense_grads")  # DDP's buckets
        self.optimizers = [("dense_optimizer", dense_optimizer_class(cfg.dense_optimizer)(dense_params, lr=cfg.dense_lr))]
        if len(self.model.bags):
            self.optimizers.append(("embedding_optimizer", embedding_optimizer(
                cfg.embedding_optimizer, self.model.bags.parameters(), cfg.embedding_lr, sparse_grads)))

    def _on_new_peak(self) -> None:
        self.peak_breakdown = dict(self.tracker.by_category)

    def _empty(self, n, dtype=None):
        import torch

        return torch.empty(max(0, int(round(n))), dtype=dtype or torch.float32, device=self.meta)

    def _forward(self, batch):
        """NativeDLRM.forward with the id exchange and the pooled all-to-all replaced by their buffers."""
        import torch

        dense_features, labels, lengths, values = batch
        model, spec, world, size = self.model, self.spec, self.world_size, dense_features.shape[0]
        local = model.local
        pools = [t.expected_pooling for t in spec.tables]
        # _exchange_ids: counts, lengths and ids of the local tables from every rank (the sent copies go)
        exchange = [self._empty(world, torch.int64), self._empty(world, torch.int64),
                    self._empty(len(spec.tables) * size, torch.int32), self._empty(size * sum(pools), torch.int64)]
        lengths_out = self._empty(world * len(local) * size, torch.int32)
        values_out = self._empty(world * size * sum(pools[i] for i in local), torch.int64)
        del exchange
        pooled = []
        for local_index, bag in enumerate(model.bags):
            ids = self._empty(world * size * pools[local[local_index]], torch.int64)
            bag_lengths = self._empty(world * size, torch.int32)
            offsets = torch.cat([bag_lengths.new_zeros(1), bag_lengths.cumsum(0)[:-1]])
            pooled.append(bag(ids, offsets.to(torch.int64)))
            # no del: forward's loop variables keep the last table's ids, lengths and offsets until it returns
        local_dims = sum(b.embedding_dim for b in model.bags)
        if pooled:
            local_pooled = torch.cat(pooled, dim=1)
        else:
            local_pooled = torch.zeros(world * size, 0, device=self.meta, requires_grad=True)
        arrived = _pooled_all_to_all().apply(local_pooled, world, size, local_dims, model.dims_by_rank)
        dim = spec.tables[0].embedding_dim
        order = self._empty(len(spec.tables), torch.int64)
        sparse = arrived.view(size, len(spec.tables), dim).index_select(1, order)
        logits = model.dense(dense_features, sparse)
        # the exchanged ids, the pooled lookups and the loop's last table are forward's locals: they go
        # when it returns
        del lengths_out, values_out, pooled, local_pooled
        if len(model.bags):
            del ids, bag_lengths, offsets
        return model.loss_fn(logits, labels)

    def _batch(self):
        import torch

        cfg, size = self.spec.config, self.spec.config.batch_size
        pools = sum(t.expected_pooling for t in self.spec.tables)
        return (self._empty(size * cfg.num_dense_features).view(size, -1), self._empty(size),
                self._empty(len(self.spec.tables) * size, torch.int32), self._empty(size * pools, torch.int64))

    def run(self) -> RankPrediction:
        tracker = self.tracker
        # the shape fix outside the tracker, so that the tracker counts what it returns
        with _cpu_embedding_bag_shapes(), tracker:
            for step in range(STEPS):
                if step == STEPS - 1:
                    tracker.reset_peak()
                    self.peak_breakdown = dict(tracker.by_category)
                tracker.category = "activations"
                batch = self._batch()
                loss = self._forward(batch)
                loss.backward()  # each table's gradient is charged to embedding_grads by its hook
                for category, optimizer in self.optimizers:
                    tracker.category = category
                    optimizer.step()
                tracker.category = "activations"
                for category, optimizer in self.optimizers:
                    # the worker's zero_grad (set_to_none): embedding gradients go; DDP's buckets stay
                    if category == "embedding_optimizer":
                        optimizer.zero_grad()
                del batch, loss
        breakdown = {k: v for k, v in self.peak_breakdown.items() if v}
        if self.allocations is not None:
            from bench.accounting.caching_allocator.replay import replay

            breakdown["allocator_overhead"] = replay(self.allocations.events, self.allocator_settings).overhead_bytes
        return RankPrediction(self.rank, sum(breakdown.values()), breakdown, {})


def predict_native(spec: WorkloadSpec, world_size: int, sparse_grads: bool,
                   allocator_settings=None) -> List[RankPrediction]:
    """Every rank's peak, from one dry run per distinct set of local tables: a rank's dry run reads of its
    tables only their rows, widths and pooling (the rest is the job's), so ranks that hold the same (at
    N=1024 most hold none) measure the same; one run each made N=1024 take 100 s."""
    from workloads.native import table_owners

    owners = table_owners(spec, world_size)
    measured: Dict[tuple, RankPrediction] = {}
    predictions = []
    for rank in range(world_size):
        key = tuple((table.physical_rows, table.embedding_dim, table.expected_pooling)
                    for table, owner in zip(spec.tables, owners) if owner == rank)
        if key not in measured:
            measured[key] = NativeDryRun(spec, rank, world_size, sparse_grads, allocator_settings).run()
        same = measured[key]
        predictions.append(dataclasses.replace(same, rank=rank, breakdown=dict(same.breakdown),
                                               features=dict(same.features)))
    return predictions
