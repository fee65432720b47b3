"""Loss modules: cross-entropy, and the fused LM-head + cross-entropy."""
from __future__ import annotations

from typing import Optional

import torch

from ..ops.cross_entropy import _check_chunk_size, _check_options, cross_entropy, linear_cross_entropy


class CrossEntropyLoss(torch.nn.Module):
    """``torch.nn.CrossEntropyLoss`` (class-index targets) on warpforge's kernel, with ``z_loss``
    and ``softcap``; see :func:`warpforge.cross_entropy`."""

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: Optional[float] = None) -> None:
        super().__init__()
        _check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)   # now, not at the first forward
        self.register_buffer("weight", weight)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss, self.softcap = label_smoothing, z_loss, softcap

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(input, target, self.weight, self.ignore_index, self.reduction, self.label_smoothing,
                             self.z_loss, self.softcap)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}, "
                f"z_loss={self.z_loss}, softcap={self.softcap}")


class LinearCrossEntropyLoss(torch.nn.Module):
    """The loss of an LM head without its logits: ``forward(hidden, weight, target, bias=None)`` is
    ``cross_entropy(hidden @ weight.T + bias, target)``, computed in chunks of tokens (see
    :func:`warpforge.linear_cross_entropy`). ``ce_weight`` is the per-class weight."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean", label_smoothing: float = 0.0,
                 z_loss: float = 0.0, softcap: Optional[float] = None, ce_weight: Optional[torch.Tensor] = None,
                 chunk_size: Optional[int] = None) -> None:
        super().__init__()
        _check_options(ignore_index, reduction, label_smoothing, z_loss, softcap)   # now, not at the first forward
        _check_chunk_size(chunk_size)
        self.register_buffer("ce_weight", ce_weight)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.z_loss, self.softcap, self.chunk_size = label_smoothing, z_loss, softcap, chunk_size

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, target, bias, self.ignore_index, self.reduction,
                                    self.label_smoothing, self.z_loss, self.softcap, ce_weight=self.ce_weight,
                                    chunk_size=self.chunk_size)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, label_smoothing={self.label_smoothing}, "
                f"z_loss={self.z_loss}, softcap={self.softcap}, chunk_size={self.chunk_size}")
