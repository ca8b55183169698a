"""torchrec model for a workload: an EmbeddingBagCollection on `meta` plus DLRM or DLRM_DCN.

Tables are built on the meta device so that DistributedModelParallel materializes only each rank's
shards; the embedding optimizer is attached with `_apply_optimizer_in_backward` so torchrec fuses it
into fbgemm's backward (and the planner counts its state).
"""
from __future__ import annotations

from typing import List

import torch
from torch import nn

from workloads.data import Batch
from workloads.spec import WorkloadSpec


def embedding_optimizer(name: str):
    """(optimizer class, kwargs) for an embedding optimizer name, as torchrec maps it onto fbgemm."""
    import torchrec.optim as trec_optim

    if name == "sgd":
        return torch.optim.SGD, {}
    if name == "rowwise_adagrad":
        return trec_optim.RowWiseAdagrad, {"eps": 1e-8}
    if name == "adam":
        return torch.optim.Adam, {"eps": 1e-8}
    raise ValueError(f"unknown embedding optimizer {name!r}")


def dense_optimizer_class(name: str):
    return {"sgd": torch.optim.SGD, "adagrad": torch.optim.Adagrad, "adam": torch.optim.Adam}[name]


def embedding_bag_configs(spec: WorkloadSpec) -> List["EmbeddingBagConfig"]:
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig

    data_type = {"fp32": DataType.FP32, "fp16": DataType.FP16}[spec.config.data_type]
    return [
        EmbeddingBagConfig(
            name=table.name,
            feature_names=[table.feature_name],
            # plan_only workloads are sized by their virtual rows: nothing is allocated on meta
            num_embeddings=table.physical_rows or table.virtual_rows,
            embedding_dim=table.embedding_dim,
            data_type=data_type,
        )
        for table in spec.tables
    ]


def build_model(spec: WorkloadSpec, dense_device: torch.device, embedding_optimizer_attached: bool = True) -> nn.Module:
    """DLRMTrain around DLRM / DLRM_DCN, embedding tables on meta, optimizer in backward attached (unless
    `embedding_optimizer_attached` is false: a dry run of the dense part never shards the tables)."""
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    cfg = spec.config
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(spec), device=torch.device("meta"))
    common = dict(
        embedding_bag_collection=ebc,
        dense_in_features=cfg.num_dense_features,
        dense_arch_layer_sizes=list(cfg.dense_arch),
        over_arch_layer_sizes=list(cfg.over_arch),
        dense_device=dense_device,
    )
    # DCN's cross layers take no device and start on the default one: made there directly, a dry run on
    # meta never allocates (nor initializes) a terabyte workload's 1.6 GB of cross weights on the host
    with dense_device:
        if cfg.arch == "dlrm_dcn":
            dlrm = DLRM_DCN(dcn_num_layers=cfg.dcn_num_layers, dcn_low_rank_dim=cfg.dcn_low_rank_dim, **common)
        else:
            dlrm = DLRM(**common)
    model = DLRMTrain(dlrm)
    if not embedding_optimizer_attached:
        return model
    # imported here: torch.distributed.optim costs a dry run (which never attaches it) a second
    from torch.distributed.optim import _apply_optimizer_in_backward

    optimizer_class, kwargs = embedding_optimizer(cfg.embedding_optimizer)
    _apply_optimizer_in_backward(optimizer_class, model.model.sparse_arch.parameters(),
                                 {"lr": cfg.embedding_lr, **kwargs})
    return model


def to_torchrec_batch(batch: Batch, device: torch.device):
    """Our torchrec-free Batch as torchrec's `datasets.utils.Batch` (what DLRMTrain consumes)."""
    from torchrec.datasets.utils import Batch as TorchrecBatch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    sparse = KeyedJaggedTensor(keys=batch.keys, values=batch.values, lengths=batch.lengths)
    return TorchrecBatch(dense_features=batch.dense_features, sparse_features=sparse,
                         labels=batch.labels).to(device)
