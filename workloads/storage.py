"""Bytes of embedding storage: the one place the weight and optimizer-state formulas live.

Embedding tables sharded by torchrec keep their optimizer fused in fbgemm's table-batched kernels,
which hold optimizer state in fp32 whatever the weights' dtype (`optimizer_state_dtypes` is unset):

* weights:          rows * dim * bytes_per_element (4 fp32, 2 fp16)
* sgd:              0                      (EXACT_SGD keeps no state)
* rowwise_adagrad:  rows * 4               (EXACT_ROWWISE_ADAGRAD: one fp32 `momentum1` per row)
* adam:             2 * rows * dim * 4     (ADAM: fp32 `momentum1` and `momentum2` per element)

Tables that are replicated (data_parallel) are stepped by the dense optimizer instead (a plain torch
optimizer): adagrad keeps one state per element, adam two, sgd none.
"""
from __future__ import annotations

from typing import Tuple

from workloads.spec import TableSpec

# Embedding optimizers membench can fuse into the backward (fbgemm), and dense (torch) optimizers
EMBEDDING_OPTIMIZERS = ("sgd", "rowwise_adagrad", "adam")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")
STATE_BYTES = 4  # optimizer state is fp32
# torch optimizers: state tensors of a parameter's shape
DENSE_STATES_PER_ELEMENT = {"sgd": 0, "adagrad": 1, "adam": 2}


def optimizer_state_bytes(optimizer: str, rows: int, cols: int) -> int:
    """State bytes of `rows` x `cols` of a table under `optimizer` (an embedding optimizer, fused, or a
    dense one stepping a replicated table)."""
    if optimizer == "rowwise_adagrad":
        return rows * STATE_BYTES
    if optimizer in DENSE_STATES_PER_ELEMENT:
        return DENSE_STATES_PER_ELEMENT[optimizer] * rows * cols * STATE_BYTES
    raise ValueError(f"unknown optimizer {optimizer!r}; expected one of "
                     f"{', '.join(sorted(set(EMBEDDING_OPTIMIZERS) | set(DENSE_OPTIMIZERS)))}")


def weight_bytes(rows: int, cols: int, bytes_per_element: int) -> int:
    return rows * cols * bytes_per_element


def table_storage(table: TableSpec, embedding_optimizer: str, rows: int | None = None) -> Tuple[int, int]:
    """(weight_bytes, optimizer_bytes) of `rows` rows of `table` (default: all its VIRTUAL rows, what
    plan mode places) under a fused embedding optimizer."""
    if embedding_optimizer not in EMBEDDING_OPTIMIZERS:
        raise ValueError(f"unknown embedding optimizer {embedding_optimizer!r}; expected one of "
                         f"{EMBEDDING_OPTIMIZERS}")
    rows = table.virtual_rows if rows is None else int(rows)
    return (weight_bytes(rows, table.embedding_dim, table.bytes_per_element),
            optimizer_state_bytes(embedding_optimizer, rows, table.embedding_dim))


def materialized_bytes(table: TableSpec, embedding_optimizer: str) -> int:
    """Weights + optimizer state of the rows this machine materializes (its physical rows)."""
    return sum(table_storage(table, embedding_optimizer, rows=table.physical_rows))
