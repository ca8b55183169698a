"""The one place membench subclasses torch's private dispatch-mode class, and a fast walk over an op's outputs.

Every op a mode sees pays a Python round trip; these two keep membench's share of it small:
- torch >= 2.10 wraps each subclass's `__torch_dispatch__` in `torch._disable_dynamo`, which swaps Dynamo's
  frame callback out and back in on every op (about 5 us an op here, a quarter of the whole round trip).
  That only matters when a compiled function runs under the mode; membench compiles nothing under its
  modes, so its modes opt out through the class hook torch reads for that (`_should_skip_dynamo`).
- `op_tensors` finds the tensors of an op's output without pytree's generic walk for the shapes ops return
  (a tensor, a tuple or list of tensors, one level of nesting): 0.3 us instead of 2-4 us.
"""
from __future__ import annotations

from typing import List

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_iter

__all__ = ["DispatchMode", "TorchDispatchMode", "op_tensors"]

_SEQUENCES = (tuple, list)
_LEAVES = (bool, int, float, str, torch.ScriptObject, torch.dtype, torch.device)  # nothing to walk into


class DispatchMode(TorchDispatchMode):
    """torch's TorchDispatchMode without the per-op Dynamo-disable wrapper (see the module's docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def op_tensors(out) -> List[torch.Tensor]:
    """The tensors among an op's outputs, in pytree's order (any other container goes through pytree)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if type(out) in _SEQUENCES:
        tensors = []
        for value in out:
            if isinstance(value, torch.Tensor):
                tensors.append(value)
            elif value is not None and not isinstance(value, _LEAVES):
                tensors.extend(op_tensors(value))
        return tensors
    if out is None or isinstance(out, _LEAVES):
        return []
    return [value for value in tree_iter(out) if isinstance(value, torch.Tensor)]
