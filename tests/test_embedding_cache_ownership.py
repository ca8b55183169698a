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


def test_a_cuda_run_of_a_cached_table_reports_cache_bookkeeping_and_uvm_bytes_apart():
    """The GPU path end to end with fakes of fbgemm's UVM tensors: a real fbgemm module whose weights are
    (faked) managed memory and whose cache and bookkeeping are planted on the device. The CUDA recorder leaves
    the managed weights out of the allocator's categories and reports them as `uvm_bytes` (host memory); the
    cache and its bookkeeping get their own categories, and `activations` is what remains of allocated (before
    the N11 fix it held the cache). meta tensors stand in for the device's."""
    from bench.run.memory.cuda import CudaRecorder
    from bench.run.memory.cuda_stats import CudaAllocatorStats

    device, mib, rows, slots = torch.device("meta"), 1 << 20, 1 << 20, 1 << 18
    tbe = real_tbe()
    managed = torch.empty(rows, 64, device=device)  # the table in managed memory: 256 MiB
    tbe.lxu_cache_weights = torch.empty(slots, 64, device=device)  # 64 MiB of HBM cache
    tbe.lxu_cache_state = torch.empty(slots, dtype=torch.int64, device=device)
    tbe.lxu_state = torch.empty(slots, dtype=torch.int64, device=device)
    tbe.cache_index_table_map = torch.empty(rows, dtype=torch.int32, device=device)
    state_bytes = 4 * rows + 16 * slots  # 8 MiB
    ownership = {"embedding_weights": [managed], **embedding_cache_tensors(nn.ModuleDict({"sparse_arch": tbe}))}
    stats = CudaAllocatorStats(allocated_bytes=90 * mib, peak_allocated_bytes=100 * mib, reserved_bytes=128 * mib,
                               peak_reserved_bytes=128 * mib)
    recorder = CudaRecorder(0, device, 80 << 30, None, 0, read_stats=lambda d: stats, reset_peaks=lambda d: None,
                            sampler=None, synchronize=lambda d: None, is_uvm=lambda t: t is managed)
    recorder.sampler = None
    recorder.attribute(ownership)
    with recorder.phase(0, "forward"):
        pass
    result = recorder.result("ok")
    b = result.breakdown
    assert recorder.uvm_bytes == rows * 64 * 4 and result.allocator["uvm_bytes"] == rows * 64 * 4
    assert b["embedding_weights"] == 0
    assert b["embedding_cache"] == 64 * mib and b["embedding_cache_state"] == state_bytes
    assert b["activations"] == 100 * mib - 64 * mib - state_bytes and b["other"] == 0
