"""Who owns which tensors in a sharded torchrec model: the static part of the breakdown.

Uses public torchrec surfaces where they exist (state_dict shards, fused_optimizer state); the comm
modules are found by class so that buffers they allocate are charged to `comm_buffers`.
"""
from __future__ import annotations

from typing import Dict, Iterable, Iterator, List

import torch
from torch import nn

EMBEDDING_MODULE_KEY = "sparse_arch"  # DLRM keeps its EmbeddingBagCollection here


def _local_tensors(value) -> Iterator[torch.Tensor]:
    """The tensors of this rank inside a Tensor, ShardedTensor or DTensor."""
    if hasattr(value, "local_shards"):
        for shard in value.local_shards():
            yield shard.tensor
    elif hasattr(value, "to_local"):
        yield value.to_local()
    elif isinstance(value, torch.Tensor):
        yield value


def _state_tensors(state: Dict) -> Iterator[torch.Tensor]:
    for per_param in state.values():
        if isinstance(per_param, dict):
            for value in per_param.values():
                yield from _local_tensors(value)
        else:
            yield from _local_tensors(per_param)


def torchrec_ownership(model: nn.Module, dense_optimizer: torch.optim.Optimizer) -> Dict[str, List[torch.Tensor]]:
    embedding_weights: List[torch.Tensor] = []
    for key, value in model.state_dict().items():
        if EMBEDDING_MODULE_KEY in key:
            embedding_weights.extend(_local_tensors(value))
    embedding_ids = {t.untyped_storage()._cdata for t in embedding_weights}
    embedding_optimizer = list(_state_tensors(model.fused_optimizer.state_dict()["state"]))

    dense_params, dense_grads = [], []
    for param in model.parameters():
        local = list(_local_tensors(param))
        if any(t.untyped_storage()._cdata in embedding_ids for t in local):
            continue
        dense_params.extend(local)
        if param.grad is not None:
            dense_grads.extend(_local_tensors(param.grad))
    dense_optimizer_state = list(_state_tensors(dense_optimizer.state_dict()["state"]))
    return {
        "embedding_weights": embedding_weights,
        "embedding_optimizer": embedding_optimizer,
        "dense_params": dense_params,
        "dense_grads": dense_grads,
        "dense_optimizer": dense_optimizer_state,
    }


DIST_ATTRIBUTES = ("_input_dists", "_output_dists")


def comm_modules(model: nn.Module) -> Iterable[nn.Module]:
    """torchrec's input/output distribution modules (all-to-all of ids and pooled embeddings).

    Sharded collections keep them in plain lists (private, created in the first forward), so
    `model.modules()` does not reach them; this is the one place that knows where they live.
    """
    for module in model.modules():
        for attribute in DIST_ATTRIBUTES:
            for dist_module in getattr(module, attribute, None) or []:
                if isinstance(dist_module, nn.Module):
                    yield dist_module
