"""The sharded torchrec model at run time: the one place that reads its private state (where its all-to-all
modules live, and the once-per-process guard of DistributedModelParallel's collective validation).

torchrec is imported inside the functions, so importing this module never loads torchrec.
"""
from __future__ import annotations

from typing import Iterable

DIST_ATTRIBUTES = ("_input_dists", "_output_dists")


def comm_modules(model) -> Iterable:
    """torchrec's input/output distribution modules (all-to-all of ids and pooled embeddings).

    Sharded collections keep them in plain lists (private, created in the first forward), so
    `model.modules()` does not reach them; this is the one place that knows where they live.
    """
    import torch

    for module in model.modules():
        for attribute in DIST_ATTRIBUTES:
            for dist_module in getattr(module, attribute, None) or []:
                if isinstance(dist_module, torch.nn.Module):
                    yield dist_module


def skip_collective_validation() -> None:
    """DistributedModelParallel asks rank 0 whether to validate collectives (`init_collective_validation`: a
    broadcast of a pickled flag); an emulated rank has no rank 0 to answer, so the question is settled here
    as torchrec's default answers it (validation off), before any model is built."""
    from torchrec.distributed import collective_utils

    collective_utils._INITIALIZED = True  # noqa: SLF001 (torchrec's own once-per-process guard)


def observe_kjt_splits(on_split) -> None:
    """Call on_split(kjt, key_splits, splits) each time this process splits a KeyedJaggedTensor for an
    all-to-all: torchrec's KJTAllToAll and the train pipelines' fused form of it both begin with the tensor's
    `dist_splits` (the sizes each destination gets), the one place both pass. For an emulated rank's process
    only (bench.run.peer_batches): it wraps torchrec's class for the rest of the process."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    original = KeyedJaggedTensor.dist_splits

    def dist_splits(self, key_splits):
        splits = original(self, key_splits)
        on_split(self, key_splits, splits)
        return splits

    KeyedJaggedTensor.dist_splits = dist_splits
