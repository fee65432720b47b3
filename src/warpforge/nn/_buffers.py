"""Buffers that keep their dtype when the module is cast."""
from __future__ import annotations

from torch import nn


def apply_keeping_dtype(module: nn.Module, fn, recurse: bool, names: tuple[str, ...]) -> nn.Module:
    """``nn.Module._apply`` for a module whose buffers ``names`` keep their dtype and values through
    ``.bfloat16()``, ``.half()`` and ``.to(dtype)``: they follow the device only."""
    kept = {n: module._buffers.get(n) for n in names}
    nn.Module._apply(module, fn, recurse)
    for n, old in kept.items():
        moved = module._buffers.get(n)
        if old is not None and moved is not None and moved.dtype != old.dtype:
            module._buffers[n] = old.to(moved.device)
    return module
