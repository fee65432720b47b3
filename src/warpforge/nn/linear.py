"""``nn.Linear`` on warpforge's matmul kernels, with the bias, activation and residual fused into
the GEMM's epilogue."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.matmul import ACTIVATIONS, linear


class Linear(nn.Linear):
    """A drop-in ``torch.nn.Linear`` (same parameters, same state dict) whose forward is one
    warpforge kernel: ``act(x @ W^T + b) + residual``.

    ``activation``: None, "relu", "silu", "gelu" or "gelu_tanh", applied in the epilogue.
    ``forward(x, residual=None)`` adds ``residual`` (shaped like the output) after the activation.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None) -> None:
        if not (activation is None or isinstance(activation, str)) or activation not in ACTIVATIONS:
            raise ValueError(f"warpforge: 'activation' is {activation!r}; expected one of "
                             f"{', '.join(repr(a) for a in ACTIVATIONS)}")
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.activation = activation

    def forward(self, input: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return linear(input, self.weight, self.bias, self.activation, residual)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")
