"""CUDA allocator history and snapshots for pytorch.org/memory_viz.

torch.cuda.memory._record_memory_history and _dump_snapshot are private APIs; each is called in
exactly one function here so a signature change in PyTorch is a one-line fix.
`backend` defaults to torch.cuda.memory and exists so tests can pass a fake module.
"""
from __future__ import annotations

import os
from typing import Any


def _resolve(backend: Any) -> Any:
    if backend is None:
        import torch.cuda.memory  # lazy: importing torch is slow and most callers never snapshot

        return torch.cuda.memory
    return backend


# Python frames only: C++ stacks make a 100k-entry dump take minutes (torchtitan measured 461 s vs 4 s),
# long enough to outlast the watchdog at an OOM or the peers' collective timeout at the end of a run.
STACKS = "python"


def _record_history(enabled: str | None, max_entries: int | None, backend: Any) -> None:
    """Sole caller of torch.cuda.memory._record_memory_history.

    Recording with enabled="all" keeps every alloc/free event with its (Python) stack trace, which is
    what the snapshot pickle that PyTorch's memory_viz (pytorch.org/memory_viz) reads is built from.
    """
    kwargs: dict[str, Any] = {"enabled": enabled}
    if enabled is not None:
        kwargs["stacks"] = STACKS
    if max_entries is not None:
        kwargs["max_entries"] = max_entries
    _resolve(backend)._record_memory_history(**kwargs)


def start_history(max_entries: int, backend: Any = None) -> None:
    """Start recording allocator events (a ring buffer of max_entries) for the snapshot pickle
    that PyTorch's memory_viz (pytorch.org/memory_viz) reads."""
    if max_entries <= 0:
        raise ValueError("max_entries must be > 0")
    _record_history("all", max_entries, backend)


def stop_history(backend: Any = None) -> None:
    """Stop recording allocator events. Call dump_snapshot first: the recorded history is what
    the pickle format PyTorch's memory_viz (pytorch.org/memory_viz) reads is built from."""
    _record_history(None, None, backend)


def dump_snapshot(path: str | os.PathLike[str], backend: Any = None) -> str:
    """Write the allocator snapshot to path via torch.cuda.memory._dump_snapshot.

    The file is the pickle format PyTorch's memory_viz (pytorch.org/memory_viz) reads; drag it
    onto that page. Returns the path written, as a string.
    """
    target = os.fspath(path)
    parent = os.path.dirname(target)
    if parent:
        os.makedirs(parent, exist_ok=True)
    _resolve(backend)._dump_snapshot(target)
    return target
