"""Who owns which tensors in a sharded torchrec model: the static part of the breakdown.

Uses public torchrec surfaces (state_dict shards, fused_optimizer state); the comm modules, whose
buffers are charged to `comm_buffers`, are found by the torchrec adapter (private attributes).
"""
from __future__ import annotations

from typing import Dict, Iterator, List

import torch
from torch import nn

EMBEDDING_MODULE_KEY = "sparse_arch"  # DLRM keeps its EmbeddingBagCollection here
# fbgemm's SplitTableBatchedEmbeddingBagsCodegen buffers of a UVM-caching table: the HBM cache itself, and
# the cache's bookkeeping (the groups fbgemm's own memory breakdown report uses, plus its small constants)
CACHE_WEIGHTS = ("lxu_cache_weights",)
CACHE_STATE = ("cache_index_table_map", "lxu_cache_state", "lxu_state", "lxu_cache_locking_counter",
               "cache_hash_size_cumsum", "cache_miss_counter")


def local_tensors(value) -> Iterator[torch.Tensor]:
    """The dense tensors of this rank inside a Tensor, sparse COO tensor, ShardedTensor or DTensor."""
    if hasattr(value, "local_shards"):  # before .is_sparse, which ShardedTensor does not support
        for shard in value.local_shards():
            yield shard.tensor
    elif hasattr(value, "to_local"):
        yield value.to_local()
    elif isinstance(value, torch.Tensor) and value.is_sparse:
        yield value._indices()
        yield value._values()
    elif isinstance(value, torch.Tensor):
        yield value


def _state_tensors(per_param: Dict) -> Iterator[torch.Tensor]:
    """The tensors of one parameter's optimizer state (a dict of state entries, or a single value)."""
    for value in per_param.values() if isinstance(per_param, dict) else [per_param]:
        yield from local_tensors(value)


def optimizer_state_tensors(optimizer) -> List[torch.Tensor]:
    """Every state tensor of a plain torch optimizer (none for None)."""
    if optimizer is None:
        return []
    return [t for per_param in optimizer.state.values() for t in _state_tensors(per_param)]


def torchrec_ownership(model: nn.Module, dense_optimizer) -> Dict[str, List[torch.Tensor]]:
    """Tensors by owner category. `dense_optimizer` is a torchrec KeyedOptimizer (state keyed by name):
    it also steps data-parallel tables, whose state is embedding optimizer state."""
    owned: Dict[str, List[torch.Tensor]] = {category: [] for category in (
        "embedding_weights", "embedding_grads", "embedding_optimizer", "dense_params", "dense_grads",
        "dense_optimizer")}
    owned.update(embedding_cache_tensors(model))
    # state_dict reaches the fused (fbgemm) tables' shards, which are not parameters of the model
    for key, value in model.state_dict().items():
        if EMBEDDING_MODULE_KEY in key:
            owned["embedding_weights"].extend(local_tensors(value))
    for name, param in model.named_parameters():
        is_embedding = EMBEDDING_MODULE_KEY in name
        owned["embedding_weights" if is_embedding else "dense_params"].extend(local_tensors(param))
        if param.grad is not None:
            owned["embedding_grads" if is_embedding else "dense_grads"].extend(local_tensors(param.grad))
    for per_param in model.fused_optimizer.state_dict()["state"].values():
        owned["embedding_optimizer"].extend(_state_tensors(per_param))
    for name, per_param in dense_optimizer.state_dict()["state"].items():
        category = "embedding_optimizer" if EMBEDDING_MODULE_KEY in str(name) else "dense_optimizer"
        owned[category].extend(_state_tensors(per_param))
    return owned


def embedding_cache_tensors(model: nn.Module) -> Dict[str, List[torch.Tensor]]:
    """The HBM cache and cache bookkeeping of every fbgemm table-batched embedding module with a cache
    (fused_uvm_caching). Static, allocated at build through the caching allocator: without a category they
    were counted as activations (audit N11). Modules without a cache hold these buffers empty."""
    owned: Dict[str, List[torch.Tensor]] = {"embedding_cache": [], "embedding_cache_state": []}
    for module in model.modules():
        cache = getattr(module, CACHE_WEIGHTS[0], None)
        if not isinstance(cache, torch.Tensor) or cache.numel() == 0:
            continue
        for category, names in (("embedding_cache", CACHE_WEIGHTS), ("embedding_cache_state", CACHE_STATE)):
            owned[category].extend(t for t in (getattr(module, name, None) for name in names)
                                   if isinstance(t, torch.Tensor) and t.numel())
    return owned
