"""Audit N11: the HBM cache of fused_uvm_caching tables (fbgemm's lxu_cache_weights, allocated at build
through the caching allocator) and its bookkeeping belonged to no breakdown category, so a GPU run counted
them as activations. The attribute names are read off a real fbgemm module (the CPU build, whose cache is
empty); the cache a CUDA build would hold is planted in its buffers."""
from __future__ import annotations

import torch
from torch import nn

from bench.results.schema import CATEGORIES
from bench.run.memory.ownership import embedding_cache_tensors


def real_tbe():
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                        SplitTableBatchedEmbeddingBagsCodegen)

    return SplitTableBatchedEmbeddingBagsCodegen([(1000, 16, EmbeddingLocation.HOST, ComputeDevice.CPU)])


def test_a_cached_tables_cache_and_bookkeeping_have_categories_of_their_own():
    assert {"embedding_cache", "embedding_cache_state"} <= set(CATEGORIES)
    tbe = real_tbe()
    model = nn.ModuleDict({"sparse_arch": tbe})
    assert embedding_cache_tensors(model) == {"embedding_cache": [], "embedding_cache_state": []}  # no cache
    slots = 200  # caching_ratio 0.2 of 1000 rows
    tbe.lxu_cache_weights = torch.zeros(slots, 16)
    tbe.lxu_cache_state = torch.zeros(slots, dtype=torch.int64)
    tbe.lxu_state = torch.zeros(slots, dtype=torch.int64)
    tbe.cache_index_table_map = torch.zeros(1000, dtype=torch.int32)
    owned = embedding_cache_tensors(model)
    assert [t.nbytes for t in owned["embedding_cache"]] == [slots * 16 * 4]
    state_bytes = sum(t.nbytes for t in owned["embedding_cache_state"])
    # 4 B x rows + 8 B x slots + 8 B x slots (FBGEMM #3114's bookkeeping) + fbgemm's small constants
    assert 4 * 1000 + 8 * slots + 8 * slots <= state_bytes < 4 * 1000 + 16 * slots + 64
