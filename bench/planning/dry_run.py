"""The dense part of a training step on the meta device, counted by the live-tensor tracker of real runs: the
dry run behind each rank's predicted peak (bench.planning.estimate).

Nothing is allocated: the model's dense arch, interaction, over arch, loss, backward and dense optimizer run on
`meta`, and the rank's sparse side (input and received ids, pooled lookups, the all-to-all buffers of forward
and backward, the batches a train pipeline holds in flight) is simulated by placeholders with torchrec's
lifetimes, so peaks that do not coincide are not simply added.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from bench.accounting.caching_allocator.replay import AllocationStream
from bench.planning.types import PooledGroup, RankShare
from bench.results.schema import IN_FLIGHT
from workloads.pipelines import PLAIN, PipelineKind, pipeline_kind
from workloads.spec import WorkloadSpec
from workloads.units import UNBOUNDED_BYTES

# what the dry run holds of data-parallel tables, counted in the plan's share instead
REPLICATED_CATEGORIES = ("embedding_weights", "embedding_grads", "embedding_optimizer")


def keep_gradients(tracker, params, category: str, one_bucket: bool = False) -> None:
    """Give `params` persistent gradients, as DDP's buckets are (gradient_as_bucket_view): allocated once and
    kept, backward adds into them, counted under `category`. Gradients made anew in every backward would
    count the layers already done twice at a backward peak. `one_bucket`: views of one flat tensor, as DDP
    keeps a dense arch's gradients (one allocation, as the caching allocator sees it)."""
    import torch

    with tracker:
        tracker.category = category
        if one_bucket and params and all(param.grad is None for param in params):
            flat = torch.zeros(sum(param.numel() for param in params), dtype=params[0].dtype,
                               device=params[0].device)
            for param, part in zip(params, flat.split([param.numel() for param in params])):
                param.grad = part.view_as(param)
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
    tracker.track_tensors([param.grad for param in params], category)


def track_optimizer_state(tracker, optimizer, category: str) -> None:
    """Count every tensor of `optimizer`'s state under `category`."""
    import torch

    for state in optimizer.state.values():
        tracker.track_tensors([v for v in state.values() if isinstance(v, torch.Tensor)], category)


@dataclass
class DenseDryRun:
    params_bytes: int
    optimizer_bytes: int
    peak_bytes: int  # params + grads + optimizer state + activations (+ simulated sparse buffers) at the peak
    grads_bytes: int = 0  # the persistent gradient buckets (DDP)
    in_flight_bytes: int = 0  # a train pipeline's batches held beyond the one trained, at the peak
    # for a GPU: the dry run's mallocs and frees, in order, to replay through the caching allocator model
    allocations: Optional[AllocationStream] = None
    # how many of them allocate the dense parameters: a rank places its tables after those (torchrec shards
    # the tables of a model built with its dense part), which the allocator's pools depend on
    params_events: int = 0


class DryRunModel:
    """The dense part of the model on `meta` (dense arch, interaction, over arch, dense optimizer),
    built once and stepped with placeholders for what the sharded embeddings allocate on a rank, and for the
    batches the train `pipeline` holds in flight."""

    def __init__(self, spec: WorkloadSpec, pipeline: PipelineKind = PLAIN):
        import torch
        from torch import nn
        from torchrec.sparse.jagged_tensor import KeyedTensor

        from workloads.model import build_model, dense_optimizer_class

        self.spec, self.meta = spec, torch.device("meta")
        self.pipeline = pipeline
        # what the pipeline holds now: whole batches, and distributed KJTs (tensors each), oldest first
        self._held_batches: list = []
        self._held_dists: list = []
        self._previous_received: list = []  # the last step's received ids and offsets (see _sparse_forward)
        cfg = spec.config
        # the tables are replaced below: they need no optimizer (1,000 of them take 0.4 s to attach one to)
        self.dlrm = build_model(spec, self.meta, embedding_optimizer_attached=False).model
        self.params = [p for name, p in self.dlrm.named_parameters() if "sparse_arch" not in name]
        self.optimizer = dense_optimizer_class(cfg.dense_optimizer)(self.params, lr=cfg.dense_lr)
        self.keys = [t.feature_name for t in spec.tables]
        self.dims = [t.embedding_dim for t in spec.tables]
        self._sparse_side = None  # set per step: makes the pooled values when the sparse arch runs
        model = self

        class PooledEmbeddings(nn.Module):
            def forward(self, features):
                # the sparse side runs here, after the dense arch (DLRM.forward's order: the bottom MLP's
                # activations are alive during the all-to-all); the pooled values are handed over, not kept:
                # torchrec's sparse arch concatenates them and drops them
                values = model._sparse_side()
                return KeyedTensor(keys=model.keys, length_per_key=model.dims, values=values)

        self.dlrm.sparse_arch.embedding_bag_collection = PooledEmbeddings()
        # what the pipeline keeps until the sparse arch has its pooled values (its input dist's awaitables)
        self._through_sparse_arch: list = []
        self.dlrm.sparse_arch.register_forward_hook(lambda module, args, out: self._through_sparse_arch.clear())

    def run(self, share: Optional[RankShare] = None, world_size: int = 1, steps: int = 2,
            record_allocations: bool = False) -> DenseDryRun:
        """Two training steps counted by the live-tensor tracker. With a `share`, the sparse side of
        the rank is simulated too: input ids, received ids (kept for the fused backward), the pooled
        lookups and the all-to-all buffers of forward and backward, with the lifetimes torchrec gives them
        (a collective's buffers go when the training thread drops them, as the CPU recorder counts them)."""
        allocations = AllocationStream() if record_allocations else None
        in_flight_at_peak = 0  # the pipeline's batches at the peak

        def on_new_peak() -> None:
            nonlocal in_flight_at_peak
            if tracker is not None:  # (the tracker being built counts the static tensors: nothing in flight)
                in_flight_at_peak = tracker.by_category.get(IN_FLIGHT, 0)

        tracker = None
        tracker, params_events = self._tracker(allocations, on_new_peak)
        replicated = self._replicated_optimizer(tracker, share)
        with tracker:
            for _ in range(steps):
                self._step(tracker, share, world_size, replicated)
            self._held_batches.clear()
            self._held_dists.clear()
            self._previous_received.clear()
        # the replicated tables, their gradient buckets and optimizer state are in the plan's share already
        replicated_bytes = sum(tracker.by_category.get(category, 0) for category in REPLICATED_CATEGORIES)
        return DenseDryRun(params_bytes=tracker.by_category.get("dense_params", 0),
                           optimizer_bytes=tracker.by_category.get("dense_optimizer", 0),
                           peak_bytes=tracker.peak_bytes - replicated_bytes, allocations=allocations,
                           grads_bytes=tracker.by_category.get("dense_grads", 0), in_flight_bytes=in_flight_at_peak,
                           params_events=params_events)

    def _replicated_optimizer(self, tracker, share: Optional[RankShare]):
        """The data-parallel tables as meta parameters with persistent gradients (DDP's buckets) and the dense
        optimizer over them (torchrec steps them with it): its step's temporaries are a full table's."""
        import torch

        from workloads.model import dense_optimizer_class

        if share is None or not share.replicated_tables:
            return None
        cfg = self.spec.config
        with tracker:
            tracker.category = "embedding_weights"
            params = [torch.nn.Parameter(torch.empty(rows, dim, device=self.meta))
                      for rows, dim in share.replicated_tables]
        keep_gradients(tracker, params, "embedding_grads")
        return dense_optimizer_class(cfg.dense_optimizer)(params, lr=cfg.dense_lr)

    def _tracker(self, allocator=None, on_new_peak=None):
        """The live-tensor tracker of a dry run, holding the dense part's parameters, optimizer state and
        gradient buckets; and how many of `allocator`'s events allocate the parameters."""
        from bench.accounting.live_tensors import LiveTensorTracker

        tracker = LiveTensorTracker(self.meta, capacity_bytes=UNBOUNDED_BYTES, rank=0, allocator=allocator,
                                    on_new_peak=on_new_peak)
        tracker.track_tensors(self.params, "dense_params")
        params_events = len(allocator.events) if allocator is not None else 0
        track_optimizer_state(tracker, self.optimizer, "dense_optimizer")
        keep_gradients(tracker, self.params, "dense_grads", one_bucket=True)
        return tracker, params_events

    def _empty(self, n, dtype=None):
        import torch

        return torch.empty(max(0, int(n)), dtype=dtype or torch.float32, device=self.meta)

    def _step(self, tracker, share: Optional[RankShare], world_size: int, replicated=None) -> None:
        """One training step; every tensor it allocates is gone when it returns."""
        from torch import nn

        cfg = self.spec.config
        batch, total_dims = cfg.batch_size, sum(self.dims)
        self._hold_in_flight(tracker, "input", share, world_size)
        tracker.category = "activations"
        dense, labels = self._empty(batch * cfg.num_dense_features).view(batch, -1), self._empty(batch)
        held: list = []  # the lookups' gradient a backward all-to-all allocates, until the anchor's hook
        kept: list = []  # the trained batch's ids and lengths, until the step ends
        forward_only: list = []  # what it keeps until the forward ends
        if share is not None:
            kept.append(self._ids())

            def sparse_side():
                return self._sparse_forward(share, world_size, held)
        else:
            def sparse_side():
                return self._empty(batch * total_dims).view(batch, total_dims).requires_grad_()
        self._sparse_side = sparse_side
        self._hold_in_flight(tracker, "forward", share, world_size)
        if self.pipeline.holds_input_dist_through_sparse_arch:
            self._through_sparse_arch.extend(self._send_copy(share) + self._received(share, world_size))
        if self.pipeline.holds_received_through_forward:
            forward_only.extend(self._received(share, world_size))
        logits = self.dlrm(dense, None).squeeze(-1)
        self._sparse_side = None  # its closure holds `kept`: nothing of the step may outlive it
        forward_only.clear()
        loss = nn.functional.binary_cross_entropy_with_logits(logits, labels)
        if self.pipeline.drops_trained_batch_after_forward and kept:
            kept[0] = None  # the trained batch's ids and lengths
        self._hold_in_flight(tracker, "backward", share, world_size)
        loss.backward()
        held.clear()
        self._hold_in_flight(tracker, "optimizer", share, world_size)
        tracker.category = "dense_optimizer"
        self.optimizer.step()
        if replicated is not None:
            tracker.category = "activations"  # its step's temporaries; the state it creates is retagged below
            replicated.step()
            track_optimizer_state(tracker, replicated, "embedding_optimizer")
        self.optimizer.zero_grad(set_to_none=False)  # the buckets stay

    def _ids(self) -> list:
        """A batch's ids and lengths (a KeyedJaggedTensor's values and lengths)."""
        import torch

        batch = self.spec.config.batch_size
        total_pooling = sum(t.expected_pooling for t in self.spec.tables)
        # lengths first, as the data stream makes them (a list frees its items last to first: the ids first)
        lengths = self._empty(len(self.dims) * batch, torch.int32)
        return [lengths, self._empty(batch * total_pooling, torch.int64)]

    def _batch(self) -> list:
        """One whole batch as the data stream makes it: ids, lengths, dense features, labels."""
        cfg = self.spec.config
        return self._ids() + [self._empty(cfg.batch_size * cfg.num_dense_features), self._empty(cfg.batch_size)]

    def _distributed_kjt(self, share: Optional[RankShare], world_size: int) -> list:
        """A batch's input all-to-all: the send copy of this rank's ids and lengths of the sharded tables (grouped
        by destination; none when the plan needs no permute: the batch's own tensors are sent), what it receives
        for the shards it looks up, and the splits (lengths and values per peer); nothing when every table is
        data-parallel (no all-to-all)."""
        import torch

        share = share or RankShare()
        if self._sharded_features(share) <= 0:
            return []
        return self._send_copy(share) + self._received_ids(share, world_size) + [
            self._empty(2 * world_size, torch.int64)]

    def _send_copy(self, share: Optional[RankShare]) -> list:
        """The permuted copy of a batch's ids and lengths its input all-to-all sends (none when torchrec sends
        the batch's own tensors: no permute, or every table data-parallel)."""
        import torch

        batch = self.spec.config.batch_size
        if share is None or not share.input_permuted or self._sharded_features(share) <= 0:
            return []
        return [self._empty(batch * self._sharded_pooling(share), torch.int64),
                self._empty(batch * self._sharded_features(share), torch.int32)]

    def _received(self, share: Optional[RankShare], world_size: int) -> list:
        """What this rank receives in a batch's input all-to-all: ids, lengths and the int32 splits per peer."""
        import torch

        if share is None or share.sent_features <= 0:
            return []
        return self._received_ids(share, world_size) + [self._empty(world_size, torch.int32)]

    def _received_ids(self, share: RankShare, world_size: int) -> list:
        """The ids and lengths a batch's input all-to-all brings this rank for the shards it looks up."""
        import torch

        batch = self.spec.config.batch_size
        return [self._empty(batch * world_size * share.sent_pooling, torch.int64),
                self._empty(batch * world_size * share.sent_features, torch.int32)]

    def _hold_in_flight(self, tracker, phase: str, share: Optional[RankShare], world_size: int) -> None:
        """Hold as many batches and distributed KJTs beyond the trained one as the pipeline does in `phase` (the
        oldest go first: they became the trained batch)."""
        batches, dists = self.pipeline.held(phase)
        previous, tracker.category = tracker.category, IN_FLIGHT
        for held, count, make in ((self._held_batches, batches, self._batch),
                                  (self._held_dists, dists, lambda: self._distributed_kjt(share, world_size))):
            del held[:max(0, len(held) - count)]
            while len(held) < count:
                held.append(make())
        tracker.category = previous

    def _sparse_forward(self, share: RankShare, world_size: int, held: list):
        """The rank's sparse side: the pooled embeddings the dense part consumes (handed to the sparse arch). What
        the fused backward keeps, the received ids and the lookup kernel's offsets, lives on until this point of
        the next step, as torchrec's context holds it. Allocated and freed in the order a real rank's stream shows
        (the allocator's pools depend on it)."""
        import torch

        batch = self.spec.config.batch_size
        received = batch * world_size * share.sent_features  # the bags this rank's lookups serve
        ids = batch * world_size * share.sent_pooling
        # the input all-to-all: the permuted send copy of the batch's ids, the received lengths and ids; the
        # KJT the lookups get copies them (the all-to-all's outputs and the send copy go)
        send_copy = [self._empty(batch * self._sharded_features(share), torch.int32),
                     self._empty(batch * self._sharded_pooling(share), torch.int64)] if share.input_permuted else []
        lengths, output = self._empty(received, torch.int32), self._empty(ids, torch.int64)
        lookups_only = [self._empty(received, torch.int32)]  # the KJT's lengths, then its int32 offsets
        kept_ids = self._empty(ids, torch.int64)
        del output, lengths, send_copy
        lookups_only.append(self._empty(received + 1, torch.int32))
        # the last step's go now, ids first (a list frees its items last to first)
        self._previous_received = [self._empty(received + 1, torch.int64), kept_ids]  # the kernel's offsets, ids
        del kept_ids
        outputs = [self._pooled_group(group, world_size, held, share) for group in groups_of(share, sum(self.dims))]
        # torchrec concatenates the groups' pooled values (one group: handed on as they are)
        pooled = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        del outputs, lookups_only  # the received KJT's lengths and int32 offsets go once the lookups are done
        return pooled

    def _sharded_pooling(self, share: RankShare) -> float:
        """Mean ids per sample of the tables that cross the input all-to-all (all but the data-parallel ones)."""
        return sum(t.expected_pooling for t in self.spec.tables) - share.replicated_pooling

    def _sharded_features(self, share: RankShare) -> int:
        """How many of the batch's features cross the input all-to-all (all but the data-parallel tables')."""
        return len(self.spec.tables) - share.replicated_features

    def _pooled_group(self, group: PooledGroup, world_size: int, held: list, share: RankShare):
        """One group's lookups and its all-to-all (a data-parallel group: its local lookups alone), as the
        pooled values the rank gets back for its batch."""
        batch = self.spec.config.batch_size
        sent = int(batch * world_size * group.sent_dims)
        # in torchrec's order (the allocator's pools depend on it): the lookups, the receive buffer, the send copy
        # registered for the collective; the send copy goes once the collective is done, then the lookups
        lookups = self._empty(sent)
        received = self._empty(batch * group.dims)
        send_copy = self._empty(sent)
        del send_copy, lookups
        # received is the output of torchrec's all-to-all, not a leaf (a leaf would live on in its AccumulateGrad
        # node until backward ends): the gradient flows to an empty leaf instead
        anchor = self._empty(0).requires_grad_()
        # the lookups' gradient goes once the all-to-all's backward has let go of its input (the fused backward
        # consumes it next): when the anchor's gradient arrives
        anchor.register_hook(lambda grad: held.clear())
        return self._all_to_all(group, sent, held, share).apply(anchor, received)

    def _all_to_all(self, group: PooledGroup, sent: int, held: list, share: RankShare):
        """A group's pooled all-to-all as an autograd function whose backward allocates what torchrec's does:
        a registered copy of the gradient and the gradient of the lookups; for data-parallel tables, their
        dense backward's gradient of the full tables."""
        import torch

        batch, empty = self.spec.config.batch_size, self._empty

        class AllToAll(torch.autograd.Function):
            @staticmethod
            def forward(ctx, anchor, received):
                # the awaitable's wait hands on a new tensor (its receive buffer goes)
                return torch.empty((batch, group.dims), device=received.device)

            @staticmethod
            def backward(ctx, grad):
                if not group.all_to_all:
                    # added into DDP's bucket and freed (the pooled output's gradient is a slice of `grad`)
                    replicated = empty(share.grad_bytes // 4)
                    del replicated
                    return empty(0), None
                # the KeyedTensor's backward: the gradient split per feature, then concatenated into the send
                # copy registered for the collective (freed once it is done)
                dims = self.dims if group.dims == sum(self.dims) else [group.dims]
                parts = [empty(batch * dim) for dim in dims]
                registered = empty(grad.numel())
                del parts
                held.append(empty(sent))  # the lookups' gradient
                del registered
                return empty(0), None

        return AllToAll


def groups_of(share: RankShare, total_dims: int) -> List[PooledGroup]:
    """The share's pooled groups; a share without them (not read from a torchrec plan): its sharded tables in
    one all-to-all, then its data-parallel ones."""
    if share.pooled_groups:
        return share.pooled_groups
    groups = [PooledGroup(total_dims - share.replicated_dims, share.sent_dims)]
    return groups + ([PooledGroup(share.replicated_dims, 0, False)] if share.replicated_dims else [])


def dry_run_for(cfg, spec: WorkloadSpec) -> DryRunModel:
    """The dry-run model of a run config: its workload, trained through its pipeline."""
    return DryRunModel(spec, pipeline_kind(cfg.pipeline.name))
