"""Model backends the worker trains: `torchrec` (the reference: DMP, fbgemm fused tables) and `native`
(plain PyTorch, see workloads/native.py). Each builds its model and optimizers, turns a synthetic
batch into model input, and names the owners of its tensors for the memory breakdown."""
from __future__ import annotations

from typing import Callable, Dict, List, Protocol, Tuple

import torch
import torch.distributed as dist

from bench.run.torchrec_modules import comm_modules
from bench.run.memory.ownership import local_tensors, optimizer_state_tensors, torchrec_ownership
from bench.run.memory.recorder import MemoryRecorder


class Backend(Protocol):
    """What the worker needs of a model backend."""
    name: str
    imports: Tuple[str, ...]  # modules build() imports
    # (category its step allocations are charged to, optimizer), stepped in order after backward
    optimizers: List[Tuple[str, torch.optim.Optimizer]]
    plan_rows: List[dict]  # where each table lives, in the shape of sharding_plan.json

    def build(self, cfg, spec, launch, device: torch.device, rank: int, recorder: MemoryRecorder) -> None:
        """Build and shard the model and its optimizers on `device`."""

    def prepare(self, batch):
        """A synthetic batch as the model's input."""

    def loss(self, batch) -> torch.Tensor:
        ...

    def ownership(self) -> Dict[str, List[torch.Tensor]]:
        """Tensors by owner category (embedding weights, optimizer state, dense parameters, ...)."""

    def after_first_step(self, recorder: MemoryRecorder, log: Callable[[str], None]) -> None:
        """What can only be done once the first step has built everything lazily created."""


class TorchrecBackend:
    name = "torchrec"
    # what build() imports: an agent that forks its ranks imports them once for all (bench.run.agent)
    imports = ("torchrec.distributed.model_parallel", "torchrec.distributed.sharding_plan", "torchrec.optim.keyed",
               "torchrec.optim.optimizers", "workloads.model")

    def build(self, cfg, spec, launch, device: torch.device, rank: int, recorder: MemoryRecorder) -> None:
        from torchrec.distributed.model_parallel import DistributedModelParallel
        from torchrec.distributed.sharding_plan import get_default_sharders
        from torchrec.optim.keyed import KeyedOptimizerWrapper
        from torchrec.optim.optimizers import in_backward_optimizer_filter

        from workloads.model import build_model, dense_optimizer_class
        from bench.planning.torchrec_adapter import describe_plan, make_sharding_plan

        model = build_model(spec, dense_device=device)
        emulated = launch.emulated_rank is not None
        if emulated:  # no rank 0 to plan and broadcast, nor to answer DMP's validation question: both local
            from bench.run.torchrec_modules import skip_collective_validation

            skip_collective_validation()
        plan, _ = make_sharding_plan(cfg, spec, launch.world_size, launch.ranks_per_node, launch.device_type,
                                     launch.capacity_bytes, model, None if emulated else dist.GroupMember.WORLD)
        self.device = device
        self.model = DistributedModelParallel(module=model, device=device, plan=plan, sharders=get_default_sharders())
        dense_params = dict(in_backward_optimizer_filter(self.model.named_parameters()))
        optimizer_class = dense_optimizer_class(cfg.workload.dense_optimizer)
        self.dense_optimizer = KeyedOptimizerWrapper(
            dense_params, lambda params: optimizer_class(params, lr=cfg.workload.dense_lr))
        # (category its step allocations are charged to, optimizer); the embedding one is fused in backward
        self.optimizers = [("dense_optimizer", self.dense_optimizer)]
        self.plan_rows = describe_plan(plan)

    def prepare(self, batch):
        from workloads.model import to_torchrec_batch

        return to_torchrec_batch(batch, self.device)

    def loss(self, batch) -> torch.Tensor:
        loss, _ = self.model(batch)
        return loss

    def ownership(self) -> Dict[str, List[torch.Tensor]]:
        return torchrec_ownership(self.model, self.dense_optimizer)

    def after_first_step(self, recorder, log: Callable[[str], None]) -> None:
        hooked = install_comm_hooks(self.model, recorder)
        log(f"charging allocations in {hooked} torchrec comm modules to comm_buffers")


def install_comm_hooks(model, recorder: MemoryRecorder) -> int:
    """Allocations inside torchrec's all-to-all modules are comm buffers, when the recorder can tell.

    torchrec creates its input/output dist modules lazily in the first forward, so call this after it.
    """
    if not recorder.attributes_allocations:
        return 0
    modules = list(comm_modules(model))
    for module in modules:
        def pre_hook(mod, args):
            mod._membench_scope = recorder.category("comm_buffers")
            mod._membench_scope.__enter__()

        def post_hook(mod, args, out):
            scope = getattr(mod, "_membench_scope", None)
            if scope is not None:
                mod._membench_scope = None
                scope.__exit__(None, None, None)
        module.register_forward_pre_hook(pre_hook)
        module.register_forward_hook(post_hook)
    return len(modules)


class NativeBackend:
    name = "native"
    imports = ("torch.nn.parallel", "workloads.model", "workloads.native")

    def build(self, cfg, spec, launch, device: torch.device, rank: int, recorder: MemoryRecorder) -> None:
        from torch.nn.parallel import DistributedDataParallel

        from workloads.model import dense_optimizer_class
        from workloads.native import NativeDLRM, embedding_optimizer, plan_rows

        comm_scope = lambda: recorder.category("comm_buffers")  # noqa: E731
        self.device = device
        self.model = NativeDLRM(spec, rank, launch.world_size, device, sparse_grads=cfg.model.sparse_grads,
                                comm_scope=comm_scope)
        # like torchrec's DMP: dense part data-parallel, gradients as views of DDP's buckets
        self.model.dense = DistributedDataParallel(
            self.model.dense, gradient_as_bucket_view=True,
            device_ids=[device.index] if device.type == "cuda" else None)
        self.dense_optimizer = dense_optimizer_class(cfg.workload.dense_optimizer)(
            self.model.dense.parameters(), lr=cfg.workload.dense_lr)
        self.embedding_optimizer = None
        if len(self.model.bags):
            self.embedding_optimizer = embedding_optimizer(cfg.workload.embedding_optimizer,
                                                           self.model.bags.parameters(), cfg.workload.embedding_lr,
                                                           cfg.model.sparse_grads)
        self.optimizers = [(category, o) for category, o in (("dense_optimizer", self.dense_optimizer),
                                                              ("embedding_optimizer", self.embedding_optimizer))
                           if o is not None]
        self.plan_rows = plan_rows(spec, self.model.owners)
        # Embedding gradients are created in every backward (and freed by zero_grad). Charge what a table's
        # backward allocates to embedding_grads: from the gradient of its pooled output arriving (the
        # table's backward starts next) until the gradient is accumulated into the weight.
        scope = {"pending": 0}

        def table_backward_starts(grad):
            if scope["pending"] == 0:
                scope["open"] = recorder.category("embedding_grads")
                scope["open"].__enter__()
            scope["pending"] += 1

        def table_gradient_done(param):
            scope["pending"] = max(0, scope["pending"] - 1)
            if scope["pending"] == 0 and "open" in scope:
                scope.pop("open").__exit__(None, None, None)
            recorder.attribute({"embedding_grads": list(local_tensors(param.grad))})

        self.model.on_pooled = lambda pooled: pooled.register_hook(table_backward_starts)
        for param in self.model.bags.parameters():
            param.register_post_accumulate_grad_hook(table_gradient_done)

    def prepare(self, batch):
        return batch  # the native model takes membench's batch as is (moved piecewise in forward)

    def loss(self, batch) -> torch.Tensor:
        return self.model(batch)

    def ownership(self) -> Dict[str, List[torch.Tensor]]:
        embedding = list(self.model.bags.parameters())
        dense = list(self.model.dense.parameters())
        return {
            "embedding_weights": embedding,
            "embedding_grads": [t for p in embedding if p.grad is not None for t in local_tensors(p.grad)],
            "embedding_optimizer": optimizer_state_tensors(self.embedding_optimizer),
            "dense_params": dense,
            "dense_grads": [p.grad for p in dense if p.grad is not None],
            "dense_optimizer": optimizer_state_tensors(self.dense_optimizer),
        }

    def after_first_step(self, recorder, log: Callable[[str], None]) -> None:
        pass


BACKENDS = {"torchrec": TorchrecBackend, "native": NativeBackend}


def make_backend(name: str) -> Backend:
    return BACKENDS[name]()
